package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// unpacker writes one layer tar into a directory as an overlayfs lower dir. Every path
// is resolved with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), so no entry can write
// outside the directory, through ".." or through a symlink it planted earlier. Layers
// are hostile input: whiteouts naming ".", ".." or nothing are refused, device nodes are
// skipped (a container gets its own /dev) and the bytes written are bounded.
type unpacker struct {
	rootPath string
	root     int // O_DIRECTORY fd of rootPath
	buf      []byte
	size     int64
	opts     unpackOptions
	skipped  []string  // device nodes left out
	dirTimes []dirTime // set last: adding children changes a dir's mtime

	cacheRel string // last parent dir opened, which tar order makes likely again
	cacheFd  int
}

type dirTime struct {
	rel          string
	atime, mtime time.Time
}

// unpackOptions tune unpackLayer.
type unpackOptions struct {
	// Budget is how many bytes the layer may add (file data plus entryCost per entry);
	// <= 0 means no bound. Going over stops the unpack with an *SizeLimitError.
	Budget int64
	// Limit and LimitSource describe the bound for the error message.
	Limit       int64
	LimitSource string
	// KeepDevices keeps character and block device nodes (a local directory the
	// administrator imports); image layers never keep them.
	KeepDevices bool
}

// unpackResult is what unpackLayer did.
type unpackResult struct {
	Size    int64    // bytes of regular file data written
	Charged int64    // bytes charged against the budget (Size plus entryCost per entry)
	Skipped []string // device nodes left out, as layer paths
}

// entryCost is charged per tar entry on top of file data, so a layer of millions of
// empty files or directories counts against the size limit too (it is a tar header).
const entryCost = 512

// unpackLayer extracts the tar stream r into dir (which exists and is empty).
func unpackLayer(r io.Reader, dir string, opts unpackOptions) (unpackResult, error) {
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return unpackResult{}, fmt.Errorf("open %s: %w", dir, err)
	}
	u := &unpacker{rootPath: dir, root: root, buf: make([]byte, 1<<20), cacheFd: -1, opts: opts}
	defer u.close()
	tr := tar.NewReader(r)
	var entries int64
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return unpackResult{}, fmt.Errorf("read layer tar: %w", err)
		}
		entries++
		if err := u.charge(0, entries); err != nil {
			return unpackResult{}, err
		}
		if err := u.entry(tr, hdr, entries); err != nil {
			var sl *SizeLimitError
			if errors.As(err, &sl) {
				return unpackResult{}, err // one line, about the limit, not the entry
			}
			return unpackResult{}, fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
	}
	for i := len(u.dirTimes) - 1; i >= 0; i-- {
		d := u.dirTimes[i]
		if err := u.setTimes(d.rel, d.atime, d.mtime); err != nil {
			return unpackResult{}, fmt.Errorf("set times of %q: %w", d.rel, err)
		}
	}
	return unpackResult{Size: u.size, Charged: u.size + entries*entryCost, Skipped: u.skipped}, nil
}

// charge fails once size bytes of data more plus entries entries would exceed the budget.
func (u *unpacker) charge(size, entries int64) error {
	if u.opts.Budget <= 0 {
		return nil
	}
	if u.size+size+entries*entryCost > u.opts.Budget {
		return &SizeLimitError{Limit: u.opts.Limit, Source: u.opts.LimitSource}
	}
	return nil
}

func (u *unpacker) close() {
	u.dropCache()
	unix.Close(u.root)
}

func (u *unpacker) dropCache() {
	if u.cacheFd >= 0 {
		unix.Close(u.cacheFd)
	}
	u.cacheFd, u.cacheRel = -1, ""
}

// cleanRel turns a tar name into a path relative to the layer root ("" is the root).
// ".." anywhere is refused rather than clamped: no honest tarball contains it.
func cleanRel(n string) (string, error) {
	for _, c := range strings.Split(n, "/") {
		if c == ".." {
			return "", refusef("path contains \"..\"")
		}
	}
	return strings.TrimPrefix(path.Clean("/"+n), "/"), nil
}

var beneath = unix.OpenHow{
	Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
	Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
}

// openDir opens the directory rel below the root, creating missing ones (0755, like
// tar does for parents a layer does not list). The fd is owned by the caller.
func (u *unpacker) openDir(rel string, create bool) (int, error) {
	if rel == "" {
		return unix.Dup(u.root)
	}
	for {
		fd, err := unix.Openat2(u.root, rel, &beneath)
		if err == nil {
			return fd, nil
		}
		switch {
		case errors.Is(err, unix.ENOENT) && create:
			pfd, err := u.openDir(path.Dir(strings.TrimSuffix("/"+rel, "/"))[1:], true)
			if err != nil {
				return -1, err
			}
			err = unix.Mkdirat(pfd, path.Base(rel), 0o755)
			unix.Close(pfd)
			if err != nil && !errors.Is(err, unix.EEXIST) {
				return -1, fmt.Errorf("mkdir %s: %w", rel, err)
			}
			create = false // retry the open once
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
			return -1, refusef("%s goes through a symlink or out of the layer", rel)
		default:
			return -1, fmt.Errorf("open dir %s: %w", rel, err)
		}
	}
}

