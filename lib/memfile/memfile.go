// Package memfile rewrites a CRIU image directory so that its memory lives in "family
// memory files" on tmpfs: every converted VMA becomes a MAP_PRIVATE mapping of a sparse
// file, and every restore of the checkpoint maps those files instead of copying pages. Reads
// then share the page cache and the kernel copies a page only when a fork writes it.
//
// The edits are the ones CRIU 4.1 was seen to accept (see shared/env/memfile-findings.md
// and tuning-findings.md):
//   - private anonymous VMAs with dumped pages (status 0x201/0x221, flags 0x22 give or
//     take MAP_NORESERVE, no MAP_GROWSDOWN, no MADV_WIPEONFORK) become private mappings
//     of one 2^47-byte sparse file per process, holding each page at its own address
//     (file offset = vaddr): one file however many mappings a process has (a process with
//     30,000 mappings needed 20,000 files and as many descriptors), and offsets agree with
//     addresses on huge-page boundaries;
//   - optionally, file-backed private VMAs with dumped pages (status exactly 0x41) become
//     private mappings of the same per-process file, holding the original file's bytes
//     with the dumped pages written over them at the VMA's own address: one file and one
//     descriptor per process at restore, however many mappings (maps06: 30,000);
//   - VMAs that already map a family file (a checkpoint of a fork) keep their pages in the
//     image as a delta, or with Options.Rebase get fresh files of base bytes plus delta.
//
// Images are read and written only through go-criu's crit and typed image packages.
package memfile

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/checkpoint-restore/go-criu/v8/crit"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/inventory"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pstree"
	remap "github.com/checkpoint-restore/go-criu/v8/crit/images/remap-file-path"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/vma"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/lazyfork/lazyfork/lib/trace"
	"github.com/lazyfork/lazyfork/lib/undo"
)

// DefaultMountPath is where a container sees its family directory.
const DefaultMountPath = "/.lazyfork/mem"

// AnonFileSize is the apparent size of a memory file made from anonymous memory: mremap
// growth of the mapping keeps reading the file, and must find holes (zeros) there.
const AnonFileSize = int64(1) << 47

// ErrAllocator is returned by Rewrite when the checkpoint maps an allocator that relies on
// MADV_DONTNEED zero-filling (see Detect).
var ErrAllocator = errors.New("image maps an allocator that relies on MADV_DONTNEED zero-fill")

// Options says what to rewrite and where the memory files go.
type Options struct {
	CheckpointDir string // the checkpoint dir to rewrite in place (the caller's own copy)
	FamilyDir     string // host dir on tmpfs where .mem files are created (O_EXCL)
	// HugePages makes each 2 MiB stretch of anonymous memory that is at least 3/4 non-zero
	// data one huge page, allocated just ahead of the copy into it (huge.go): forks map it
	// without page tables (~0.4 MB less per working fork of a 256 MiB heap), and the copy
	// is still one copy, but on this VM allocating fresh huge pages slows the rewrite
	// (bench/huge_pages.py), so it is not the default. Preallocated files (Prealloc,
	// Placed) have their dense stretches in huge pages already, made before the dump
	// (Preallocate).
	HugePages bool
	MountPath string // in-container path of FamilyDir; "" means DefaultMountPath
	// RootFS is the host path of the dumped container's root, used to read the original
	// bytes of file-backed VMAs (files.img names them relative to it); "" means "/".
	RootFS string
	// ConvertFilePrivate also converts file-backed private VMAs with dumped pages
	// (library .data, relro): the sub-1 MB per fork tuning.
	ConvertFilePrivate bool
	// Prefix starts every file name, keeping names unique within the family (e.g. the
	// snapshot id).
	Prefix string
	// Rebase turns delta VMAs (already mapping family files, with pages of their own in
	// the image) into fresh files of base bytes plus delta pages. The caller decides,
	// e.g. when DeltaPages > SharedPages/4.
	Rebase bool
	// SkipSharedCount leaves SharedPages at 0 for VMAs that stay deltas: counting them
	// reads every page index of the family files (SEEK_DATA/SEEK_HOLE on tmpfs walks
	// them: ~6 ms for a 256 MiB heap), for a figure a transient snapshot (a fork's) never
	// shows. A rebase still counts what it moves.
	SkipSharedCount bool
	// AllowAllocators rewrites even when Detect finds jemalloc, mimalloc or tcmalloc.
	AllowAllocators bool
	// KSM marks every VMA that maps a memory file MADV_MERGEABLE in the checkpoint: CRIU
	// restores each VMA's madvise bits, so ksmd may merge the forks' identical private
	// pages. Opt-in per tree, same tenant only (docs/security.md).
	KSM bool
	// Prealloc names, by the pid the checkpoint gives a process, a file in FamilyDir made
	// by Preallocate before the dump: that process's memory file is this file renamed,
	// its pages already allocated (prealloc.go). A name that is gone is ignored.
	Prealloc map[uint32]string
	// Placed names, by pid, the file in FamilyDir where a PageServer put a process's
	// dumped pages, each at offset = its address; its pages image is empty. The file
	// becomes the process's memory file (or, with nothing to convert, only the source of
	// the pages that stay in the checkpoint); copy-on-write sharing with a parent
	// (cow.go) is not looked for.
	Placed map[uint32]string
}

