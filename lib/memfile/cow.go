package memfile

import (
	"bytes"
	"fmt"
	"sort"
)

// Pages a process shares copy-on-write with its parent (a pre-forking server's workers and
// their master, after fork()) are dumped once per process by CRIU. Written into one memory
// file per process they would be stored, and mapped by every fork, once per process.
//
// Every memory file holds its process's memory at offset = address, so the parent's file
// at offset p is "the parent's page at p, or zero". A child's anonymous VMA can therefore
// map its parent's file at its own address, with only the pages that differ from it kept
// in the child's image: CRIU restores those over the mapping, and also where the parent
// has data and the child has none, as a zero page. Which pages are the same is decided by
// comparing the dumped bytes (no page frame numbers are needed: equal bytes at the same
// address read the same through either mapping), so the result is right whatever the
// processes did between fork() and the dump. In the fork, parent and child then read the
// same page-cache pages: stored once, charged once, and /proc/PID/pagemap shows the
// same frame in both, as it did in the source.
//
// CRIU's own copy-on-write restore agrees: a child VMA with the parent's start, end and
// file inherits the parent's premapped pages, and the pages the child's image does not
// list are dropped with MADV_DONTNEED, which on a private file mapping shows the file's
// bytes, the ones the comparison was made against.

// shareFactor: a child's VMA maps its parent's file only if its differing pages are at
// most 1/shareFactor of the pages it shares (the differing pages are restored privately
// in every fork, as a fork-of-a-fork's delta is; see Options.Rebase).
const shareFactor = 4

// zeroPage is one page of zeros, for comparisons.
var zeroPage = make([]byte, pageSize)

// pagesOf returns t's pages image mapped read-only (nil when it has none), mapped once per
// rewrite.
func (r *rewriter) pagesOf(t *task) ([]byte, error) {
	if m, ok := r.maps[t]; ok {
		return m, nil
	}
	m, err := mapPages(r.set.dir, t.pagesID)
	if err != nil {
		return nil, err
	}
	if r.maps == nil {
		r.maps = map[*task][]byte{}
	}
	r.maps[t] = m
	return m, nil
}

// vmaAt returns the index of t's VMA containing addr, or -1.
func (t *task) vmaAt(addr uint64) int {
	i := sort.Search(len(t.vmas), func(i int) bool { return t.vmas[i].e.GetEnd() > addr })
	if i < len(t.vmas) && t.vmas[i].e.GetStart() <= addr {
		return i
	}
	return -1
}

// pageRun is a run of dumped pages: n pages from vaddr at src in a pages image.
type pageRun struct {
	vaddr uint64
	n     int64
	src   int64
	entry *piece
}

// share lets each of t's anonymous VMAs that its parent's memory file covers map that file
// when most of its pages equal the file's. It runs after the parent's plan (tasks are in
// pstree order, parents first) and before t's pieces are given to files.
func (r *rewriter) share(t *task, parent *task) error {
	if parent == nil || len(parent.vmas) == 0 {
		return nil
	}
	var (
		mine, theirs []byte
		newPieces    []piece
		changed      = map[int][]piece{}
	)
	for i, v := range t.vmas {
		if v.act != actAnon || v.out != nil {
			continue
		}
		s, e := v.e.GetStart(), v.e.GetEnd()
		pi := parent.vmaAt(s)
		if pi < 0 || parent.vmas[pi].out == nil {
			continue
		}
		f := parent.vmas[pi].out
		owner := f.t
		// The file's bytes in [s, e) must be known: its owner's anonymous pages or holes.
		runs, ok := ownerRuns(owner, f, s, e)
		if !ok {
			continue
		}
		var err error
		if mine == nil {
			if mine, err = r.pagesOf(t); err != nil {
				return err
			}
		}
		if theirs, err = r.pagesOf(owner); err != nil {
			return err
		}
		var own []pageRun
		for k := range t.pieces {
			if p := &t.pieces[k]; p.vma == i && p.src >= 0 {
				own = append(own, pageRun{vaddr: p.vaddr, n: p.n, src: p.src, entry: p})
			}
		}
		delta, shared := compareRuns(own, runs, mine, theirs, i)
		var deltaPages int64
		for _, p := range delta {
			deltaPages += p.n
		}
		if shared == 0 || deltaPages*shareFactor > shared {
			continue
		}
		v.act = actShare
		v.out = f
		v.off = int64(s)
		v.why = fmt.Sprintf("shares %d pages copy-on-write with process %d: maps its memory file %s at its own address; its %d differing pages stay in the checkpoint", shared, owner.pid, f.name, deltaPages)
		r.res.CowSharedPages += shared
		t.changed = true
		changed[i] = delta
	}
	if len(changed) == 0 {
		return nil
	}
	// The pieces of shared VMAs are replaced by their delta, in address order.
	done := map[int]bool{}
	for _, p := range t.pieces {
		d, ok := changed[p.vma]
		if !ok {
			newPieces = append(newPieces, p)
			continue
		}
		if !done[p.vma] {
			done[p.vma] = true
			newPieces = append(newPieces, d...)
		}
	}
	t.pieces = newPieces
	return nil
}

