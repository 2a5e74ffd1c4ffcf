package memfile

import (
	"bytes"
	"fmt"
	"sort"

	"golang.org/x/sys/unix"
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

// The sharing rule. A shared VMA's differing pages (D) are restored privately in every fork,
// as a fork-of-a-fork's delta is (see Options.Rebase); its own file would have stored its
// shared pages (S) once more instead. A child's VMA maps its parent's file when
//   - D*shareFactor <= S: each fork pays at most a quarter of what is saved, or
//   - S > 0 and D fits in the process's budget of smallDelta pages, spent on the VMAs with
//     the fewest differing pages per shared page first: small mappings with pages written
//     and not written after fork() in one VMA (cow01's) keep their pages shared, as in the
//     source, and no process adds more than smallDelta pages to each fork this way.
const (
	shareFactor = 4
	smallDelta  = 256
)

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

// shareCand is a VMA of a child that could map its parent's file.
type shareCand struct {
	i              int
	f              *memFile
	delta          []piece
	shared, differ int64
}

// share lets each of t's anonymous and file-private VMAs that its parent's memory file
// covers map that file when most of its pages equal the file's (see the sharing rule). It
// runs after the parent's plan (tasks are in pstree order, parents first) and before t's
// pieces are given to files.
func (r *rewriter) share(t *task, parent *task) error {
	if parent == nil || len(parent.vmas) == 0 || t.placed != "" || parent.placed != "" {
		return nil
	}
	var cands []shareCand
	for i, v := range t.vmas {
		if (v.act != actAnon && v.act != actFile) || v.out != nil {
			continue
		}
		c, ok, err := r.compareWithParent(t, parent, i)
		if err != nil {
			return err
		}
		if ok && c.shared > 0 {
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	// Cheap ones first, then the others by differing pages per shared page, within budget.
	ratio := func(c shareCand) float64 { return float64(c.differ) / float64(c.shared) }
	sort.SliceStable(cands, func(a, b int) bool { return ratio(cands[a]) < ratio(cands[b]) })
	changed := map[int][]piece{}
	budget := int64(smallDelta)
	for _, c := range cands {
		v := t.vmas[c.i]
		if c.differ*shareFactor > c.shared {
			if c.differ > budget {
				v.why += fmt.Sprintf(" (keeps its own file: %d pages differ from process %d's, %d are the same)", c.differ, c.f.t.pid, c.shared)
				continue
			}
			budget -= c.differ
		}
		kind := "anonymous"
		if v.act == actFile {
			kind = "copied-on-write pages of " + v.reg.GetReg().GetName() + ","
		}
		v.act = actShare
		v.out = c.f
		v.off = int64(v.e.GetStart())
		v.why = fmt.Sprintf("%s shares %d pages copy-on-write with process %d: maps its memory file %s at its own address; its %d differing pages stay in the checkpoint", kind, c.shared, c.f.t.pid, c.f.name, c.differ)
		r.res.CowSharedPages += c.shared
		t.changed = true
		changed[c.i] = c.delta
	}
	if len(changed) == 0 {
		return nil
	}
	// The pieces of shared VMAs are replaced by their delta, in address order.
	var newPieces []piece
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
	// A shared VMA without pieces of its own (all its pages were zero) gets its delta too.
	for i, d := range changed {
		if !done[i] && len(d) > 0 {
			newPieces = append(newPieces, d...)
		}
	}
	sort.SliceStable(newPieces, func(a, b int) bool { return newPieces[a].vaddr < newPieces[b].vaddr })
	t.pieces = newPieces
	return nil
}

// compareWithParent compares t's VMA i with the memory file its parent maps at its start,
// and false if that file's bytes there are not known (another kind of memory, a library
// mapped at another offset, a rebased family file's).
func (r *rewriter) compareWithParent(t, parent *task, i int) (shareCand, bool, error) {
	v := t.vmas[i]
	s, e := v.e.GetStart(), v.e.GetEnd()
	pi := parent.vmaAt(s)
	if pi < 0 || parent.vmas[pi].out == nil {
		return shareCand{}, false, nil
	}
	f := parent.vmas[pi].out
	owner := f.t
	var runs []pageRun
	var ok bool
	if v.act == actAnon {
		runs, ok = ownerRuns(owner, f, s, e)
	} else {
		runs, ok = ownerFileRuns(owner, f, v)
	}
	if !ok {
		return shareCand{}, false, nil
	}
	mine, err := r.pagesOf(t)
	if err != nil {
		return shareCand{}, false, err
	}
	theirs, err := r.pagesOf(owner)
	if err != nil {
		return shareCand{}, false, err
	}
	var own []pageRun
	for k := range t.pieces {
		if p := &t.pieces[k]; p.vma == i && p.src >= 0 {
			own = append(own, pageRun{vaddr: p.vaddr, n: p.n, src: p.src, entry: p})
		}
	}
	c := shareCand{i: i, f: f}
	if v.act == actAnon {
		c.delta, c.shared, err = compareRuns(own, runs, mine, theirs, i, nil)
	} else {
		// Where only one side has a dumped page, the other reads the file's bytes.
		if r.noRoot {
			v.why += fmt.Sprintf(" (not compared with process %d's copy: no container root given)", owner.pid)
			return shareCand{}, false, nil
		}
		fd, _, oerr := r.openLibrary(v)
		if oerr != nil {
			if r.inspect {
				// Only a rewrite needs the file (Inspect may run without the container's root).
				v.why += fmt.Sprintf(" (not compared with process %d's copy: %v)", owner.pid, oerr)
				return shareCand{}, false, nil
			}
			return shareCand{}, false, oerr
		}
		buf := make([]byte, pageSize)
		base := func(addr uint64) ([]byte, error) { return buf, readLibraryPage(fd, v, addr, buf) }
		c.delta, _, err = compareRuns(own, runs, mine, theirs, i, base)
		unix.Close(fd)
	}
	if err != nil {
		return shareCand{}, false, err
	}
	for _, p := range c.delta {
		c.differ += p.n
	}
	if v.act == actFile {
		// Its own file would hold a copy of the whole mapping: every page not differing
		// is stored once less.
		c.shared = int64(e-s)/pageSize - c.differ
	}
	return c, true, nil
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
	return clipRuns(owner, in, s, e), true
}

// ownerFileRuns lists the dumped pages of f's owner in v's range, and false unless f
// holds there a copy of the file v maps, at v's offsets, with the owner's pages over it:
// one VMA of the owner converted from the same file (by name: both copies are read from
// it) covering v's range, with the same distance between address and file offset.
func ownerFileRuns(owner *task, f *memFile, v *vmaInfo) ([]pageRun, bool) {
	s, e := v.e.GetStart(), v.e.GetEnd()
	oi := owner.vmaAt(s)
	if oi < 0 {
		return nil, false
	}
	ov := owner.vmas[oi]
	if ov.out != f || ov.act != actFile || ov.e.GetEnd() < e ||
		ov.reg.GetReg().GetName() != v.reg.GetReg().GetName() ||
		ov.e.GetPgoff()-ov.e.GetStart() != v.e.GetPgoff()-s {
		return nil, false
	}
	return clipRuns(owner, map[int]bool{oi: true}, s, e), true
}

// clipRuns lists the dumped pages of owner's VMAs in [s, e).
func clipRuns(owner *task, in map[int]bool, s, e uint64) []pageRun {
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
	return runs
}

// compareRuns walks the pages of own (the child's) and theirs (the file's owner's) in
// address order. Where one side has no dumped page it reads base's bytes (nil: zeros, as
// anonymous memory). Equal pages are dropped; the child's other pages are kept, and where
// only the file has data the child's base bytes are kept (a zero page, or a base piece: the
// bytes of the file the VMA maps). It returns the kept pieces (for VMA index vma) and the
// count of the child's non-zero pages the file holds the same.
func compareRuns(own, theirs []pageRun, mine, other []byte, vma int, base func(uint64) ([]byte, error)) ([]piece, int64, error) {
	var out []piece
	var shared int64
	keep := func(addr uint64, src int64, zero, fromBase bool, entry *piece) {
		if n := len(out); n > 0 {
			last := &out[n-1]
			end := last.vaddr + uint64(last.n)*uint64(pageSize)
			if end == addr && last.zero == zero && last.base == fromBase && (zero || fromBase || last.src+last.n*pageSize == src) {
				last.n++
				return
			}
		}
		p := piece{vaddr: addr, n: 1, src: src, vma: vma, zero: zero, base: fromBase}
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
		fromBase := false
		if mp == nil || tp == nil {
			bp := zeroPage
			if base != nil {
				var err error
				if bp, err = base(addr); err != nil {
					return nil, 0, err
				}
				fromBase = !bytes.Equal(bp, zeroPage)
			}
			if mp == nil {
				mp = bp
			} else {
				tp = bp
			}
		}
		switch {
		case bytes.Equal(mp, tp):
			if msrc >= 0 && !bytes.Equal(mp, zeroPage) {
				shared++
			}
		case msrc >= 0:
			keep(addr, msrc, false, false, ment)
		default:
			keep(addr, -1, !fromBase, fromBase, nil)
		}
	}
	return out, shared, nil
}

// libPages writes base pieces (a VMA's original file's bytes) into a pages image, with one
// descriptor open at a time.
type libPages struct {
	r   *rewriter
	t   *task
	vma int
	fd  int
	buf []byte
}

func (l *libPages) write(dst int, p piece, off int64) error {
	v := l.t.vmas[p.vma]
	if l.buf == nil || l.vma != p.vma {
		l.close()
		fd, _, err := l.r.openLibrary(v)
		if err != nil {
			return err
		}
		l.fd, l.vma, l.buf = fd, p.vma, make([]byte, pageSize)
	}
	for k := int64(0); k < p.n; k++ {
		if err := readLibraryPage(l.fd, v, p.vaddr+uint64(k*pageSize), l.buf); err != nil {
			return err
		}
		if err := pwriteAll(dst, l.buf, off+k*pageSize); err != nil {
			return err
		}
	}
	return nil
}

func (l *libPages) close() {
	if l.buf != nil {
		unix.Close(l.fd)
		l.buf = nil
	}
}