// Result describes what Rewrite did.
type Result struct {
	Files             []File `json:"files"`
	VMAsConverted     int    `json:"vmas_converted"`      // anonymous VMAs now in memory files
	FileVMAsConverted int    `json:"file_vmas_converted"` // file-backed private VMAs now in memory files
	VMAsRebased       int    `json:"vmas_rebased"`        // delta VMAs moved to fresh files (Rebase)
	PagesMoved        int64  `json:"pages_moved"`         // pages taken out of the checkpoint into files
	PagesKept         int64  `json:"pages_kept"`          // pages left in the checkpoint
	// SharedPages counts data pages of the family files that the checkpoint's delta VMAs map;
	// DeltaPages counts the checkpoint's own pages on top of them (before any rebase).
	SharedPages int64 `json:"shared_pages"`
	DeltaPages  int64 `json:"delta_pages"`
	// References names every family file (in FamilyDir) the rewritten image maps, new
	// and old: the files that must outlive the snapshot.
	References   []string `json:"references"`
	BytesWritten int64    `json:"bytes_written"` // bytes written into memory files
	// CowSharedPages counts pages a process shared copy-on-write with its parent, left to
	// its parent's memory file instead of being stored again (cow.go).
	CowSharedPages int64 `json:"cow_shared_pages"`
	// HugePages counts the 2 MiB stretches the rewrite made huge pages (see huge.go); a
	// preallocated file's were made before the dump (stage.DumpStats.PreallocHugePages).
	HugePages int `json:"huge_pages"`
	// PreallocFiles counts memory files written into pages allocated before the dump
	// (Options.Prealloc).
	PreallocFiles int           `json:"prealloc_files,omitempty"`
	Duration      time.Duration `json:"duration_ns"`
	MBPerSec      float64       `json:"mb_per_sec"` // BytesWritten / Duration, MB = 10^6 bytes
}

// File is one memory file created by Rewrite.
type File struct {
	Name     string `json:"name"`      // file name in FamilyDir
	Size     int64  `json:"size"`      // apparent size
	Bytes    int64  `json:"bytes"`     // allocated bytes
	VMAStart uint64 `json:"vma_start"` // start of the first VMA that maps it
	// Kind is "anon": a process's memory file, holding its anonymous memory and the copies
	// of its file-private mappings, each at its own address ("file:<name>" were per-mapping
	// files of older rewrites, still recognised in family directories).
	Kind string `json:"kind"`
}

// CRIU's VMA status bits (criu/include/image.h) and pagemap flags (pagemap.h).
const (
	vmaAreaRegular  = 1 << 0
	vmaAreaHeap     = 1 << 5
	vmaFilePrivate  = 1 << 6
	vmaFileShared   = 1 << 7
	vmaAnonPrivate  = 1 << 9
	vmaAreaGuard    = 1 << 16
	statusAnon      = vmaAreaRegular | vmaAnonPrivate
	statusHeap      = statusAnon | vmaAreaHeap
	statusFilePriv  = vmaAreaRegular | vmaFilePrivate
	pePresent       = 1 << 2
	madvWipeOnFork  = 1 << unix.MADV_WIPEONFORK
	madvMergeable   = 1 << unix.MADV_MERGEABLE
	anonPrivateFlag = unix.MAP_PRIVATE | unix.MAP_ANONYMOUS
)