// ownerRuns lists the pages of f's owner that f holds in [s, e), and false if f holds
// anything else there (a library's bytes, a rebased family file's).
func ownerRuns(owner *task, f *memFile, s, e uint64) ([]pageRun, bool) {
	in := map[int]bool{}
	for i, ov := range owner.vmas {
		if ov.e.GetEnd() <= s || ov.e.GetStart() >= e || ov.out != f {
			continue
		}
		if ov.act != actAnon {
			return nil, false
		}
		in[i] = true
	}
	var runs []pageRun
	for _, p := range owner.pieces {
		if !in[p.vma] || p.src < 0 {
			continue
		}
		a, b := max(p.vaddr, s), min(p.vaddr+uint64(p.n)*uint64(pageSize), e)
		if a >= b {
			continue
		}
		skip := int64(a-p.vaddr) / pageSize
		runs = append(runs, pageRun{vaddr: a, n: int64(b-a) / pageSize, src: p.src + skip*pageSize})
	}
	return runs, true
}

// compareRuns walks the pages of own (the child's) and theirs (the file's owner's) in
// address order. Equal pages (zero and absent are equal) are dropped; the child's other
// pages are kept, and where only the file has data a zero page is kept. It returns the
// kept pieces (for VMA index vma) and the count of the child's non-zero pages the file
// holds the same.
func compareRuns(own, theirs []pageRun, mine, other []byte, vma int) ([]piece, int64) {
	var out []piece
	var shared int64
	keep := func(addr uint64, src int64, zero bool, entry *piece) {
		if n := len(out); n > 0 {
			last := &out[n-1]
			end := last.vaddr + uint64(last.n)*uint64(pageSize)
			if end == addr && last.zero == zero && (zero || last.src+last.n*pageSize == src) {
				last.n++
				return
			}
		}
		p := piece{vaddr: addr, n: 1, src: src, vma: vma, zero: zero}
		if entry != nil {
			p.entry = entry.entry
		}
		out = append(out, p)
	}
	i, j := 0, 0
	var oi, tj int64 // pages consumed in own[i], theirs[j]
	for i < len(own) || j < len(theirs) {
		var a, b uint64 = ^uint64(0), ^uint64(0)
		if i < len(own) {
			a = own[i].vaddr + uint64(oi)*uint64(pageSize)
		}
		if j < len(theirs) {
			b = theirs[j].vaddr + uint64(tj)*uint64(pageSize)
		}
		addr := min(a, b)
		var mp, tp []byte
		var msrc int64 = -1
		var ment *piece
		if a == addr {
			msrc = own[i].src + oi*pageSize
			mp, ment = mine[msrc:msrc+pageSize], own[i].entry
			if oi++; oi == own[i].n {
				i, oi = i+1, 0
			}
		}
		if b == addr {
			src := theirs[j].src + tj*pageSize
			tp = other[src : src+pageSize]
			if tj++; tj == theirs[j].n {
				j, tj = j+1, 0
			}
		}
		if mp == nil {
			mp = zeroPage
		}
		if tp == nil {
			tp = zeroPage
		}
		switch {
		case bytes.Equal(mp, tp):
			if msrc >= 0 && !bytes.Equal(mp, zeroPage) {
				shared++
			}
		case msrc >= 0:
			keep(addr, msrc, false, ment)
		default:
			keep(addr, -1, true, nil)
		}
	}
	return out, shared
}
