package memfile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// chunk is the unit of scanning and the largest pwrite: cancellation is noticed within
// a few ms.
const chunk = 4 << 20

// span is a run of pages at off (bytes, relative to the pages written) that are all
// zero or all non-zero.
type span struct {
	off, size int64
	zero      bool
}

// scan splits pages[off:end] into spans.
func scan(pages []byte, off, end int64, zero []byte) []span {
	var out []span
	for p := off; p < end; p += pageSize {
		z := bytes.Equal(pages[p:p+pageSize], zero)
		if n := len(out); n > 0 && out[n-1].zero == z {
			out[n-1].size += pageSize
			continue
		}
		out = append(out, span{off: p, size: pageSize, zero: z})
	}
	return out
}

// writePages writes pages (a multiple of the page size) at dst: runs of non-zero pages
// with one pwrite each, all-zero pages left as holes or, with punch, punched (so the
// bytes already under them do not show through). It returns the bytes written.
func writePages(ctx context.Context, fd int, pages []byte, dst int64, punch bool) (int64, error) {
	zero := make([]byte, pageSize)
	total := int64(len(pages)) / pageSize * pageSize
	var written int64
	for off := int64(0); off < total; off += chunk {
		if err := ctx.Err(); err != nil {
			return written, err
		}
		end := min(off+chunk, total)
		// One call maps the chunk of a shared source mapping; the scan would fault it
		// in 64 kB at a time. Older kernels say EINVAL: the scan faults then.
		_ = unix.Madvise(pages[off:end], unix.MADV_POPULATE_READ)
		for _, s := range scan(pages, off, end, zero) {
			if s.zero {
				if punch {
					if err := punchHole(fd, dst+s.off, s.size); err != nil {
						return written, err
					}
				}
				continue
			}
			if err := pwriteAll(fd, pages[s.off:s.off+s.size], dst+s.off); err != nil {
				return written, err
			}
			written += s.size
		}
	}
	return written, nil
}

func pwriteAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("pwrite at %d: %w", off, err)
		}
		if n == 0 {
			return fmt.Errorf("pwrite at %d: %w", off, unix.EIO)
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

func punchHole(fd int, off, size int64) error {
	if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, size); err != nil {
		return fmt.Errorf("punch hole at %d+%d: %w", off, size, err)
	}
	return nil
}

// copyDense copies n bytes of src from off to dst at dstOff, skipping all-zero pages (the
// destination is fresh and sparse). Used for the original bytes of libraries, which
// live on other file systems than tmpfs (copy_file_range would fail with EXDEV).
func copyDense(dst, src int, off, n, dstOff int64) (int64, error) {
	buf := make([]byte, min(n+pageSize, 1<<20))
	buf = buf[:len(buf)/int(pageSize)*int(pageSize)]
	var written int64
	for done := int64(0); done < n; {
		want := min(int64(len(buf)), n-done)
		got, err := preadFull(src, buf[:want], off+done)
		if err != nil {
			return written, err
		}
		if got == 0 {
			break
		}
		// A short tail page is zero-padded: the file mapping shows zeros past EOF too.
		full := (int64(got) + pageSize - 1) / pageSize * pageSize
		clear(buf[got:full])
		w, err := writePages(context.Background(), dst, buf[:full], dstOff+done, false)
		written += w
		if err != nil {
			return written, err
		}
		done += int64(got)
		if int64(got) < want {
			break
		}
	}
	return written, nil
}

func preadFull(fd int, b []byte, off int64) (int, error) {
	got := 0
	for got < len(b) {
		n, err := unix.Pread(fd, b[got:], off+int64(got))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return got, fmt.Errorf("pread at %d: %w", off+int64(got), err)
		}
		if n == 0 {
			break
		}
		got += n
	}
	return got, nil
}