var pageSize = int64(os.Getpagesize())

type action int

const (
	actKeep   action = iota
	actAnon          // anonymous VMA -> new sparse file
	actFile          // file-backed private VMA -> library bytes + dumped pages
	actDelta         // maps a family file already: leave alone
	actRebase        // maps a family file: fresh file of base bytes + delta
	actShare         // maps its parent's new memory file + the differing pages (cow.go)
)

// decisions name the actions in lf-inspect's VMA table (docs/stages.md).
var decisions = [...]string{actKeep: "keep", actAnon: "move", actFile: "convert-file", actDelta: "delta",
	actRebase: "rebase", actShare: "share"}

// refersToFamily: the VMA keeps mapping a memory file of its family, so the checkpoint is
// rewritten to name it.
func (a action) refersToFamily() bool { return a == actDelta || a == actRebase }

// checkpointSet is one checkpoint directory, loaded once (no caches outside it).
type checkpointSet struct {
	dir      string
	files    *crit.CriuImage
	fileByID map[uint32]*fdinfo.FileEntry
	maxID    uint32
	remapped map[uint32]bool
	tasks    []*task
}

type task struct {
	pid      uint32
	ppid     uint32
	mmName   string
	mmImg    *crit.CriuImage
	mm       *mm.MmEntry
	pmName   string
	pmImg    *crit.CriuImage
	pagesID  uint32
	vmas     []*vmaInfo // sorted by start
	pieces   []piece    // the pagemap split at VMA boundaries, in order
	changed  bool
	keptData int64    // bytes of pages staying in the checkpoint
	anon     *memFile // the process's anonymous memory file, once it has one
	// placed is the file holding the process's dumped pages at offset = address
	// (Options.Placed), "" when they are in its pages image: pieces' src are then
	// addresses in it.
	placed string
}

type vmaInfo struct {
	e       *vma.VmaEntry
	act     action
	present int64 // dumped pages with data in the pages image
	missing bool  // pages recorded without data here (parent or lazy images)
	reg     *fdinfo.FileEntry
	family  string // base name of the family file it maps (delta VMAs)
	out     *memFile
	off     int64  // offset in out that the VMA's start maps
	why     string // the reason for act, for people (lf-inspect, --explain)
}

// piece is a run of pagemap pages inside at most one VMA.
type piece struct {
	vaddr uint64
	n     int64
	src   int64 // offset in the pages image, -1 if the pages have no data there
	vma   int   // index in task.vmas, -1 if outside every VMA
	zero  bool  // src is -1 but the checkpoint must hold zero pages here (cow.go)
	base  bool  // src is -1 but the checkpoint must hold the VMA's original file's bytes here (cow.go)
	entry *pagemap.PagemapEntry
}

// Rewrite rewrites opts.CheckpointDir in place. On error every file it created is removed
// and the checkpoint directory is left as it was.
func Rewrite(ctx context.Context, opts Options) (res *Result, retErr error) {
	start := time.Now()
	if err := normalize(&opts); err != nil {
		return nil, err
	}
	endLoad := trace.Step(ctx, "memfile: read the checkpoint")
	set, err := loadSet(opts.CheckpointDir)
	endLoad()
	if err != nil {
		return nil, err
	}
	if !opts.AllowAllocators {
		if names := set.allocators(); len(names) > 0 {
			return nil, fmt.Errorf("rewrite %s: %w: %s", opts.CheckpointDir, ErrAllocator, strings.Join(names, ", "))
		}
	}
	r := &rewriter{opts: opts, set: set, res: &Result{}}
	var steps undo.Stack
	defer func() {
		r.release()
		if retErr != nil {
			if err := steps.Run(); err != nil {
				retErr = errors.Join(retErr, err)
			}
		}
	}()
	for _, step := range []struct {
		name string
		run  func() error
	}{
		{"plan", r.plan},
		{"create the memory files", func() error { return r.createFiles(&steps) }},
		{"fill them", func() error { return r.fill(ctx) }},
		{"write the images", func() error { return r.writeImages(ctx, &steps) }},
		{"punch what was placed", r.punchPlaced},
		{"finish", r.finish},
	} {
		end := trace.Step(ctx, "memfile: "+step.name)
		err := step.run()
		end()
		if err != nil {
			return nil, err
		}
	}
	r.res.Duration = time.Since(start)
	if s := r.res.Duration.Seconds(); s > 0 {
		r.res.MBPerSec = float64(r.res.BytesWritten) / 1e6 / s
	}
	return r.res, nil
}

