package memfile

import (
	"errors"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Huge pages: a fork maps its memory files MAP_PRIVATE, and every 2 MiB stretch it reads
// through 4 KiB pages costs it a 4 KiB page-table page (~0.45 MB for a working fork of a
// 256 MiB heap). A stretch that is one huge page in the file's page cache is mapped by a
// single PMD instead, at no cost, once the file offset and the address agree modulo 2 MiB
// (memFile.at). MADV_COLLAPSE makes such a page from written small pages whatever the
// tmpfs's huge= setting, so the state tmpfs needs no special mount; the forks' own faults
// on holes still allocate small pages there. Only dense stretches are collapsed: a huge
// page fills its holes with zeros, which would cost RAM for sparse memory.

// denseFraction of a 2 MiB stretch must hold data for it to become a huge page.
const denseFraction = 0.75

// collapseDense makes each 2 MiB-aligned stretch of fd's [off, off+n) that is at least
// denseFraction data one huge page, and returns how many it made. It is an optimisation
// only: where the kernel cannot (no MADV_COLLAPSE, no free huge page) the stretch stays
// in small pages and mapping it costs page tables, nothing else.
func collapseDense(fd int, off, n int64) int {
	first := (off + hugeAlign - 1) / hugeAlign * hugeAlign
	end := (off + n) / hugeAlign * hugeAlign
	made := 0
	for run := first; run < end; {
		if !dense(fd, run) {
			run += hugeAlign
			continue
		}
		runEnd := run + hugeAlign
		for runEnd < end && dense(fd, runEnd) {
			runEnd += hugeAlign
		}
		k, err := collapse(fd, run, runEnd-run)
		made += k
		if errors.Is(err, unix.EINVAL) {
			return made // this kernel has no MADV_COLLAPSE for files
		}
		run = runEnd
	}
	return made
}

// dense reports whether the 2 MiB stretch at off holds at least denseFraction data.
func dense(fd int, off int64) bool {
	var data int64
	for pos, end := off, off+hugeAlign; pos < end; {
		d, err := unix.Seek(fd, pos, unix.SEEK_DATA)
		if err != nil || d >= end {
			break
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			break
		}
		h = min(h, end)
		data += h - d
		pos = h
	}
	return float64(data) >= denseFraction*hugeAlign
}

// collapse maps fd's [off, off+n) (2 MiB-aligned) shared at a 2 MiB-aligned address and
// asks for huge pages there. It returns how many stretches it collapsed.
func collapse(fd int, off, n int64) (int, error) {
	// Reserve n + 2 MiB of address space to find an aligned start inside it.
	res, err := unix.MmapPtr(-1, 0, nil, uintptr(n+hugeAlign), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return 0, err
	}
	defer unix.MunmapPtr(res, uintptr(n+hugeAlign))
	aligned := unsafe.Add(res, -uintptr(res)&(hugeAlign-1))
	addr, err := unix.MmapPtr(fd, off, aligned, uintptr(n), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_FIXED)
	if err != nil {
		return 0, err
	}
	made := 0
	for p := int64(0); p < n; p += hugeAlign {
		b := unsafe.Slice((*byte)(unsafe.Add(addr, p)), hugeAlign)
		if err := unix.Madvise(b, unix.MADV_COLLAPSE); err != nil {
			if errors.Is(err, unix.EINVAL) {
				return made, err
			}
			continue // EAGAIN/ENOMEM: no huge page free now
		}
		made++
	}
	return made, nil
}
