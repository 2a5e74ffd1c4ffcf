package memfile

import (
	"sort"
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

// denseStretches returns the 2 MiB-aligned stretches (their offsets, ascending) that the
// sorted, disjoint ranges rs cover at least denseFraction of.
func denseStretches(rs []PreallocRun) []int64 {
	var out []int64
	cur, covered := int64(-1), int64(0)
	flush := func() {
		if cur >= 0 && float64(covered) >= denseFraction*hugeAlign {
			out = append(out, cur)
		}
	}
	for _, r := range rs {
		for at := int64(r.Start); at < int64(r.End); {
			b := at / hugeAlign * hugeAlign
			end := min(int64(r.End), b+hugeAlign)
			if b != cur {
				flush()
				cur, covered = b, 0
			}
			covered += end - at
			at = end
		}
	}
	flush()
	return out
}

// keepDense widens keep (sorted, disjoint) to the whole of each stretch it covers densely:
// a punch inside such a stretch, a huge page where the kernel has them, would split it
// and bring every fork's page tables back for at most a quarter of 2 MiB. What the
// stretch holds outside keep reads as zeros either way (a huge page is made zeroed).
func keepDense(keep []PreallocRun) []PreallocRun {
	out := append([]PreallocRun(nil), keep...)
	for _, b := range denseStretches(keep) {
		out = append(out, PreallocRun{uint64(b), uint64(b + hugeAlign)})
	}
	return mergeRuns(out)
}

// mergeRuns sorts rs and merges the ranges that overlap or touch.
func mergeRuns(rs []PreallocRun) []PreallocRun {
	sort.Slice(rs, func(i, j int) bool { return rs[i].Start < rs[j].Start })
	out := rs[:0]
	for _, r := range rs {
		if k := len(out); k > 0 && r.Start <= out[k-1].End {
			out[k-1].End = max(out[k-1].End, r.End)
			continue
		}
		out = append(out, r)
	}
	return out
}

// makeHuge makes each of the empty 2 MiB stretches of fd at offs (2 MiB-aligned,
// ascending) one zeroed huge page: one page allocated in each (MADV_COLLAPSE needs a page
// to start from; it fills the holes with zeros), then collapsed. Allocating and zeroing a
// huge page is faster than 512 small ones, and so is writing into it. It returns the
// stretches that became huge pages; the page allocated in the others is freed again.
func makeHuge(fd int, offs []int64) map[int64]bool {
	// Runs of adjacent stretches, at most makeHugeBatch each: one madvise call per run
	// (each call drains every CPU's LRU cache once, waiting for each CPU), and
	// collapseWorkers calls at once (zeroing is most of the time, and one CPU's worth
	// of it leaves the other for the source, which runs meanwhile).
	var runs [][]int64
	for i := 0; i < len(offs); {
		j := i + 1
		for j < len(offs) && j-i < makeHugeBatch && offs[j] == offs[j-1]+hugeAlign {
			j++
		}
		var got []int64
		for _, b := range offs[i:j] {
			if unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, b, pageSize) != nil {
				break
			}
			got = append(got, b)
		}
		if len(got) > 0 {
			runs = append(runs, got)
		}
		i = j
	}
	var mu sync.Mutex
	huge := map[int64]bool{}
	work := make(chan []int64)
	var wg sync.WaitGroup
	for w := 0; w < min(makeHugeWorkers, len(runs)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for run := range work {
				ok := collapseRange(fd, run[0], int64(len(run))*hugeAlign)
				var made []int64
				for _, b := range run {
					// The call stops at the first stretch that fails: the rest one by one.
					if ok || collapseRange(fd, b, hugeAlign) {
						made = append(made, b)
					} else {
						_ = punchHole(fd, b, pageSize)
					}
				}
				mu.Lock()
				for _, b := range made {
					huge[b] = true
				}
				mu.Unlock()
			}
		}()
	}
	for _, r := range runs {
		work <- r
	}
	close(work)
	wg.Wait()
	return huge
}

const (
	makeHugeBatch   = 16 // stretches per MADV_COLLAPSE call: 32 MiB
	makeHugeWorkers = 2
)

// collapseRange collapses fd's [off, off+n) (2 MiB-aligned) into huge pages with one
// MADV_COLLAPSE, and reports whether every stretch became one.
func collapseRange(fd int, off, n int64) bool {
	res, err := unix.MmapPtr(-1, 0, nil, uintptr(n+hugeAlign), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return false
	}
	defer unix.MunmapPtr(res, uintptr(n+hugeAlign))
	aligned := unsafe.Add(res, -uintptr(res)&(hugeAlign-1))
	addr, err := unix.MmapPtr(fd, off, aligned, uintptr(n), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_FIXED)
	if err != nil {
		return false
	}
	return unix.Madvise(unsafe.Slice((*byte)(addr), n), unix.MADV_COLLAPSE) == nil
}

// dense reports whether the 2 MiB stretch at off holds at least denseFraction data.
func dense(fd int, off int64) bool {
	var data int64
	// A seek error ends the count: what was counted decides.
	_ = DataExtents(fd, off, off+hugeAlign, func(d, h int64) error { data += h - d; return nil })
	return float64(data) >= denseFraction*hugeAlign
}
