package snapshot

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/memfile"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// RebaseFraction: a fork's snapshot whose own pages exceed this fraction of the family's
// shared pages is rebased (fresh memory files of base + delta) instead of stacking.
const RebaseFraction = 0.25

// MemfileOptions tune the rewrite.
type MemfileOptions struct {
	Force bool // rewrite even when an unsupported allocator is mapped
	// NoFilePrivate keeps copied-on-write pages of libraries in the checkpoint (the per-fork
	// floor is then ~1.5-2.4 MB instead of under 1 MB).
	NoFilePrivate bool
	// Rebase forces (true) a rebase; nil decides by RebaseFraction.
	Rebase *bool
	// HugePages: see memfile.Options.HugePages.
	HugePages bool
	// KSM: see memfile.Options.KSM (a ksm tree's forks).
	KSM bool
	// SkipSharedCount: see memfile.Options.SkipSharedCount (a fork's transient snapshot).
	SkipSharedCount bool
}

// Memfile moves a dumped snapshot's memory into its family's memory files on tmpfs.
func Memfile(ctx context.Context, s *stage.Snapshot, o MemfileOptions) (*stage.Snapshot, error) {
	// Every path comes from the document: nothing is created or mounted before it is
	// known to be LazyFork's.
	if err := stage.CheckSnapshot(s); err != nil {
		return nil, fmt.Errorf("memfile: %w", err)
	}
	if s.State != stage.SnapDumped {
		return nil, fmt.Errorf("memfile %s: snapshot is %s, not dumped (lf-memfile takes the output of lf-dump)", s.ID, s.State)
	}
	endPrep := trace.Step(ctx, "state lock (shared), mount the layer stack read-only")
	unlock, err := LockShared(ctx)
	if err != nil {
		endPrep()
		return nil, fmt.Errorf("memfile %s: %w", s.ID, err)
	}
	defer unlock()
	if err := MakeFamilyDir(s.FamilyDir); err != nil {
		endPrep()
		return nil, fmt.Errorf("memfile %s: %w", s.ID, err)
	}
	// Libraries' original bytes are read through a read-only overlay of the snapshot's
	// own layer stack, so the rewrite does not depend on the source still existing.
	root := filepath.Join(s.Dir, "rootfs")
	err = mountReadOnlyStack(s.Lower, root)
	endPrep()
	if err != nil {
		return nil, fmt.Errorf("memfile %s: %w", s.ID, err)
	}
	defer func() {
		defer trace.Step(ctx, "unmount the layer stack")()
		_ = unix.Unmount(root, unix.MNT_DETACH)
		_ = os.Remove(root)
	}()
	rebase := false
	if o.Rebase != nil {
		rebase = *o.Rebase
	} else {
		// A fork's dump, or a swapped source's (it maps the family too): the family's
		// files hold what it shares; none for a first dump.
		shared := AllocatedPages(s.FamilyDir)
		rebase = shared > 0 && float64(s.Dump.PagesWritten) > RebaseFraction*float64(shared)
	}
	// Files the dump preallocated for the swap, or its page server put the pages in
	// (fork.Dump): used by the rewrite or, whatever happens, removed.
	prealloc, placed := preallocFiles(s), map[uint32]string(nil)
	defer func() {
		for _, name := range prealloc {
			_ = os.Remove(filepath.Join(s.FamilyDir, name))
		}
	}()
	if s.Dump.PagesPlaced {
		placed = prealloc
	}
	endRewrite := trace.Step(ctx, "rewrite the checkpoint")
	res, err := memfile.Rewrite(ctx, memfile.Options{
		Prealloc:           prealloc,
		Placed:             placed,
		CheckpointDir:      s.CheckpointDir,
		FamilyDir:          s.FamilyDir,
		MountPath:          memfile.DefaultMountPath,
		RootFS:             root,
		ConvertFilePrivate: !o.NoFilePrivate,
		Prefix:             s.ID,
		Rebase:             rebase,
		AllowAllocators:    o.Force,
		HugePages:          o.HugePages,
		KSM:                o.KSM,
		SkipSharedCount:    o.SkipSharedCount,
	})
	endRewrite()
	if err != nil {
		return nil, fmt.Errorf("memfile %s: %w", s.ID, err)
	}
	s.State = stage.SnapMemfiled
	s.Memfile = &stage.MemfileStats{
		Files: len(res.Files), VMAsConverted: res.VMAsConverted, FileVMAsConverted: res.FileVMAsConverted,
		PagesMoved: res.PagesMoved, PagesKept: res.PagesKept, SharedPages: res.SharedPages,
		DeltaPages: res.DeltaPages, Rebased: res.VMAsRebased > 0, BytesWritten: res.BytesWritten, HugePages: res.HugePages,
		PreallocFiles: res.PreallocFiles,
		Ms:            stage.Ms(res.Duration), MBPerSec: res.MBPerSec,
	}
	defer trace.Step(ctx, "save the snapshot record")()
	if err := Save(s); err != nil {
		return nil, err
	}
	return s, nil
}

// preallocFiles lists the files preallocated for s in its family directory, by the pid
// the checkpoint names their process.
func preallocFiles(s *stage.Snapshot) map[uint32]string {
	ents, _ := os.ReadDir(s.FamilyDir)
	out := map[uint32]string{}
	for _, e := range ents {
		if pid, ok := memfile.ParsePreallocName(s.ID, e.Name()); ok && e.Type().IsRegular() {
			out[pid] = e.Name()
		}
	}
	return out
}

// MakeFamilyDir creates a family's directory on tmpfs: 0700 and root's (the memory files
// in it are 0400), like every directory above it that it creates, so no other user reads
// a fork's memory. One that exists is brought to the same mode.
func MakeFamilyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, d := range []string{dir, filepath.Dir(dir)} {
		fi, err := os.Lstat(d)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", d)
		}
		if fi.Mode().Perm() != 0o700 {
			if err := os.Chmod(d, 0o700); err != nil {
				return fmt.Errorf("make %s private: %w", d, err)
			}
		}
	}
	return nil
}

func mountReadOnlyStack(lower []string, target string) error {
	if err := os.MkdirAll(target, 0o700); err != nil {
		return err
	}
	// Two or more lower dirs and no upper make a read-only overlay; one needs a bind.
	if len(lower) == 1 {
		return unix.Mount(lower[0], target, "", unix.MS_BIND|unix.MS_RDONLY, "")
	}
	opts := "lowerdir=" + strings.Join(lower, ":")
	if err := unix.Mount("overlay", target, "overlay", unix.MS_RDONLY, opts); err != nil {
		os.Remove(target)
		return fmt.Errorf("mount layer stack: %w", err)
	}
	return nil
}

// AllocatedPages counts the pages a family's files hold in RAM.
func AllocatedPages(dir string) int64 {
	ents, _ := os.ReadDir(dir)
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512 / 4096
			}
		}
	}
	return n
}
