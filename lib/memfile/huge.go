package memfile

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Huge pages: a fork maps its memory files MAP_PRIVATE, and every 2 MiB stretch it reads
// through 4 KiB pages costs it a 4 KiB page-table page (~0.45 MB for a working fork of a
// 256 MiB heap). A stretch that is one huge page in the file's page cache is mapped by a
// single PMD instead, at no cost, once the file offset and the address agree modulo 2 MiB
// (vmaInfo.off). So each dense stretch of a memory file is allocated as one zeroed huge
// page before its data is written into it (makeHuge; MADV_COLLAPSE makes one whatever
// the tmpfs's huge= setting, so the state tmpfs needs no special mount), by the rewrite
// (hugeMaker, beside the copy) and by a swap's preallocation (Preallocate), and the data
// is copied once, as into small pages. Only dense stretches: a huge page fills its holes
// with zeros, which would cost RAM for sparse memory; the forks' own faults on holes
// still allocate small pages.

// denseFraction of a 2 MiB stretch must hold data for it to become a huge page.
const denseFraction = 0.75

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

// HugePolicy says which dense stretches Preallocate makes huge pages.
type HugePolicy int

const (
	NoHugePages HugePolicy = iota
	// HugePagesWhileFast: huge pages while fresh ones come faster than small pages would
	// (slowHugePage). On a VM whose balloon reports free 2 MiB blocks to the host (free
	// page reporting, these VMs), a huge page allocated from such a block waits on 512
	// host faults, ~10-20 ms: 2.4 s for a 256 MiB heap, against ~0.2 s in small pages,
	// which come from memory the guest still holds. Once one comes that slowly the rest
	// are small pages.
	HugePagesWhileFast
	HugePagesAlways
)

// slowHugePage: a batch that takes longer than this per huge page ends HugePagesWhileFast
// (a fast one takes ~0.2 ms here; small pages for the same 2 MiB ~1.5 ms; a cold one
// 10-20 ms).
var slowHugePage = 2 * time.Millisecond

// makeHuge makes each of the empty 2 MiB stretches of fd at offs (2 MiB-aligned,
// ascending) one zeroed huge page and returns the stretches that became one; the others
// stay empty. With HugePagesWhileFast it reports whether it stopped early because fresh
// huge pages came slowly.
func makeHuge(fd int, offs []int64, policy HugePolicy) (map[int64]bool, bool) {
	if policy == NoHugePages {
		return map[int64]bool{}, false
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var onSlow func()
	if policy == HugePagesWhileFast {
		onSlow = cancel
	}
	h := startHuge(ctx, fd, offs, onSlow)
	made := h.finish()
	return made, h.slow.Load()
}

// hugeMaker makes empty 2 MiB stretches of a file huge pages on makeHugeWorkers
// goroutines, in ascending order, while its caller writes the file (fillOne), stretch by
// stretch: the caller writes a stretch once it is ready (or waits for it), so that it
// writes into the huge page, and allocating them costs the copy only what the
// allocation does not keep ahead.
type hugeMaker struct {
	fd      int
	batches [][]int64       // runs of adjacent stretches, one MADV_COLLAPSE each
	batchOf map[int64]int   // stretch -> its index in batches
	done    []chan struct{} // closed when the batch is finished (made or not)
	mu      sync.Mutex
	made    map[int64]bool
	wg      sync.WaitGroup
	// onSlow, if set, is called once a batch takes longer than slowHugePage per stretch
	// (slow says so); it cancels the batches not yet started.
	onSlow func()
	slow   atomic.Bool
}

// startHuge starts making the stretches at offs (2 MiB-aligned, ascending, empty) huge
// pages of fd; finish must be called before fd is closed. A cancelled ctx leaves the
// batches not yet started as they are. onSlow, if not nil, is called once when a batch
// is slow (hugeMaker.onSlow).
func startHuge(ctx context.Context, fd int, offs []int64, onSlow func()) *hugeMaker {
	h := &hugeMaker{fd: fd, batchOf: map[int64]int{}, made: map[int64]bool{}, onSlow: onSlow}
	maxBatch := makeHugeBatch
	if onSlow != nil {
		// A slow batch is waited for before the rest are given up: short ones waste less.
		maxBatch = slowCheckBatch
	}
	// Runs of adjacent stretches: one madvise call per run (each call drains every CPU's
	// LRU cache once, waiting for each CPU), makeHugeWorkers calls at once (zeroing is
	// most of the time, and one CPU's worth of it leaves the other for the writer, or
	// for the source before a swap's freeze). The first runs are short, so that the
	// writer starts soon; then up to makeHugeBatch.
	size := 1
	for i := 0; i < len(offs); {
		j := i + 1
		for j < len(offs) && j-i < size && offs[j] == offs[j-1]+hugeAlign {
			j++
		}
		for _, b := range offs[i:j] {
			h.batchOf[b] = len(h.batches)
		}
		h.batches = append(h.batches, offs[i:j])
		h.done = append(h.done, make(chan struct{}))
		if len(h.batches)%makeHugeWorkers == 0 {
			size = min(2*size, maxBatch)
		}
		i = j
	}
	work := make(chan int)
	for w := 0; w < min(makeHugeWorkers, len(h.batches)); w++ {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			for i := range work {
				if ctx.Err() == nil {
					t := time.Now()
					h.makeBatch(h.batches[i])
					if h.onSlow != nil && time.Since(t) > slowHugePage*time.Duration(len(h.batches[i])) && !h.slow.Swap(true) {
						h.onSlow()
					}
				}
				close(h.done[i])
			}
		}()
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for i := range h.batches {
			work <- i
		}
		close(work)
	}()
	return h
}

