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
// pages (Options.Placed) cannot see without reading them, outside the 2 MiB stretches
// dense with other data (see below). A hole reads as zeros, so the
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
	var zeros, full []PreallocRun
	for pos := int64(0); ; {
		data, err := unix.Seek(fd, pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
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
				r := PreallocRun{uint64(off + s.off), uint64(off + s.off + s.size)}
				if s.zero {
					zeros = append(zeros, r)
				} else {
					full = append(full, r)
				}
			}
			if n == 0 {
				break
			}
		}
		pos = hole
	}
	// Zero pages inside a stretch that is dense with other data stay: it is a huge page
	// where the kernel has them (Preallocate, Options.HugePages), and a punch would split
	// it (keepDense).
	dense := map[uint64]bool{}
	for _, b := range denseStretches(mergeRuns(full)) {
		dense[uint64(b)] = true
	}
	for _, z := range zeros {
		for at := z.Start; at < z.End; {
			b := at / hugeAlign * hugeAlign
			end := min(z.End, b+hugeAlign)
			if !dense[b] {
				if err := ctx.Err(); err != nil {
					return freed, err
				}
				if err := punchHole(fd, int64(at), int64(end-at)); err != nil {
					return freed, fmt.Errorf("punch zero pages of %s: %w", path, err)
				}
				freed += int64(end - at)
			}
			at = end
		}
	}
	return freed, nil
}
