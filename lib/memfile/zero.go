package memfile

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// PunchZeroPages punches every all-zero page out of the memory file at path and returns
// the bytes freed: what a rewrite from pages images leaves as holes, and one into placed
// pages (Options.Placed) cannot see without reading them. A hole reads as zeros, so the
// file's content does not change: it may run while processes map the file (a page one
// of them copied on write is its own and stays).
func PunchZeroPages(ctx context.Context, path string) (int64, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("punch zero pages: %w", err)
	}
	defer f.Close()
	fd := int(f.Fd())
	buf := make([]byte, chunk)
	var freed int64
	for pos := int64(0); ; {
		data, err := unix.Seek(fd, pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return freed, nil
		}
		if err != nil {
			return freed, fmt.Errorf("punch zero pages of %s: seek data at %d: %w", path, pos, err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return freed, fmt.Errorf("punch zero pages of %s: seek hole at %d: %w", path, data, err)
		}
		for off := data / pageSize * pageSize; off < hole; off += chunk {
			if err := ctx.Err(); err != nil {
				return freed, err
			}
			n, err := preadFull(fd, buf[:min(chunk, (hole-off+pageSize-1)/pageSize*pageSize)], off)
			if err != nil {
				return freed, fmt.Errorf("punch zero pages of %s: %w", path, err)
			}
			n = n / int(pageSize) * int(pageSize)
			for _, s := range scan(buf[:n], 0, int64(n), zeroPage) {
				if !s.zero {
					continue
				}
				if err := punchHole(fd, off+s.off, s.size); err != nil {
					return freed, fmt.Errorf("punch zero pages of %s: %w", path, err)
				}
				freed += s.size
			}
			if n == 0 {
				break
			}
		}
		pos = hole
	}
}
