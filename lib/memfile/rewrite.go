package memfile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/checkpoint-restore/go-criu/v8/crit"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fown"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/regfile"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/vma"
	"github.com/lazyfork/lazyfork/lib/undo"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

type rewriter struct {
	opts    Options
	set     *checkpointSet
	res     *Result
	files   []*memFile
	renames [][2]string      // temp image -> final image
	maps    map[*task][]byte // pages images mapped read-only (pagesOf)
	inspect bool             // a plan that writes nothing (Inspect)
	noRoot  bool             // Inspect was given no RootFS: mapped files are not read
}

// memFile is one memory file to create and the data that goes into it.
type memFile struct {
	name string
	path string
	kind string
	size int64
	t    *task
	v    *vmaInfo   // the first VMA it holds
	vmas []*vmaInfo // every VMA it holds: all of a process's converted VMAs
	id   uint32     // its files.img entry, shared by every VMA that maps it
	// VMAs' offsets (vmaInfo.off) agree with their addresses modulo 2 MiB where memory is
	// anonymous, so that a huge tmpfs page can be mapped whole (one PMD, no page-table page).
	hugePages int  // 2 MiB stretches made huge pages by the rewrite (huge.go)
	prealloc  bool // renamed from a Preallocate file: pages outside the data are punched
	placed    bool // renamed from the process's placed file: its dumped pages are in it
	pieces    []piece
	written   int64
	bytes     int64
	dataSize  int64 // bytes going in (work estimate: biggest files start first)
}

func (r *rewriter) plan() error {
	multi := len(r.set.tasks) > 1
	byPid := map[uint32]*task{}
	for _, t := range r.set.tasks {
		if name, ok := r.opts.Placed[t.pid]; ok {
			if name == "" || name != filepath.Base(name) {
				return fmt.Errorf("rewrite: pages file %q of process %d is not a file name", name, t.pid)
			}
			t.placed = filepath.Join(r.opts.FamilyDir, name)
			t.changed = true // its pages image is written from the file
		}
		if err := t.split(r.set.dir); err != nil {
			return err
		}
		for _, v := range t.vmas {
			if err := r.classify(t, v, multi); err != nil {
				return err
			}
		}
		if err := r.share(t, byPid[t.ppid]); err != nil {
			return err
		}
		byPid[t.pid] = t
		for _, v := range t.vmas {
			if (v.act == actAnon || v.act == actFile) && v.out == nil {
				mf := r.procFile(t, v, multi)
				if v.act == actFile {
					mf.dataSize += int64(v.e.GetEnd() - v.e.GetStart())
				}
			}
		}
		for _, p := range t.pieces {
			var out *memFile
			if p.vma >= 0 && t.vmas[p.vma].act != actShare {
				out = t.vmas[p.vma].out
			}
			if out != nil {
				out.pieces = append(out.pieces, p)
				out.dataSize += p.n * pageSize
				r.res.PagesMoved += p.n
				continue
			}
			if p.src >= 0 || p.zero || p.base {
				r.res.PagesKept += p.n
				t.keptData += p.n * pageSize
			}
		}
	}
	return nil
}