// parent returns a (cached, not to be closed) fd of rel's parent dir and rel's base name.
func (u *unpacker) parent(rel string) (int, string, error) {
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if u.cacheFd >= 0 && u.cacheRel == dir {
		return u.cacheFd, base, nil
	}
	fd, err := u.openDir(dir, true)
	if err != nil {
		return -1, "", err
	}
	u.dropCache()
	u.cacheFd, u.cacheRel = fd, dir
	return fd, base, nil
}

// clear removes whatever is at base in pfd, so a later tar entry replaces an earlier one.
func (u *unpacker) clear(pfd int, rel, base string) error {
	err := unix.Unlinkat(pfd, base, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if errors.Is(err, unix.EISDIR) {
		if rel == "" || base == "." || base == ".." || !filepath.IsLocal(rel) {
			return refusef("refuse to remove %q: not an entry below the layer root", rel)
		}
		u.dropCache() // the cached dir may be the one going away
		// Path-based removal is safe: rel's parents were just opened without symlinks
		// and nothing else writes into a temp layer dir.
		if err := os.RemoveAll(path.Join(u.rootPath, rel)); err != nil {
			return err
		}
		return nil
	}
	return fmt.Errorf("replace %s: %w", rel, err)
}

func (u *unpacker) entry(tr *tar.Reader, hdr *tar.Header, entries int64) error {
	rel, err := cleanRel(hdr.Name)
	if err != nil {
		return err
	}
	perm := uint32(hdr.Mode) & 0o7777
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = hdr.ModTime
	}

	if rel == "" {
		if hdr.Typeflag != tar.TypeDir {
			return errors.New("layer root is not a directory")
		}
		if err := u.setMeta(u.root, hdr, perm); err != nil {
			return err
		}
		u.dirTimes = append(u.dirTimes, dirTime{rel, atime, hdr.ModTime})
		return nil
	}
	base := path.Base(rel)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(rel, base)
	}

	switch hdr.Typeflag {
	case tar.TypeDir:
		pfd, base, err := u.parent(rel)
		if err != nil {
			return err
		}
		err = unix.Mkdirat(pfd, base, 0o755)
		if errors.Is(err, unix.EEXIST) {
			var st unix.Stat_t
			if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				if err := u.clear(pfd, rel, base); err != nil {
					return err
				}
				if pfd, base, err = u.parent(rel); err != nil {
					return err
				}
				err = unix.Mkdirat(pfd, base, 0o755)
			} else {
				err = nil
			}
		}
		if err != nil {
			return fmt.Errorf("mkdir: %w", err)
		}
		fd, err := u.openDir(rel, false)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := u.setMeta(fd, hdr, perm); err != nil {
			return err
		}
		u.dirTimes = append(u.dirTimes, dirTime{rel, atime, hdr.ModTime})
		return nil

	case tar.TypeReg, tar.TypeGNUSparse:
		pfd, base, err := u.replace(rel)
		if err != nil {
			return err
		}
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
		f := os.NewFile(uintptr(fd), rel)
		defer f.Close()
		// The header's size is the file's (sparse files: its logical size), so a bomb
		// is refused before a byte of it is written.
		if err := u.charge(hdr.Size, entries); err != nil {
			return err
		}
		n, err := io.CopyBuffer(struct{ io.Writer }{f}, io.LimitReader(tr, hdr.Size), u.buf)
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		u.size += n
		if err := u.setMeta(fd, hdr, perm); err != nil {
			return err
		}
		return u.setTimesAt(pfd, base, atime, hdr.ModTime)

	case tar.TypeSymlink:
		pfd, base, err := u.replace(rel)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("symlink: %w", err)
		}
		if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
		return u.setTimesAt(pfd, base, atime, hdr.ModTime)

	case tar.TypeLink:
		target, err := cleanRel(hdr.Linkname)
		if err != nil || target == "" {
			return refusef("bad hardlink target %q", hdr.Linkname)
		}
		if slices.Contains(u.skipped, target) {
			u.skipped = append(u.skipped, rel) // a link to a device node left out
			return nil
		}
		pfd, base, err := u.replace(rel)
		if err != nil {
			return err
		}
		tdir, tbase := path.Split(target)
		tfd, err := u.openDir(strings.TrimSuffix(tdir, "/"), false)
		if err != nil {
			return refusef("hardlink target %q is not inside this layer: %v", hdr.Linkname, err)
		}
		defer unix.Close(tfd)
		if tbase == "" || tbase == "." || tbase == ".." {
			return refusef("bad hardlink target %q", hdr.Linkname)
		}
		if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return refusef("hardlink target %q is not an earlier entry of this layer", hdr.Linkname)
			}
			return fmt.Errorf("hardlink to %q: %w", hdr.Linkname, err)
		}
		return nil

	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if hdr.Typeflag != tar.TypeFifo && !u.opts.KeepDevices {
			// A device node in an image is a way to the host's hardware (a disk, kmem)
			// for anyone who may open it; a container gets its own /dev.
			u.skipped = append(u.skipped, rel)
			return nil
		}
		pfd, base, err := u.replace(rel)
		if err != nil {
			return err
		}
		mode := perm
		switch hdr.Typeflag {
		case tar.TypeChar:
			mode |= unix.S_IFCHR
		case tar.TypeBlock:
			mode |= unix.S_IFBLK
		default:
			mode |= unix.S_IFIFO
		}
		dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
		if err := unix.Mknodat(pfd, base, mode, int(dev)); err != nil {
			return fmt.Errorf("mknod: %w", err)
		}
		if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
		// mknod applied the umask, and chown may have cleared set-id bits.
		if err := unix.Fchmodat(pfd, base, perm, 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
		return u.setTimesAt(pfd, base, atime, hdr.ModTime)

	case tar.TypeXGlobalHeader:
		return nil
	default:
		return fmt.Errorf("unsupported tar entry type %q", hdr.Typeflag)
	}
}

