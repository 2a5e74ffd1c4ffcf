package memfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/pagemap"
	"golang.org/x/sys/unix"
)

// Report is what Inspect found in a checkpoint: every VMA with the rewrite's decision and
// why, the page accounting, and the memory files (made, or that a rewrite would make).
type Report struct {
	Dir   string       `json:"dir"`
	Tasks int          `json:"tasks"`
	VMAs  []VMAReport  `json:"vmas"`
	Pages PageReport   `json:"pages"`
	Files []FileReport `json:"files"`
	// Rewritten is true when the checkpoint already maps family memory files (lf-memfile
	// ran on it, or it is a fork's delta); the decisions are then what a rewrite of it
	// would do now.
	Rewritten bool `json:"rewritten"`
}

// VMAReport is one VMA and what the rewrite does with it.
type VMAReport struct {
	Pid      uint32 `json:"pid"`
	Start    uint64 `json:"start"`
	End      uint64 `json:"end"`
	Prot     string `json:"prot"`
	Status   string `json:"status"`   // CRIU's status bits in words
	Maps     string `json:"maps"`     // the file it maps, if any (in-container path)
	Pages    int64  `json:"pages"`    // its pages with data in the checkpoint
	Decision string `json:"decision"` // move, convert-file, share, delta, rebase, keep
	File     string `json:"file,omitempty"`
	Why      string `json:"why"`
}

// PageReport accounts for the checkpoint's pages.
type PageReport struct {
	PagemapEntries   int64 `json:"pagemap_entries"`
	InCheckpoint     int64 `json:"in_image"`        // pages with data in pages-*.img
	ToMemoryFiles    int64 `json:"to_memory_files"` // of those, what a rewrite moves out
	StayInCheckpoint int64 `json:"stay_in_image"`
	NotInCheckpoint  int64 `json:"not_in_image"`  // pagemap pages without data here (zero, parent, lazy)
	SharedFamily     int64 `json:"shared_family"` // family pages the delta VMAs map
	Delta            int64 `json:"delta"`
	// CowShared: pages a process shares copy-on-write with its parent, read from the
	// parent's memory file (decision "share"), not stored again.
	CowShared int64 `json:"cow_shared"`
}

// FileReport is one memory file: on disk (Exists) or planned.
type FileReport struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"`
	VMAs     int    `json:"vmas"`
	Size     int64  `json:"size"`    // apparent size
	Bytes    int64  `json:"bytes"`   // allocated bytes on tmpfs (0 if only planned)
	Planned  int64  `json:"planned"` // bytes a rewrite would write (estimate)
	Exists   bool   `json:"exists"`
	Referred bool   `json:"referred"` // mapped by a delta VMA of this checkpoint
}

// Inspect explains a checkpoint without changing anything: it reads the images (and the
// family files its VMAs map, in opts.FamilyDir), runs the rewrite's plan, and writes
// nothing. opts.CheckpointDir is required; FamilyDir only for checkpoints that map family
// files.
func Inspect(opts Options) (*Report, error) {
	if opts.CheckpointDir == "" {
		return nil, errors.New("inspect: no checkpoint directory given")
	}
	if opts.MountPath == "" {
		opts.MountPath = DefaultMountPath
	}
	opts.MountPath = filepath.Clean(opts.MountPath)
	// Without the container's root, the files its mappings name are not read (the host's
	// files of the same names are not theirs).
	noRoot := opts.RootFS == ""
	if noRoot {
		opts.RootFS = "/"
	}
	set, err := loadSet(opts.CheckpointDir)
	if err != nil {
		return nil, err
	}
	r := &rewriter{opts: opts, set: set, res: &Result{}, inspect: true, noRoot: noRoot}
	defer r.release()
	if err := r.plan(); err != nil {
		return nil, fmt.Errorf("inspect %s: %w", opts.CheckpointDir, err)
	}
	rep := &Report{Dir: opts.CheckpointDir, Tasks: len(set.tasks)}
	rep.Pages.ToMemoryFiles, rep.Pages.StayInCheckpoint = r.res.PagesMoved, r.res.PagesKept
	rep.Pages.SharedFamily, rep.Pages.Delta = r.res.SharedPages, r.res.DeltaPages
	rep.Pages.CowShared = r.res.CowSharedPages
	referred := map[string]bool{}
	for _, t := range set.tasks {
		rep.Pages.PagemapEntries += int64(len(t.pmImg.Entries) - 1)
		// Counted from the pagemap: the plan may have dropped pages shared with a parent.
		for _, ent := range t.pmImg.Entries[1:] {
			pe := ent.Message.(*pagemap.PagemapEntry)
			if present(pe) {
				rep.Pages.InCheckpoint += int64(pagesIn(pe))
			} else {
				rep.Pages.NotInCheckpoint += int64(pagesIn(pe))
			}
		}
		for _, v := range t.vmas {
			e := v.e
			vr := VMAReport{Pid: t.pid, Start: e.GetStart(), End: e.GetEnd(), Prot: protString(e.GetProt(), e.GetFlags()),
				Status: statusWords(e.GetStatus()), Pages: v.present, Why: v.why}
			if v.reg != nil {
				vr.Maps = v.reg.GetReg().GetName()
			} else if fe := set.fileByID[uint32(e.GetShmid())]; fe != nil && fe.GetReg() != nil && e.GetStatus()&(vmaFilePrivate|vmaFileShared) != 0 {
				vr.Maps = fe.GetReg().GetName()
			}
			vr.Decision = decisions[v.act]
			if v.act.refersToFamily() {
				rep.Rewritten = true
				referred[v.family] = true
			}
			if v.out != nil {
				vr.File = v.out.name
			}
			rep.VMAs = append(rep.VMAs, vr)
		}
	}
	for _, mf := range r.files {
		// dataSize counts a library's bytes and the dumped pages written over them.
		rep.Files = append(rep.Files, FileReport{Name: mf.name, Kind: mf.kind, VMAs: len(mf.vmas), Size: mf.size, Planned: mf.dataSize})
	}
	for name := range referred {
		fr := FileReport{Name: name, Kind: kindOf(tailOf(name)), Exists: true, Referred: true}
		for _, v := range rep.VMAs {
			if v.Decision == "delta" || v.Decision == "rebase" {
				if filepath.Base(v.Maps) == name {
					fr.VMAs++
				}
			}
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(opts.FamilyDir, name), &st); err == nil {
			fr.Size, fr.Bytes = st.Size, st.Blocks*512
		}
		rep.Files = append(rep.Files, fr)
	}
	sort.Slice(rep.Files, func(i, j int) bool { return rep.Files[i].Name < rep.Files[j].Name })
	return rep, nil
}