func (r *rewriter) classify(t *task, v *vmaInfo, multi bool) error {
	e := v.e
	length := int64(e.GetEnd() - e.GetStart())
	switch st := e.GetStatus(); {
	case st == statusFilePriv:
		fe := r.set.fileByID[uint32(e.GetShmid())]
		if fe == nil || fe.GetType() != fdinfo.FdTypes_REG || fe.GetReg() == nil {
			v.why = "maps something other than a regular file"
			return nil
		}
		v.reg = fe
		if base, ok := r.familyBase(fe.GetReg().GetName()); ok {
			v.family = base
			if r.opts.SkipSharedCount && (!r.opts.Rebase || v.missing) {
				r.res.DeltaPages += v.present
				v.act = actDelta
				v.why = fmt.Sprintf("already maps family file %s; its own %d pages stay in the checkpoint as a delta", base, v.present)
				return nil
			}
			shared, famSize, err := r.scanFamily(base, int64(e.GetPgoff()), length)
			if err != nil {
				return err
			}
			r.res.SharedPages += shared
			r.res.DeltaPages += v.present
			// A rebase moves every VMA that maps a family file, written or not: the new
			// generation then names none of the old one's files, which go with their last
			// user (fork.pruneGenerations).
			if !r.opts.Rebase || v.missing {
				v.act = actDelta
				v.why = fmt.Sprintf("already maps family file %s (%d shared pages); its own %d pages stay in the checkpoint as a delta", base, shared, v.present)
				return nil
			}
			if why := outOfFile(e); why != "" {
				v.act, v.why = actDelta, why
				return nil
			}
			v.act = actRebase
			v.why = fmt.Sprintf("maps family file %s; rebased: its %d shared pages and %d delta pages go to the process's memory file", base, shared, v.present)
			if famSize != AnonFileSize {
				v.why += " (a per-mapping file of an older rewrite)"
			}
			r.procFile(t, v, multi).dataSize += shared * pageSize
			return nil
		}
		switch {
		case !r.opts.ConvertFilePrivate:
			v.why = "file mapping with copied-on-write pages: conversion is off (--no-file-private)"
		case v.present == 0:
			v.why = "file mapping with no dumped pages: restored from the file itself"
		case v.missing:
			v.why = "pages in a parent image"
		case r.set.remapped[fe.GetId()]:
			v.why = "the file was unlinked (remapped by CRIU)"
		default:
			v.why = outOfFile(e)
		}
		if v.why != "" {
			return nil
		}
		v.act = actFile
		// Its file is chosen by plan: its parent's (share) or its own (procFile).
		v.why = fmt.Sprintf("copied-on-write pages of %s: its bytes with the %d dumped pages over them, in the process's memory file at their own address", fe.GetReg().GetName(), v.present)
	case st == statusAnon || st == statusHeap:
		switch {
		case e.GetFlags()&^unix.MAP_NORESERVE != anonPrivateFlag:
			v.why = fmt.Sprintf("flags %#x are not a plain private anonymous mapping (a stack grows down; shared memory must stay shared)", e.GetFlags())
		case e.GetMadv()&madvWipeOnFork != 0:
			v.why = "MADV_WIPEONFORK: must come back empty"
		case v.present == 0:
			v.why = "no dumped pages: restored as empty anonymous memory"
		case v.missing:
			v.why = "pages in a parent image"
		default:
			v.why = outOfFile(e)
		}
		if v.why != "" {
			return nil
		}
		v.act = actAnon
		// Its file is chosen by plan: its parent's (share) or its own (procFile).
		v.why = fmt.Sprintf("private anonymous memory: its %d pages move to the process's memory file at their own address", v.present)
	default:
		v.why = "kept: " + statusWords(st)
	}
	return nil
}

// hugeAlign is the size of a PMD-mapped huge page (x86-64, arm64 with 4 KiB pages).
const hugeAlign = 2 << 20

// procFile adds v to its process's memory file (made on first use, named after its first
// VMA), at the file offset equal to v's address. Every converted VMA of a process, anonymous
// or a copy of a file mapping, lies in this one file: a process with 30,000 mappings needs
// one file, and CRIU's restore opens it once for each run of VMAs that map it.
func (r *rewriter) procFile(t *task, v *vmaInfo, multi bool) *memFile {
	v.off = int64(v.e.GetStart())
	t.changed = true
	if t.anon == nil {
		t.anon = &memFile{kind: "anon", size: AnonFileSize, t: t, v: v}
		r.files = append(r.files, t.anon)
	}
	v.out = t.anon
	t.anon.vmas = append(t.anon.vmas, v)
	// Named after its lowest VMA: [<prefix>-][<pid>-]<start>-anon.mem.
	if v.e.GetStart() <= t.anon.v.e.GetStart() {
		t.anon.v = v
		name := fmt.Sprintf("%x-anon.mem", v.e.GetStart())
		if multi {
			name = fmt.Sprintf("%d-%s", t.pid, name)
		}
		if r.opts.Prefix != "" {
			name = r.opts.Prefix + "-" + name
		}
		t.anon.name, t.anon.path = name, filepath.Join(r.opts.FamilyDir, name)
	}
	return t.anon
}

// outOfFile says why a VMA cannot lie in a memory file at its own address ("" if it can).
func outOfFile(e *vma.VmaEntry) string {
	if e.GetEnd() > uint64(AnonFileSize) {
		return fmt.Sprintf("ends at %#x, past the %#x bytes of a memory file", e.GetEnd(), AnonFileSize)
	}
	return ""
}

// familyBase reports whether an image file name is a family file under MountPath.
func (r *rewriter) familyBase(name string) (string, bool) {
	dir, base := filepath.Split(name)
	if filepath.Clean(dir) != r.opts.MountPath || base == "" || base == "." || base == ".." {
		return "", false
	}
	return base, true
}

// openFamily opens a family file read-only; the caller closes it (no descriptor is held
// per file across the rewrite).
func (r *rewriter) openFamily(base string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(r.opts.FamilyDir, base), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open family file %s (mapped as %s/%s): %w", filepath.Join(r.opts.FamilyDir, base), r.opts.MountPath, base, err)
	}
	return f, nil
}