// replace opens rel's parent and removes any earlier entry named rel.
func (u *unpacker) replace(rel string) (int, string, error) {
	pfd, base, err := u.parent(rel)
	if err != nil {
		return -1, "", err
	}
	if err := u.clear(pfd, rel, base); err != nil {
		return -1, "", err
	}
	if u.cacheFd < 0 { // clear dropped the cache
		return u.parent(rel)
	}
	return pfd, base, nil
}

// whiteout translates OCI whiteouts to overlayfs ones: ".wh.NAME" becomes a 0:0
// character device NAME, ".wh..wh..opq" the opaque xattr on its directory.
func (u *unpacker) whiteout(rel, base string) error {
	dir := strings.TrimSuffix(strings.TrimSuffix(rel, base), "/")
	if base == whiteoutOpaque {
		fd, err := u.openDir(dir, true)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Fsetxattr(fd, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
			return fmt.Errorf("mark %q opaque: %w", dir, err)
		}
		return nil
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil // other AUFS metadata (.wh..wh.plnk etc.) means nothing to overlayfs
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if name == "" || name == "." || name == ".." {
		// ".wh.." would delete the directory holding it, ".wh..." its parent: at the
		// layer root, the whole layer store.
		return refusef("whiteout %q names %q, not an entry of its directory; the layer is malformed or hostile", base, name)
	}
	target := path.Join(dir, name)
	pfd, tbase, err := u.replace(target)
	if err != nil {
		return err
	}
	if err := unix.Mknodat(pfd, tbase, unix.S_IFCHR, 0); err != nil {
		return fmt.Errorf("whiteout %q: %w", target, err)
	}
	return nil
}

// setMeta sets owner, mode and xattrs through an open fd. chown comes before chmod
// because chown clears set-id bits.
func (u *unpacker) setMeta(fd int, hdr *tar.Header, perm uint32) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmod(fd, perm); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	for k, v := range hdr.PAXRecords {
		x, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		// A layer must not forge overlayfs metadata (redirects, metacopy, opaque).
		if strings.HasPrefix(x, "trusted.overlay.") || strings.HasPrefix(x, "user.overlay.") {
			continue
		}
		if err := unix.Fsetxattr(fd, x, []byte(v), 0); err != nil {
			return fmt.Errorf("set xattr %s: %w", x, err)
		}
	}
	return nil
}

func (u *unpacker) setTimesAt(dfd int, base string, atime, mtime time.Time) error {
	ts := []unix.Timespec{timespec(atime), timespec(mtime)}
	if err := unix.UtimesNanoAt(dfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

func (u *unpacker) setTimes(rel string, atime, mtime time.Time) error {
	if rel == "" {
		return u.setTimesAt(unix.AT_FDCWD, u.rootPath, atime, mtime)
	}
	dir, base := path.Split(rel)
	fd, err := u.openDir(strings.TrimSuffix(dir, "/"), false)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return u.setTimesAt(fd, base, atime, mtime)
}

// timespec converts t, mapping the zero time (tar headers may omit it) to the epoch.
func timespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		return unix.Timespec{}
	}
	return unix.NsecToTimespec(t.UnixNano())
}