// FamilyFiles lists a family directory's memory files with their apparent and allocated
// sizes (what a snapshot's forks map).
func FamilyFiles(dir string) ([]FileReport, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read family dir: %w", err)
	}
	var out []FileReport
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".mem") {
			continue
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, e.Name()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		out = append(out, FileReport{Name: e.Name(), Kind: kindOf(tailOf(e.Name())), Size: st.Size, Bytes: st.Blocks * 512, Exists: true})
	}
	return out, nil
}

var statusBits = []struct {
	bit  uint32
	word string
}{
	{1 << 1, "stack"}, {1 << 2, "vsyscall"}, {1 << 3, "vdso"}, {vmaAreaHeap, "heap"},
	{vmaFilePrivate, "file-private"}, {vmaFileShared, "file-shared"}, {1 << 8, "anon-shared"},
	{vmaAnonPrivate, "anon-private"}, {1 << 10, "sysvipc"}, {1 << 11, "socket"}, {1 << 12, "vvar"},
	{1 << 13, "aio-ring"}, {1 << 14, "memfd"}, {1 << 15, "shadow-stack"}, {1 << 16, "guard"},
	{1 << 17, "uprobes"}, {1 << 31, "unsupported"},
}

// statusWords names CRIU's VMA status bits (criu/include/image.h).
func statusWords(st uint32) string {
	var w []string
	for _, b := range statusBits {
		if st&b.bit != 0 {
			w = append(w, b.word)
		}
	}
	if st&vmaAreaRegular == 0 {
		w = append(w, "not-regular")
	}
	if len(w) == 0 {
		return "regular"
	}
	return strings.Join(w, ",")
}

func protString(prot, flags uint32) string {
	b := []byte("---p")
	if prot&unix.PROT_READ != 0 {
		b[0] = 'r'
	}
	if prot&unix.PROT_WRITE != 0 {
		b[1] = 'w'
	}
	if prot&unix.PROT_EXEC != 0 {
		b[2] = 'x'
	}
	if flags&unix.MAP_SHARED != 0 {
		b[3] = 's'
	}
	return string(b)
}

// Explain writes a short human account of a plan or a rewrite: how many VMAs and pages
// got each decision, and why, grouped (the --explain of lf-memfile).
func (r *Report) Explain(w io.Writer) {
	type key struct{ decision, why string }
	count := map[key][2]int64{}
	var order []key
	for _, v := range r.VMAs {
		why := v.Why
		if i := strings.IndexAny(why, ":("); i > 0 && v.Decision != "keep" {
			why = strings.TrimSpace(why[:i]) // the reason without this VMA's own numbers
		}
		k := key{v.Decision, why}
		if _, ok := count[k]; !ok {
			order = append(order, k)
		}
		c := count[k]
		count[k] = [2]int64{c[0] + 1, c[1] + v.Pages}
	}
	fmt.Fprintf(w, "%s: %d task(s), %d VMAs, %d pages with data in the checkpoint\n", r.Dir, r.Tasks, len(r.VMAs), r.Pages.InCheckpoint)
	for _, k := range order {
		c := count[k]
		fmt.Fprintf(w, "  %-12s %4d VMAs %8d pages  %s\n", k.decision, c[0], c[1], k.why)
	}
	fmt.Fprintf(w, "  => %d pages to memory files, %d stay in the checkpoint; %d memory files\n", r.Pages.ToMemoryFiles, r.Pages.StayInCheckpoint, len(r.Files))
}

// Explain tells what a rewrite did (lf-memfile --explain in raw mode): the pages it moved
// and the memory files it made.
func (r *Result) Explain(w io.Writer) {
	fmt.Fprintf(w, "moved %d pages of %d anonymous VMAs and %d copied-on-write file VMAs into %d memory files: %.1f MB written (%.0f MB/s); %d pages stay in the checkpoint\n",
		r.PagesMoved, r.VMAsConverted, r.FileVMAsConverted, len(r.Files), float64(r.BytesWritten)/1e6, r.MBPerSec, r.PagesKept)
	if r.CowSharedPages > 0 {
		fmt.Fprintf(w, "  %d pages a process shared copy-on-write with its parent stay in the parent's file (stored once)\n", r.CowSharedPages)
	}
	for _, f := range r.Files {
		fmt.Fprintf(w, "  %s: %s, apparent size %d bytes, %d allocated (sparse: holes cost nothing)\n", f.Name, f.Kind, f.Size, f.Bytes)
	}
	fmt.Fprintf(w, "  the checkpoint's VMAs now map these files MAP_PRIVATE: a restore shares their pages and copies one only when it writes it\n")
}