// scanFamily counts the data pages of a family file in [off, off+n) and reports its size.
func (r *rewriter) scanFamily(base string, off, n int64) (pages, size int64, err error) {
	f, err := r.openFamily(base)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	if pages, err = dataPages(f, off, n); err != nil {
		return 0, 0, fmt.Errorf("scan family file %s: %w", base, err)
	}
	st, err := f.Stat()
	if err != nil {
		return 0, 0, fmt.Errorf("stat family file %s: %w", base, err)
	}
	return pages, st.Size(), nil
}

// createFiles creates every memory file (O_EXCL) at its apparent size, or renames the
// process's preallocated file to its name.
func (r *rewriter) createFiles(steps *undo.Stack) error {
	for _, mf := range r.files {
		path := mf.path
		removeStep := func() error {
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("remove memory file: %w", err)
			}
			return nil
		}
		if mf.t.placed != "" {
			// The placed file becomes the memory file; undone, it goes back (the
			// checkpoint's pages are in it).
			if err := unix.Renameat2(unix.AT_FDCWD, mf.t.placed, unix.AT_FDCWD, mf.path, unix.RENAME_NOREPLACE); err != nil {
				return fmt.Errorf("create memory file %s from %s: %w", mf.name, filepath.Base(mf.t.placed), err)
			}
			from := mf.t.placed
			mf.t.placed, mf.prealloc, mf.placed = mf.path, true, true
			r.res.PreallocFiles++
			steps.Push(func() error { return os.Rename(path, from) })
			continue
		}
		if ok, err := r.takePrealloc(mf); err != nil {
			return err
		} else if ok {
			mf.prealloc = true
			r.res.PreallocFiles++
			steps.Push(removeStep)
			continue
		}
		f, err := os.OpenFile(mf.path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o400)
		if err != nil {
			return fmt.Errorf("create memory file: %w", err)
		}
		steps.Push(removeStep)
		err = f.Truncate(mf.size)
		// Closed at once: fill reopens one file per worker (never a descriptor per file).
		if cerr := f.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("size memory file %s: %w", mf.name, err)
		}
	}
	return nil
}

// takePrealloc renames mf's process's preallocated file (Options.Prealloc) to mf's name,
// if there is one: a regular file of a memory file's size in FamilyDir, renamed without
// replacing anything. It reports whether it did.
func (r *rewriter) takePrealloc(mf *memFile) (bool, error) {
	name, ok := r.opts.Prealloc[mf.t.pid]
	if !ok || mf.kind != "anon" || name == "" || name != filepath.Base(name) {
		return false, nil
	}
	src := filepath.Join(r.opts.FamilyDir, name)
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != mf.size {
		return false, nil // gone (a gc pruned it), or not one of Preallocate's: write afresh
	}
	if err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, mf.path, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("create memory file %s from %s: %w", mf.name, name, err)
	}
	return true, nil
}

// fill writes every memory file, biggest first, on as many workers as there are CPUs.
// Writes to one tmpfs file serialize on its inode lock, so files are the unit of work.
func (r *rewriter) fill(ctx context.Context) error {
	maps := map[*task][]byte{}
	for _, t := range r.set.tasks {
		if !t.changed || t.placed != "" {
			continue
		}
		m, err := r.pagesOf(t)
		if err != nil {
			return err
		}
		maps[t] = m
	}
	order := append([]*memFile(nil), r.files...)
	sort.SliceStable(order, func(i, j int) bool { return order[i].dataSize > order[j].dataSize })
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan int)
	errs := make([]error, len(order))
	var wg sync.WaitGroup
	for w := 0; w < min(runtime.GOMAXPROCS(0), len(order)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if errs[i] = r.fillOne(ctx, order[i], maps[order[i].t]); errs[i] != nil {
					cancel()
				}
			}
		}()
	}
	for i := range order {
		if ctx.Err() != nil {
			break
		}
		work <- i
	}
	close(work)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("rewrite: %w", err)
	}
	for _, mf := range r.files {
		r.res.BytesWritten += mf.written
		r.res.HugePages += mf.hugePages
	}
	return nil
}

// release unmaps the pages images.
func (r *rewriter) release() {
	for _, m := range r.maps {
		if m != nil {
			unix.Munmap(m)
		}
	}
	r.maps = nil
}

func mapPages(dir string, id uint32) ([]byte, error) {
	name := pagesImage(id)
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("open image %s: %w", name, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat image %s: %w", name, err)
	}
	if st.Size() == 0 {
		return nil, nil
	}
	// A shared read-only map of the page cache: pages are copied once, by pwrite.
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map image %s: %w", name, err)
	}
	return m, nil
}

