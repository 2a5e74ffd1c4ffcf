package fsutil

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// CopyTree copies the directory src to dst (which must not exist) the way `cp -a
// --one-file-system` does, in this process: every file type overlayfs keeps in an upper
// directory (whiteout devices, opaque and redirect xattrs), ownership, modes, timestamps,
// extended attributes, hard links and holes. Symbolic links are copied, never followed;
// what is mounted below src is left out (its mount point is copied empty). It runs while a
// container is frozen (a fork's dump): starting cp cost more than copying a small upper.
func CopyTree(ctx context.Context, src, dst string) error {
	var root unix.Stat_t
	if err := unix.Lstat(src, &root); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if root.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("copy %s: not a directory", src)
	}
	c := &treeCopy{ctx: ctx, dev: root.Dev, links: map[[2]uint64]string{}}
	return c.entry(src, dst, &root)
}

type treeCopy struct {
	ctx   context.Context
	dev   uint64
	links map[[2]uint64]string // (dev, ino) of a multiply linked file -> its first copy
}

func (c *treeCopy) entry(src, dst string, st *unix.Stat_t) error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	mode := st.Mode & unix.S_IFMT
	if mode != unix.S_IFDIR && st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := c.links[key]; ok {
			if err := unix.Link(first, dst); err != nil {
				return fmt.Errorf("copy %s: link: %w", src, err)
			}
			return nil
		}
		c.links[key] = dst
	}
	switch mode {
	case unix.S_IFDIR:
		if err := unix.Mkdir(dst, 0o700); err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
		if st.Dev == c.dev { // --one-file-system: a mount point is copied empty
			names, err := readNames(src)
			if err != nil {
				return fmt.Errorf("copy %s: %w", src, err)
			}
			for _, n := range names {
				var cst unix.Stat_t
				s, d := filepath.Join(src, n), filepath.Join(dst, n)
				if err := unix.Lstat(s, &cst); err != nil {
					return fmt.Errorf("copy %s: %w", s, err)
				}
				if err := c.entry(s, d, &cst); err != nil {
					return err
				}
			}
		}
	case unix.S_IFREG:
		if err := copyFile(c.ctx, src, dst, st); err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
		if err := unix.Symlink(target, dst); err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
		// Whiteouts are 0:0 character devices.
		if err := unix.Mknod(dst, st.Mode&unix.S_IFMT|0o600, int(st.Rdev)); err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
	default:
		return fmt.Errorf("copy %s: unknown file type %o", src, mode)
	}
	return copyAttrs(src, dst, st)
}

// copyAttrs gives dst src's owner, extended attributes, mode and times, in the order
// that keeps each: chown clears set-id bits and file capabilities, so it goes first.
func copyAttrs(src, dst string, st *unix.Stat_t) error {
	link := st.Mode&unix.S_IFMT == unix.S_IFLNK
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("copy %s: chown: %w", src, err)
	}
	if err := copyXattrs(src, dst); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if !link {
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return fmt.Errorf("copy %s: chmod: %w", src, err)
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("copy %s: times: %w", src, err)
	}
	return nil
}

func copyXattrs(src, dst string) error {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(src, buf)
	if errors.Is(err, unix.ERANGE) {
		if n, err = unix.Llistxattr(src, nil); err == nil {
			buf = make([]byte, n)
			n, err = unix.Llistxattr(src, buf)
		}
	}
	if errors.Is(err, unix.ENOTSUP) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list xattrs: %w", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		sz, err := unix.Lgetxattr(src, name, nil)
		if err != nil {
			return fmt.Errorf("xattr %s: %w", name, err)
		}
		val := make([]byte, sz)
		if sz, err = unix.Lgetxattr(src, name, val); err != nil {
			return fmt.Errorf("xattr %s: %w", name, err)
		}
		if err := unix.Lsetxattr(dst, name, val[:sz], 0); err != nil {
			return fmt.Errorf("xattr %s: %w", name, err)
		}
	}
	return nil
}

// copyFile copies a regular file's data, holes left as holes.
func copyFile(ctx context.Context, src, dst string, st *unix.Stat_t) error {
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	size := st.Size
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // a hole up to the end
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if err := copyRange(ctx, in, out, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	if err := out.Truncate(size); err != nil {
		return err
	}
	return out.Close()
}

// copyRange copies n bytes at off from in to the same offset of out.
func copyRange(ctx context.Context, in, out *os.File, off, n int64) error {
	for n > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		roff, woff := off, off
		w, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(min(n, 64<<20)), 0)
		if err != nil {
			// Not supported between these files: copy through memory.
			if _, err := out.Seek(off, io.SeekStart); err != nil {
				return err
			}
			_, err = io.Copy(out, io.NewSectionReader(in, off, n))
			return err
		}
		if w == 0 {
			return io.ErrUnexpectedEOF // the file shrank under us
		}
		off, n = off+int64(w), n-int64(w)
	}
	return nil
}

func readNames(dir string) ([]string, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}