func normalize(o *Options) error {
	if o.CheckpointDir == "" {
		return errors.New("rewrite: no checkpoint directory given")
	}
	if o.FamilyDir == "" {
		return errors.New("rewrite: no family directory given")
	}
	if o.MountPath == "" {
		o.MountPath = DefaultMountPath
	}
	o.MountPath = filepath.Clean(o.MountPath)
	if !filepath.IsAbs(o.MountPath) {
		return fmt.Errorf("rewrite: mount path %q is not absolute", o.MountPath)
	}
	if o.RootFS == "" {
		o.RootFS = "/"
	}
	if strings.ContainsAny(o.Prefix, "/\x00") {
		return fmt.Errorf("rewrite: prefix %q is not a file name", o.Prefix)
	}
	if err := checkCheckpointDir(o.CheckpointDir); err != nil {
		return err
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(o.FamilyDir, &sfs); err != nil {
		return fmt.Errorf("stat family dir %s: %w", o.FamilyDir, err)
	}
	if sfs.Type != unix.TMPFS_MAGIC {
		return fmt.Errorf("family dir %s is not on tmpfs: memory files must live in RAM", o.FamilyDir)
	}
	return nil
}

// loadSet reads pstree, files, remaps, and every task's mm and pagemap.
func loadSet(dir string) (*checkpointSet, error) {
	if err := checkCheckpointDir(dir); err != nil {
		return nil, err
	}
	set := &checkpointSet{dir: dir, fileByID: map[uint32]*fdinfo.FileEntry{}, remapped: map[uint32]bool{}}
	if _, err := loadImage(dir, "inventory.img", "INVENTORY", &inventory.InventoryEntry{}); err != nil {
		return nil, err
	}
	pst, err := loadImage(dir, "pstree.img", "PSTREE", &pstree.PstreeEntry{})
	if err != nil {
		return nil, err
	}
	if len(pst.Entries) == 0 {
		return nil, fmt.Errorf("read image pstree.img: %w: no tasks", ErrTruncated)
	}
	set.files, err = loadImage(dir, "files.img", "FILES", &fdinfo.FileEntry{})
	if err != nil {
		return nil, err
	}
	for _, e := range set.files.Entries {
		fe := e.Message.(*fdinfo.FileEntry)
		set.fileByID[fe.GetId()] = fe
		set.maxID = max(set.maxID, fe.GetId())
	}
	if _, err := os.Stat(filepath.Join(dir, "remap-fpath.img")); err == nil {
		rm, err := loadImage(dir, "remap-fpath.img", "REMAP_FPATH", &remap.RemapFilePathEntry{})
		if err != nil {
			return nil, err
		}
		for _, e := range rm.Entries {
			set.remapped[e.Message.(*remap.RemapFilePathEntry).GetOrigId()] = true
		}
	}
	for _, e := range pst.Entries {
		pe := e.Message.(*pstree.PstreeEntry)
		pid := pe.GetPid()
		t := &task{pid: pid, ppid: pe.GetPpid(), mmName: fmt.Sprintf("mm-%d.img", pid), pmName: fmt.Sprintf("pagemap-%d.img", pid)}
		if _, err := os.Stat(filepath.Join(dir, t.mmName)); errors.Is(err, os.ErrNotExist) {
			continue // a zombie has no memory
		}
		if t.mmImg, err = loadImage(dir, t.mmName, "MM", &mm.MmEntry{}); err != nil {
			return nil, err
		}
		if len(t.mmImg.Entries) != 1 {
			return nil, fmt.Errorf("read image %s: %w: %d entries, want 1", t.mmName, ErrTruncated, len(t.mmImg.Entries))
		}
		t.mm = t.mmImg.Entries[0].Message.(*mm.MmEntry)
		if t.pmImg, err = loadImage(dir, t.pmName, "PAGEMAP", &pagemap.PagemapHead{}); err != nil {
			return nil, err
		}
		if len(t.pmImg.Entries) == 0 {
			return nil, fmt.Errorf("read image %s: %w: no pagemap head", t.pmName, ErrTruncated)
		}
		t.pagesID = t.pmImg.Entries[0].Message.(*pagemap.PagemapHead).GetPagesId()
		set.tasks = append(set.tasks, t)
	}
	return set, nil
}

// split cuts the pagemap at VMA boundaries and checks that the pages image holds every
// page the pagemap promises.
func (t *task) split(dir string) error {
	t.vmas = t.vmas[:0]
	for _, v := range t.mm.GetVmas() {
		// CRIU >= 4.2 appends ranges of MADV_GUARD_INSTALL pages as fake VMAs at the end of
		// the list, over the real ones: they hold no pages and stay as they are.
		if v.GetStatus()&vmaAreaGuard != 0 {
			continue
		}
		if v.GetEnd() <= v.GetStart() || v.GetStart()%uint64(pageSize) != 0 || v.GetEnd()%uint64(pageSize) != 0 {
			return fmt.Errorf("read image %s: bad VMA %#x-%#x", t.mmName, v.GetStart(), v.GetEnd())
		}
		t.vmas = append(t.vmas, &vmaInfo{e: v})
	}
	sort.Slice(t.vmas, func(i, j int) bool { return t.vmas[i].e.GetStart() < t.vmas[j].e.GetStart() })
	for i := 1; i < len(t.vmas); i++ {
		if t.vmas[i].e.GetStart() < t.vmas[i-1].e.GetEnd() {
			return fmt.Errorf("read image %s: VMAs %#x and %#x overlap", t.mmName, t.vmas[i-1].e.GetStart(), t.vmas[i].e.GetStart())
		}
	}
	var off int64
	for _, ent := range t.pmImg.Entries[1:] {
		pe := ent.Message.(*pagemap.PagemapEntry)
		has := present(pe)
		addr, n := pe.GetVaddr(), int64(pagesIn(pe))
		if addr%uint64(pageSize) != 0 {
			return fmt.Errorf("read image %s: page address %#x is not page aligned", t.pmName, addr)
		}
		for n > 0 {
			p := piece{vaddr: addr, src: -1, vma: -1, entry: pe}
			i := sort.Search(len(t.vmas), func(i int) bool { return t.vmas[i].e.GetEnd() > addr })
			var limit uint64 // address where this piece must stop
			switch {
			case i < len(t.vmas) && t.vmas[i].e.GetStart() <= addr:
				p.vma, limit = i, t.vmas[i].e.GetEnd()
			case i < len(t.vmas):
				limit = t.vmas[i].e.GetStart()
			default:
				limit = ^uint64(0)
			}
			p.n = n
			if span := (limit - addr) / uint64(pageSize); span < uint64(n) {
				p.n = int64(span)
			}
			if has && t.placed != "" {
				p.src = int64(addr)
			} else if has {
				p.src = off
				off += p.n * pageSize
			}
			if p.vma >= 0 {
				if has {
					t.vmas[p.vma].present += p.n
				} else {
					t.vmas[p.vma].missing = true
				}
			}
			t.pieces = append(t.pieces, p)
			addr += uint64(p.n) * uint64(pageSize)
			n -= p.n
		}
	}
	name := pagesImage(t.pagesID)
	st, err := os.Stat(filepath.Join(dir, name))
	if t.placed != "" {
		if err == nil && st.Size() != 0 {
			return fmt.Errorf("read image %s: %w: %d bytes, but the pages of %s are in %s", name, ErrUnaccounted, st.Size(), t.pmName, filepath.Base(t.placed))
		}
		if _, err := os.Stat(t.placed); err != nil {
			return fmt.Errorf("pages of %s: %w", t.pmName, err)
		}
		return nil
	}
	if err != nil {
		if off == 0 && errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("stat image %s: %w", name, err)
	}
	if st.Size() < off {
		return fmt.Errorf("read image %s: %w: %d bytes, %s needs %d", name, ErrTruncated, st.Size(), t.pmName, off)
	}
	// Pages the pagemap does not account for would stay in the checkpoint: every fork would
	// restore them as a private copy. Refuse rather than produce full copies (this is how
	// a pagemap field layout the rewrite does not know shows up).
	if st.Size() > off {
		return fmt.Errorf("read image %s: %w: it holds %d pages but %s accounts for %d; was it written by a CRIU this lf-memfile does not know? (criu >= 4.1 with go-criu v8 image types are supported)", name, ErrUnaccounted, st.Size()/pageSize, t.pmName, off/pageSize)
	}
	return nil
}

// pagesIn is a pagemap entry's page count. CRIU 4.2 writes it as the 64-bit field 5
// (nr_pages) and leaves field 2 (compat_nr_pages) at 0; CRIU 4.1 writes only field 2.
func pagesIn(pe *pagemap.PagemapEntry) uint64 {
	if pe.NrPages != nil {
		return pe.GetNrPages()
	}
	return uint64(pe.GetCompatNrPages())
}

// newPagemapEntry writes the page count in both fields, so CRIU 4.1 (field 2, required)
// and CRIU 4.2 (field 5 when present) read the same number.
func newPagemapEntry(vaddr uint64, n int64) (*pagemap.PagemapEntry, error) {
	if n <= 0 || n > math.MaxUint32 {
		return nil, fmt.Errorf("pagemap entry at %#x: %d pages does not fit CRIU 4.1's 32-bit count", vaddr, n)
	}
	return &pagemap.PagemapEntry{Vaddr: proto.Uint64(vaddr), CompatNrPages: proto.Uint32(uint32(n)), NrPages: proto.Uint64(uint64(n))}, nil
}

// present follows CRIU: images without flags mark parent pages with in_parent.
func present(pe *pagemap.PagemapEntry) bool {
	if pe.Flags != nil {
		return pe.GetFlags()&pePresent != 0
	}
	return !pe.GetInParent()
}

// Detect lists the allocator libraries mapped by the checkpoint's tasks that rely on
// MADV_DONTNEED zero-filling (jemalloc, mimalloc, tcmalloc): in a fork that memory is
// a private file mapping and MADV_DONTNEED brings back the snapshot's bytes.
func Detect(checkpointDir string) (allocators []string, err error) {
	set, err := loadSet(checkpointDir)
	if err != nil {
		return nil, err
	}
	return set.allocators(), nil
}

// ZeroFillAllocator reports whether the mapped file path is an allocator library that
// relies on MADV_DONTNEED zero-fill, and which (libjemalloc, libmimalloc, libtcmalloc).
// The rewrite checks a checkpoint's mappings with it, lf-dump a live container's.
func ZeroFillAllocator(path string) (string, bool) {
	base := filepath.Base(path)
	for _, lib := range []string{"libjemalloc", "libmimalloc", "libtcmalloc"} {
		if strings.HasPrefix(base, lib) {
			return lib, true
		}
	}
	return "", false
}

func (s *checkpointSet) allocators() []string {
	seen := map[string]bool{}
	var out []string
	for _, t := range s.tasks {
		for _, v := range t.mm.GetVmas() {
			if v.GetStatus()&(vmaFilePrivate|vmaFileShared) == 0 {
				continue
			}
			fe := s.fileByID[uint32(v.GetShmid())]
			if fe == nil || fe.GetReg() == nil {
				continue
			}
			name := fe.GetReg().GetName()
			if _, ok := ZeroFillAllocator(name); ok && !seen[name] {
				seen[name] = true
				out = append(out, name)
			}
		}
	}
	sort.Strings(out)
	return out
}
