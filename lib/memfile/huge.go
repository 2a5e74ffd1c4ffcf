package memfile

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Huge pages: a fork maps its memory files MAP_PRIVATE, and every 2 MiB stretch it reads
// through 4 KiB pages costs it a 4 KiB page-table page (~0.45 MB for a working fork of a
// 256 MiB heap). A stretch that is one huge page in the file's page cache is mapped by a
// single PMD instead, at no cost, once the file offset and the address agree modulo 2 MiB
// (vmaInfo.off). MADV_COLLAPSE makes such a page from written small pages whatever the
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
	var todo []int64
	for b := first; b < end; b += hugeAlign {
		if dense(fd, b) {
			todo = append(todo, b-first)
		}
	}
	if len(todo) == 0 {
		return 0
	}
	// One shared mapping of the whole range, at an address that agrees with the file
	// offsets modulo 2 MiB (the reservation is 2 MiB larger to find one).
	size := end - first
	res, err := unix.MmapPtr(-1, 0, nil, uintptr(size+hugeAlign), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return 0
	}
	defer unix.MunmapPtr(res, uintptr(size+hugeAlign))
	aligned := unsafe.Add(res, -uintptr(res)&(hugeAlign-1))
	addr, err := unix.MmapPtr(fd, first, aligned, uintptr(size), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_FIXED)
	if err != nil {
		return 0
	}
	// A collapse mostly waits (for a huge page, for other CPUs' LRU caches): several at
	// once take about half the time of one after the other on 2 cores.
	var made atomic.Int64
	work := make(chan int64)
	var wg sync.WaitGroup
	for w := 0; w < min(collapseWorkers, len(todo)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range work {
				if unix.Madvise(unsafe.Slice((*byte)(unsafe.Add(addr, p)), hugeAlign), unix.MADV_COLLAPSE) == nil {
					made.Add(1)
				}
			}
		}()
	}
	for _, p := range todo {
		work <- p
	}
	close(work)
	wg.Wait()
	return int(made.Load())
}

const collapseWorkers = 8

// dense reports whether the 2 MiB stretch at off holds at least denseFraction data.
func dense(fd int, off int64) bool {
	var data int64
	// A seek error ends the count: what was counted decides.
	_ = DataExtents(fd, off, off+hugeAlign, func(d, h int64) error { data += h - d; return nil })
	return float64(data) >= denseFraction*hugeAlign
}
