package image

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/fsutil"
)

// defaultPath is the PATH of images that carry no config of their own.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ImportDir registers an already-built root file system directory as a one-layer image
// called name. The directory is moved into the store (renamed, or copied and then
// removed when it is on another file system), so dir no longer exists afterwards.
func (s *Store) ImportDir(dir, ref string) (*Image, error) {
	n, err := localName(ref)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", dir, err)
	}
	ctx := context.Background()
	lk, err := s.lockName(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", dir, err)
	}
	defer lk.unlock()
	sl, err := s.lockStore(ctx, unix.LOCK_SH)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", dir, err)
	}
	defer sl.unlock()
	img, err := s.importDirLocked(dir, n)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", dir, err)
	}
	return img, nil
}

// localName checks a name given to a locally built image. It must be a valid
// reference (so it can never be mistaken for a file path) and is stored as spelled.
func localName(ref string) (string, error) {
	if a, ok := aliases[ref]; ok {
		return a, nil
	}
	if _, err := name.ParseReference(ref); err != nil {
		return "", fmt.Errorf("bad image name %q: %w", ref, err)
	}
	return ref, nil
}

// importDirLocked moves dir to a new layer and writes the record. The caller holds the
// name lock and the store lock (shared).
func (s *Store) importDirLocked(dir, n string) (*Image, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	st, err := os.Lstat(abs)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", abs)
	}
	if m := fsutil.MountsUnder(abs); len(m) > 0 {
		return nil, fmt.Errorf("%s has mounts inside (%s); unmount them first", abs, strings.Join(m, ", "))
	}
	var rnd [32]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	id := hex.EncodeToString(rnd[:])
	dst := filepath.Join(s.layersDir(), id)

	err = os.Rename(abs, dst)
	if errors.Is(err, unix.EXDEV) {
		err = s.copyDir(abs, dst)
		if err == nil {
			err = fsutil.RemoveAll(abs)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("move %s into the store: %w", abs, err)
	}
	size, err := treeSize(dst)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(id + "\n"))
	// A bare root file system has no configured command: `lazyfork create` then asks for
	// one instead of starting a shell that exits at once on /dev/null.
	img := &Image{
		Name:       n,
		Digest:     "sha256:" + hex.EncodeToString(sum[:]),
		Layers:     []string{dst},
		Env:        []string{defaultPath},
		WorkingDir: "/",
		Source:     SourceDirectory,
		Size:       size,
	}
	if err := s.writeRef(img); err != nil {
		return nil, err
	}
	return img, nil
}

// copyDir copies src to dst (on another file system) by streaming it as a tar through
// the layer unpacker, which keeps owners, modes, hardlinks, devices and xattrs.
func (s *Store) copyDir(src, dst string) error {
	t, err := s.newTemp()
	if err != nil {
		return err
	}
	defer t.discard()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTree(src, pw)) }()
	// The administrator's own directory: its device nodes are kept, as a rename would.
	_, err = unpackLayer(pr, t.path, unpackOptions{KeepDevices: true})
	pr.CloseWithError(errors.New("unpack stopped")) // unblocks the writer on error
	if err != nil {
		return err
	}
	return t.commit(dst)
}

// writeTree writes the tree at root as a tar stream.
func writeTree(root string, w io.Writer) error {
	tw := tar.NewWriter(w)
	links := map[[2]uint64]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSocket != 0 {
			return nil // a leftover socket is useless in an image, and tar cannot hold it
		}
		target := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
		hdr.Mode = int64(st.Mode & 0o7777)
		if fi.Mode().IsRegular() && st.Nlink > 1 {
			k := [2]uint64{st.Dev, st.Ino}
			if first, ok := links[k]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				links[k] = hdr.Name
			}
		}
		if x, err := xattrs(p); err != nil {
			return err
		} else if len(x) > 0 {
			hdr.PAXRecords = x
			hdr.Format = tar.FormatPAX
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// xattrs reads p's extended attributes as tar PAX records.
func xattrs(p string) (map[string]string, error) {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, err
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, k := range strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00") {
		if k == "" {
			continue
		}
		vs, err := unix.Lgetxattr(p, k, nil)
		if err != nil {
			continue // vanished, or not readable from this namespace
		}
		v := make([]byte, vs)
		vs, err = unix.Lgetxattr(p, k, v)
		if err != nil {
			continue
		}
		out["SCHILY.xattr."+k] = string(v[:vs])
	}
	return out, nil
}