// DataExtents calls fn for each data extent [data, hole) of fd inside [off, end), in
// order, found with SEEK_DATA/SEEK_HOLE: the holes of a sparse memory file are skipped. It
// stops at fn's first error.
func DataExtents(fd int, off, end int64, fn func(data, hole int64) error) error {
	for pos := off; pos < end; {
		data, err := unix.Seek(fd, pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // no data after pos
		}
		if err != nil {
			return fmt.Errorf("seek data at %d: %w", pos, err)
		}
		if data >= end {
			return nil
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole at %d: %w", data, err)
		}
		hole = min(hole, end)
		if err := fn(data, hole); err != nil {
			return err
		}
		pos = hole
	}
	return nil
}

// copyExtents copies the data extents of src in [off, off+n) to dst at [dstOff, dstOff+n),
// so holes stay holes. It returns the bytes copied.
func copyExtents(dst, src int, off, n, dstOff int64) (int64, error) {
	var copied int64
	err := DataExtents(src, off, off+n, func(data, hole int64) error {
		if err := copyRange(dst, src, data, dstOff+data-off, hole-data); err != nil {
			return err
		}
		copied += hole - data
		return nil
	})
	return copied, err
}

// copyRange copies n bytes with copy_file_range (one in-kernel copy; works within one
// tmpfs or one file system) and falls back to pread/pwrite across file systems.
func copyRange(dst, src int, srcOff, dstOff, n int64) error {
	for n > 0 {
		r, w := srcOff, dstOff
		c, err := unix.CopyFileRange(src, &r, dst, &w, int(min(n, 1<<30)), 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || c == 0 {
			if err == nil || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) ||
				errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
				return copyRead(dst, src, srcOff, dstOff, n)
			}
			return fmt.Errorf("copy_file_range at %d: %w", srcOff, err)
		}
		srcOff, dstOff, n = srcOff+int64(c), dstOff+int64(c), n-int64(c)
	}
	return nil
}

func copyRead(dst, src int, srcOff, dstOff, n int64) error {
	buf := make([]byte, min(n, 1<<20))
	for n > 0 {
		got, err := preadFull(src, buf[:min(int64(len(buf)), n)], srcOff)
		if err != nil {
			return err
		}
		if got == 0 {
			return fmt.Errorf("copy at %d: %w", srcOff, unix.EIO)
		}
		if err := pwriteAll(dst, buf[:got], dstOff); err != nil {
			return err
		}
		srcOff, dstOff, n = srcOff+int64(got), dstOff+int64(got), n-int64(got)
	}
	return nil
}

// dataPages counts the pages of f's data extents inside [off, off+n).
func dataPages(f interface{ Fd() uintptr }, off, n int64) (int64, error) {
	var bytes int64
	if err := DataExtents(int(f.Fd()), off, off+n, func(data, hole int64) error { bytes += hole - data; return nil }); err != nil {
		return 0, err
	}
	return (bytes + pageSize - 1) / pageSize, nil
}

// imagePages reads a pages image through one reused buffer (fillOne).
type imagePages struct {
	f   *os.File
	buf []byte
}

func openImagePages(dir string, id uint32) (*imagePages, error) {
	name := pagesImage(id)
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open image %s: %w", name, err)
	}
	return &imagePages{f: f, buf: make([]byte, 1<<20)}, nil
}

func (p *imagePages) close() { _ = p.f.Close() }

// write copies n bytes of the image from srcOff into fd at dst as writePages does.
func (p *imagePages) write(ctx context.Context, fd int, srcOff, n, dst int64, punch bool) (int64, error) {
	var written int64
	for done := int64(0); done < n; {
		want := min(int64(len(p.buf)), n-done)
		got, err := preadFull(int(p.f.Fd()), p.buf[:want], srcOff+done)
		if err != nil {
			return written, err
		}
		if int64(got) < want {
			return written, fmt.Errorf("pages image %s ends at %d", filepath.Base(p.f.Name()), srcOff+done+int64(got))
		}
		w, err := writePages(ctx, fd, p.buf[:want], dst+done, punch)
		written += w
		if err != nil {
			return written, err
		}
		done += want
	}
	return written, nil
}

// pagesImage names the checkpoint file that holds the pages a pagemap head's pages_id names.
func pagesImage(id uint32) string { return fmt.Sprintf("pages-%d.img", id) }