// makeBatch makes one run of adjacent empty stretches huge pages: one page allocated in
// each (MADV_COLLAPSE needs a page to start from; it fills the holes with zeros), then
// one collapse for the run. Allocating and zeroing a huge page is faster than 512 small
// ones, and so is writing into it. The page allocated in a stretch that fails is freed
// again: nothing else writes there before the batch is done (wait).
func (h *hugeMaker) makeBatch(run []int64) {
	var got []int64
	for _, b := range run {
		if unix.Fallocate(h.fd, unix.FALLOC_FL_KEEP_SIZE, b, pageSize) != nil {
			break
		}
		got = append(got, b)
	}
	if len(got) == 0 {
		return
	}
	ok := collapseRange(h.fd, got[0], int64(len(got))*hugeAlign)
	var made []int64
	for _, b := range got {
		// The call stops at the first stretch that fails: the rest one by one.
		if ok || collapseRange(h.fd, b, hugeAlign) {
			made = append(made, b)
		} else {
			_ = punchHole(h.fd, b, pageSize)
		}
	}
	h.mu.Lock()
	for _, b := range made {
		h.made[b] = true
	}
	h.mu.Unlock()
}

// each calls write(k) for each k of ats (the ascending stretches a writer writes), in
// order, each once its stretch is ready. It stops at write's first error.
func (h *hugeMaker) each(ats []int64, write func(k int) error) error {
	for k, at := range ats {
		if h != nil {
			if i, ok := h.batchOf[at]; ok {
				<-h.done[i]
			}
		}
		if err := write(k); err != nil {
			return err
		}
	}
	return nil
}

// finish waits for every batch and returns the stretches made huge pages.
func (h *hugeMaker) finish() map[int64]bool {
	if h == nil {
		return nil
	}
	h.wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.made
}

const (
	makeHugeBatch   = 16 // stretches per MADV_COLLAPSE call at most: 32 MiB
	slowCheckBatch  = 2  // the same when slow huge pages end the making
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
	// One shared mapping at an address that agrees with the file offset modulo 2 MiB (the
	// reservation is 2 MiB larger to find one).
	aligned := unsafe.Add(res, -uintptr(res)&(hugeAlign-1))
	addr, err := unix.MmapPtr(fd, off, aligned, uintptr(n), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_FIXED)
	if err != nil {
		return false
	}
	return unix.Madvise(unsafe.Slice((*byte)(addr), n), unix.MADV_COLLAPSE) == nil
}

// CollapseDense makes each 2 MiB stretch of the memory file at path that holds data
// densely (denseFraction) one huge page, in place: MADV_COLLAPSE copies its small pages
// into a new huge page, so what the file reads does not change, and whoever maps it
// maps the huge page from its next fault. It is the second half of HugePagesWhileFast:
// the stretches a slow preallocation left small become huge pages later, off every
// pause and latency, where the forks made after get them without page tables. wait, if
// not nil, is called before each stretch (the caller holds it while more urgent work
// runs). It stops when ctx is done and returns the stretches made huge pages.
func CollapseDense(ctx context.Context, path string, wait func()) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("collapse %s: %w", filepath.Base(path), err)
	}
	defer unix.Close(fd)
	made := 0
	for _, b := range denseStretches(dataRuns(fd, 0)) {
		if wait != nil {
			wait() // a huge page that waits on the host holds a CPU the guest cannot use
		}
		if ctx.Err() != nil {
			break
		}
		if collapseRange(fd, b, hugeAlign) {
			made++
		}
	}
	return made, nil
}

// dataRuns returns the ranges of fd that hold data (SEEK_DATA, SEEK_HOLE), ascending, at
// most max of them (0: all).
func dataRuns(fd int, max int) []PreallocRun {
	var runs []PreallocRun
	for off := int64(0); max == 0 || len(runs) < max; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err != nil {
			break // ENXIO: no data after off
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil || end <= start {
			break
		}
		runs = append(runs, PreallocRun{uint64(start), uint64(end)})
		off = end
	}
	return runs
}