func (r *rewriter) fillOne(ctx context.Context, mf *memFile, pages []byte) error {
	f, err := os.OpenFile(mf.path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open memory file %s: %w", mf.name, err)
	}
	defer f.Close()
	fd := int(f.Fd())
	// With HugePages, a fresh file's dense stretches become huge pages while it is
	// written, ahead of the copy (huge.go); a preallocated or placed file has them already.
	var huge *hugeMaker
	if r.opts.HugePages && !mf.prealloc {
		plan, err := r.hugePlan(mf, pages)
		if err != nil {
			return err
		}
		huge = startHuge(ctx, fd, plan, nil)
		defer huge.finish() // before the file is closed
	}
	// The dumped pages are read from the image with pread into one reused buffer, not
	// through pages' mapping: on a host that shadows the guest's page tables every first
	// touch of a mapped page traps to the host (~8 us; 256 MiB: 0.4-0.6 s), a kernel copy
	// into a buffer already touched does not.
	var img *imagePages
	if len(pages) > 0 && !mf.placed {
		if img, err = openImagePages(r.set.dir, mf.t.pagesID); err != nil {
			return err
		}
		defer img.close()
	}
	// Stretch by stretch, in address order, each once it is ready (huge.go).
	units := r.fillUnits(ctx, fd, mf, pages, img)
	ats := make([]int64, len(units))
	for k, u := range units {
		ats[k] = u.at
	}
	err = huge.each(ats, func(k int) error {
		for _, op := range units[k].ops {
			if err := op(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	// A placed file still holds the pages that stay in the checkpoint: punched once the
	// pages image is written (punchPlaced).
	if mf.prealloc && !mf.placed {
		if err := punchOutside(fd, mf.dataRanges()); err != nil {
			return fmt.Errorf("write memory file %s: %w", mf.name, err)
		}
	}
	mf.hugePages = len(huge.finish())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat memory file %s: %w", mf.name, err)
	}
	mf.bytes = st.Blocks * 512
	return nil
}

// fillUnit is what fillOne writes into one 2 MiB stretch of a memory file, in order.
type fillUnit struct {
	at  int64 // the stretch's offset
	ops []func() error
}

// fillUnits splits what fillOne writes into mf by 2 MiB stretch, in address order: VMA by
// VMA, base bytes first (a library's, or a family file's for a rebased VMA), then the
// dumped pages over them. A placed file's base bytes go around its pages, a VMA at a time
// (it has no huge pages to wait for: its units are written in order).
func (r *rewriter) fillUnits(ctx context.Context, fd int, mf *memFile, pages []byte, img *imagePages) []fillUnit {
	byAt := map[int64]int{}
	var units []fillUnit
	add := func(at int64, op func() error) {
		b := at / hugeAlign * hugeAlign
		k, ok := byAt[b]
		if !ok {
			k = len(units)
			byAt[b] = k
			units = append(units, fillUnit{at: b})
		}
		units[k].ops = append(units[k].ops, op)
	}
	// split adds fn for each part of [off, off+n) inside one stretch.
	split := func(off, n int64, fn func(off, n int64) error) {
		for at := off; at < off+n; {
			end := min(off+n, at/hugeAlign*hugeAlign+hugeAlign)
			from, m := at, end-at
			add(from, func() error { return fn(from, m) })
			at = end
		}
	}
	pieces := map[*vmaInfo][]piece{}
	for _, p := range mf.pieces {
		v := mf.t.vmas[p.vma]
		pieces[v] = append(pieces[v], p)
	}
	vmas := append([]*vmaInfo(nil), mf.vmas...)
	sort.Slice(vmas, func(i, j int) bool { return vmas[i].off < vmas[j].off })
	for _, v := range vmas {
		length := int64(v.e.GetEnd() - v.e.GetStart())
		switch {
		case v.act != actFile && v.act != actRebase:
		case mf.placed:
			add(v.off, func() error { return r.copyBaseAround(fd, mf, v) })
		case v.act == actFile:
			split(v.off, length, func(off, n int64) error { return r.copyLibrary(fd, mf, v, off-v.off, n) })
		default:
			split(v.off, length, func(off, n int64) error { return r.copyFamily(fd, mf, v, off-v.off, n) })
		}
		if mf.placed {
			continue // its dumped pages are in place already
		}
		for _, p := range pieces[v] {
			dst := v.off + int64(p.vaddr-v.e.GetStart())
			src, size := p.src, p.n*pageSize
			if src+size > int64(len(pages)) {
				add(dst, func() error {
					return fmt.Errorf("write memory file %s: pages %d+%d past the image's %d bytes", mf.name, src, size, len(pages))
				})
				continue
			}
			// A zero page over base bytes must punch a hole; over anonymous memory the
			// file is a hole already (or a zeroed huge page), unless it was preallocated.
			punch := v.act != actAnon || mf.prealloc
			split(dst, size, func(off, n int64) error {
				w, err := img.write(ctx, fd, src+off-dst, n, off, punch)
				mf.written += w
				if err != nil {
					return fmt.Errorf("write memory file %s: %w", mf.name, err)
				}
				return nil
			})
		}
	}
	sort.Slice(units, func(i, j int) bool { return units[i].at < units[j].at })
	return units
}

// hugePlan returns the 2 MiB stretches of mf (ascending) that will hold at least
// denseFraction data: its anonymous and rebased VMAs' non-zero dumped pages (a zero page
// stays a hole in small pages: a huge page would hold it in RAM) and a rebased VMA's
// family-file data. Copies of file mappings are left out: small, and read through their
// own mappings. Testing a page for zeros reads up to its first non-zero byte: little of
// a data page, and the pages are read again by the copy anyway.
func (r *rewriter) hugePlan(mf *memFile, pages []byte) ([]int64, error) {
	var rs []PreallocRun
	add := func(start, end uint64) {
		if k := len(rs); k > 0 && rs[k-1].End == start {
			rs[k-1].End = end
			return
		}
		rs = append(rs, PreallocRun{start, end})
	}
	for _, v := range mf.vmas {
		if v.act != actRebase {
			continue
		}
		fam, err := r.openFamily(v.family)
		if err != nil {
			return nil, err
		}
		pgoff := int64(v.e.GetPgoff())
		err = DataExtents(int(fam.Fd()), pgoff, pgoff+int64(v.e.GetEnd()-v.e.GetStart()), func(d, h int64) error {
			add(uint64(v.off+d-pgoff), uint64(v.off+h-pgoff))
			return nil
		})
		fam.Close()
		if err != nil {
			return nil, fmt.Errorf("scan family file %s: %w", v.family, err)
		}
	}
	for _, p := range mf.pieces {
		v := mf.t.vmas[p.vma]
		if v.act != actAnon && v.act != actRebase {
			continue
		}
		dst := uint64(v.off) + p.vaddr - v.e.GetStart()
		src := pages[p.src : p.src+p.n*pageSize]
		_ = unix.Madvise(src, unix.MADV_POPULATE_READ) // as writePages: one call, not a fault per 64 kB
		for i := int64(0); i < p.n; i++ {
			if !bytes.Equal(src[i*pageSize:(i+1)*pageSize], zeroPage) {
				add(dst+uint64(i*pageSize), dst+uint64((i+1)*pageSize))
			}
		}
	}
	return denseStretches(mergeRuns(rs)), nil
}

// dataRanges are the sorted, merged file ranges fillOne writes in mf: the pages of its
// anonymous pieces, and the whole of every VMA it writes base bytes for.
func (mf *memFile) dataRanges() []PreallocRun {
	var rs []PreallocRun
	for _, v := range mf.vmas {
		if v.act == actFile || v.act == actRebase {
			rs = append(rs, PreallocRun{uint64(v.off), uint64(v.off) + v.e.GetEnd() - v.e.GetStart()})
		}
	}
	for _, p := range mf.pieces {
		v := mf.t.vmas[p.vma]
		dst := uint64(v.off) + p.vaddr - v.e.GetStart()
		rs = append(rs, PreallocRun{dst, dst + uint64(p.n*pageSize)})
	}
	return mergeRuns(rs)
}

// copyBaseAround writes a placed file's base bytes (a library's, a family file's) for v
// where v has no dumped page: the dumped ones are in place already.
func (r *rewriter) copyBaseAround(fd int, mf *memFile, v *vmaInfo) error {
	at, end := v.e.GetStart(), v.e.GetEnd()
	gap := func(to uint64) error {
		if to <= at {
			return nil
		}
		from, n := int64(at-v.e.GetStart()), int64(to-at)
		if v.act == actFile {
			return r.copyLibrary(fd, mf, v, from, n)
		}
		return r.copyFamily(fd, mf, v, from, n)
	}
	for _, p := range mf.pieces {
		if mf.t.vmas[p.vma] != v {
			continue
		}
		if err := gap(p.vaddr); err != nil {
			return err
		}
		at = max(at, p.vaddr+uint64(p.n*pageSize))
	}
	return gap(end)
}

// punchPlaced punches out of each placed memory file the pages that went to the
// checkpoint's pages image and anything else it does not hold (as fillOne does for a
// preallocated one), after writeImages has copied them.
func (r *rewriter) punchPlaced() error {
	for _, mf := range r.files {
		if !mf.placed {
			continue
		}
		f, err := os.OpenFile(mf.path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open memory file %s: %w", mf.name, err)
		}
		err = punchOutside(int(f.Fd()), mf.dataRanges())
		var st unix.Stat_t
		if err == nil {
			err = unix.Fstat(int(f.Fd()), &st)
			mf.bytes = st.Blocks * 512
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("write memory file %s: %w", mf.name, err)
		}
	}
	return nil
}

// copyFamily copies the data a rebased VMA maps from its family file to its place in mf:
// the n bytes from from (relative to the VMA's start).
func (r *rewriter) copyFamily(fd int, mf *memFile, v *vmaInfo, from, n int64) error {
	base, err := r.openFamily(v.family)
	if err != nil {
		return err
	}
	defer base.Close()
	n, err = copyExtents(fd, int(base.Fd()), int64(v.e.GetPgoff())+from, n, v.off+from)
	mf.written += n
	if err != nil {
		return fmt.Errorf("copy family file %s into %s: %w", v.family, mf.name, err)
	}
	return nil
}

// copyLibrary writes the original file's bytes for a file-backed VMA's [pgoff+from,
// pgoff+from+length) at v.off+from in mf.
func (r *rewriter) copyLibrary(dst int, mf *memFile, v *vmaInfo, from, length int64) error {
	fd, size, err := r.openLibrary(v)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	off := int64(v.e.GetPgoff()) + from
	n := min(length, size-off)
	if n <= 0 {
		return nil
	}
	w, err := copyDense(dst, fd, off, n, v.off+from)
	mf.written += w
	if err != nil {
		return fmt.Errorf("copy %s into %s: %w", v.reg.GetReg().GetName(), mf.name, err)
	}
	return nil
}

// openLibrary opens the original file of a file-backed VMA read-only, inside RootFS so
// that the container's symlinks cannot point it at host files, and checks that it is the
// regular file of the dump's size. The caller closes the descriptor.
func (r *rewriter) openLibrary(v *vmaInfo) (int, int64, error) {
	reg := v.reg.GetReg()
	root, err := os.OpenFile(r.opts.RootFS, os.O_RDONLY|unix.O_DIRECTORY|unix.O_PATH, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("open root %s: %w", r.opts.RootFS, err)
	}
	defer root.Close()
	fd, err := unix.Openat2(int(root.Fd()), reg.GetName(), &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, 0, fmt.Errorf("open %s in %s: %w", reg.GetName(), r.opts.RootFS, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("stat %s: %w", reg.GetName(), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("copy %s: not a regular file", reg.GetName())
	}
	if reg.Size != nil && int64(reg.GetSize()) != st.Size {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("copy %s: size %d, was %d at dump time", reg.GetName(), st.Size, reg.GetSize())
	}
	return fd, st.Size, nil
}

// readLibraryPage reads the page of v's original file that v maps at addr into buf (one
// page; zeros past the end of the file). v.e holds the dump's offset until pointAt, the
// last step of a task's images, moves it.
func readLibraryPage(fd int, v *vmaInfo, addr uint64, buf []byte) error {
	off := int64(v.e.GetPgoff()) + int64(addr-v.e.GetStart())
	n, err := preadFull(fd, buf, off)
	if err != nil {
		return fmt.Errorf("read %s: %w", v.reg.GetReg().GetName(), err)
	}
	clear(buf[n:])
	return nil
}

// writeImages writes the edited mm, pagemap, pages and files images under temp names.
func (r *rewriter) writeImages(ctx context.Context, steps *undo.Stack) error {
	anyChange := false
	for _, t := range r.set.tasks {
		if !t.changed {
			continue
		}
		anyChange = true
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("rewrite: %w", err)
		}
		if err := r.writePagesImage(t, steps); err != nil {
			return err
		}
		head := t.pmImg.Entries[0]
		pm := &crit.CriuImage{Magic: "PAGEMAP", Entries: []*crit.CriuEntry{head}}
		for _, p := range t.pieces {
			if p.vma >= 0 && t.vmas[p.vma].out != nil && t.vmas[p.vma].act != actShare {
				continue
			}
			pe, err := newPagemapEntry(p.vaddr, p.n)
			if err != nil {
				return fmt.Errorf("rewrite %s: %w", t.pmName, err)
			}
			if p.zero || p.base {
				pe.Flags = proto.Uint32(pePresent)
			} else {
				pe.InParent = p.entry.InParent
				pe.Flags = p.entry.Flags
			}
			pm.Entries = append(pm.Entries, &crit.CriuEntry{Message: pe})
		}
		if err := r.store(t.pmName, pm, steps); err != nil {
			return err
		}
		for _, v := range t.vmas {
			if v.out != nil {
				r.pointAt(v)
			}
			if r.opts.KSM && (v.out != nil || v.act == actDelta) {
				v.e.Madv = proto.Uint64(v.e.GetMadv() | madvMergeable)
			}
		}
		if err := r.store(t.mmName, t.mmImg, steps); err != nil {
			return err
		}
	}
	if anyChange {
		if err := r.store("files.img", r.set.files, steps); err != nil {
			return err
		}
	}
	return nil
}

// pointAt makes v a private mapping of its memory file at offset v.off and, for the first
// VMA of a file, adds the file entry CRIU opens it by: the in-container name, no mnt_id,
// the real size and mode. Every VMA of one file shares its entry, so CRIU opens it once.
func (r *rewriter) pointAt(v *vmaInfo) {
	mf := v.out
	e := v.e
	e.Status = proto.Uint32(statusFilePriv)
	e.Flags = proto.Uint32(e.GetFlags() &^ unix.MAP_ANONYMOUS)
	e.Pgoff = proto.Uint64(uint64(v.off))
	e.Fdflags = proto.Uint32(0)
	if mf.id != 0 {
		e.Shmid = proto.Uint64(uint64(mf.id))
		return
	}
	r.set.maxID++
	id := r.set.maxID
	mf.id = id
	e.Shmid = proto.Uint64(uint64(id))
	zero := func() *uint32 { return proto.Uint32(0) }
	fe := &fdinfo.FileEntry{
		Type: fdinfo.FdTypes_REG.Enum(),
		Id:   proto.Uint32(id),
		Reg: &regfile.RegFileEntry{
			Id:    proto.Uint32(id),
			Flags: proto.Uint32(0),
			Pos:   proto.Uint64(0),
			Fown:  &fown.FownEntry{Uid: zero(), Euid: zero(), Signum: zero(), PidType: zero(), Pid: zero()},
			Name:  proto.String(filepath.Join(r.opts.MountPath, mf.name)),
			Size:  proto.Uint64(uint64(mf.size)),
			Mode:  proto.Uint32(unix.S_IFREG | 0o400),
		},
	}
	r.set.files.Entries = append(r.set.files.Entries, &crit.CriuEntry{Message: fe})
	r.set.fileByID[id] = fe
}

func (r *rewriter) store(name string, img *crit.CriuImage, steps *undo.Stack) error {
	tmp := filepath.Join(r.set.dir, ".lf-tmp-"+name)
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", tmp, err)
	}
	steps.Push(func() error { return removeIfExists(tmp) })
	if err := storeImage(tmp, img); err != nil {
		return err
	}
	r.renames = append(r.renames, [2]string{tmp, filepath.Join(r.set.dir, name)})
	return nil
}

// writePagesImage copies the pages that stay in the checkpoint into a new pages image.
func (r *rewriter) writePagesImage(t *task, steps *undo.Stack) error {
	name := pagesImage(t.pagesID)
	srcPath := filepath.Join(r.set.dir, name)
	if t.placed != "" {
		srcPath = t.placed // pieces' src are addresses in it
	}
	src, err := os.Open(srcPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && t.keptData == 0 {
			return nil
		}
		return fmt.Errorf("open image %s: %w", name, err)
	}
	defer src.Close()
	tmp := filepath.Join(r.set.dir, ".lf-tmp-"+name)
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", tmp, err)
	}
	steps.Push(func() error { return removeIfExists(tmp) })
	dst, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create image %s: %w", name, err)
	}
	defer dst.Close()
	var run struct{ src, n int64 }
	var out int64
	lib := libPages{r: r, t: t}
	defer lib.close()
	flush := func() error {
		if run.n == 0 {
			return nil
		}
		if err := copyRange(int(dst.Fd()), int(src.Fd()), run.src, out, run.n); err != nil {
			return fmt.Errorf("copy pages into %s: %w", name, err)
		}
		out += run.n
		run.n = 0
		return nil
	}
	for _, p := range t.pieces {
		if p.zero {
			if err := flush(); err != nil {
				return err
			}
			if err := writeZeros(int(dst.Fd()), out, p.n*pageSize); err != nil {
				return fmt.Errorf("write zero pages into %s: %w", name, err)
			}
			out += p.n * pageSize
			continue
		}
		if p.base {
			if err := flush(); err != nil {
				return err
			}
			if err := lib.write(int(dst.Fd()), p, out); err != nil {
				return fmt.Errorf("write pages into %s: %w", name, err)
			}
			out += p.n * pageSize
			continue
		}
		if p.src < 0 || (p.vma >= 0 && t.vmas[p.vma].out != nil && t.vmas[p.vma].act != actShare) {
			continue
		}
		if run.n > 0 && run.src+run.n == p.src {
			run.n += p.n * pageSize
			continue
		}
		if err := flush(); err != nil {
			return err
		}
		run.src, run.n = p.src, p.n*pageSize
	}
	if err := flush(); err != nil {
		return err
	}
	if err := dst.Close(); err != nil {
		return fmt.Errorf("close image %s: %w", name, err)
	}
	r.renames = append(r.renames, [2]string{tmp, filepath.Join(r.set.dir, name)})
	return nil
}

// finish renames the new images into place. Originals are hard-linked aside first so a
// failed rename can put every one of them back.
func (r *rewriter) finish() (retErr error) {
	type moved struct{ final, old string }
	var done []moved
	defer func() {
		if retErr != nil {
			for i := len(done) - 1; i >= 0; i-- {
				if err := os.Rename(done[i].old, done[i].final); err != nil {
					retErr = errors.Join(retErr, fmt.Errorf("restore image %s: %w", done[i].final, err))
				}
			}
		}
		// Unlinking the last name of a big tmpfs file frees its pages on the spot (~10 ms
		// per 64 MB here). Holding it open makes the unlink instant; the pages go when
		// the descriptor is closed, off the caller's path.
		var held []*os.File
		for _, m := range done {
			if f, err := os.Open(m.old); err == nil {
				held = append(held, f)
			}
			removeIfExists(m.old)
		}
		go func() {
			for _, f := range held {
				f.Close()
			}
		}()
	}()
	for _, rn := range r.renames {
		old := filepath.Join(filepath.Dir(rn[1]), ".lf-old-"+filepath.Base(rn[1]))
		if err := removeIfExists(old); err != nil {
			return err
		}
		if err := os.Link(rn[1], old); err != nil {
			return fmt.Errorf("keep image %s: %w", filepath.Base(rn[1]), err)
		}
		done = append(done, moved{final: rn[1], old: old})
		if err := os.Rename(rn[0], rn[1]); err != nil {
			return fmt.Errorf("replace image %s: %w", filepath.Base(rn[1]), err)
		}
	}
	refs := map[string]bool{}
	for _, mf := range r.files {
		r.res.Files = append(r.res.Files, File{Name: mf.name, Size: mf.size, Bytes: mf.bytes, VMAStart: mf.v.e.GetStart(), Kind: mf.kind})
		refs[mf.name] = true
		for _, v := range mf.vmas {
			switch v.act {
			case actAnon:
				r.res.VMAsConverted++
			case actFile:
				r.res.FileVMAsConverted++
			case actRebase:
				r.res.VMAsRebased++
			}
		}
	}
	for _, t := range r.set.tasks {
		for _, v := range t.vmas {
			if v.act == actDelta {
				refs[v.family] = true
			}
		}
	}
	r.res.References = []string{}
	for name := range refs {
		r.res.References = append(r.res.References, name)
	}
	sort.Strings(r.res.References)
	if r.res.Files == nil {
		r.res.Files = []File{}
	}
	return nil
}

// writeZeros writes n zero bytes at off (pages a child must not take from its parent's file).
func writeZeros(fd int, off, n int64) error {
	for n > 0 {
		c := min(n, int64(len(zeroChunk)))
		if err := pwriteAll(fd, zeroChunk[:c], off); err != nil {
			return err
		}
		off, n = off+c, n-c
	}
	return nil
}

var zeroChunk = make([]byte, 64<<10)

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

var addrInName = regexp.MustCompile(`^-[0-9a-f]{6,16}-`)

// tailOf recovers "anon.mem" or "<lib>.mem" from a family file name made by Rewrite
// (<prefix>-<start>-<tail>), so a rebased file stays recognisable. The address is the
// last "-<hex>-" field: prefixes such as snapshot ids may hold hex fields too.
func tailOf(base string) string {
	for i := len(base) - 1; i >= 0; i-- {
		if base[i] != '-' {
			continue
		}
		if loc := addrInName.FindStringIndex(base[i:]); loc != nil {
			return base[i+loc[1]:]
		}
	}
	if strings.HasSuffix(base, ".mem") {
		return base
	}
	return base + ".mem"
}

func kindOf(tail string) string {
	if tail == "anon.mem" {
		return "anon"
	}
	return "file:" + strings.TrimSuffix(tail, ".mem")
}
