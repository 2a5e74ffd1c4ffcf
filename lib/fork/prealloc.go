package fork

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/memfile"
	"github.com/lazyfork/lazyfork/lib/snapshot"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// preallocate allocates, while the source still runs, the memory-file pages that the
// rewrite of its first swap writes while it is frozen (see lib/memfile/prealloc.go): one
// file per process of cg, in s's family directory, from its present anonymous pages.
// The pages come from a container, so the total is capped by the anonymous memory its
// group is charged for: a forged or sprawling address space (huge mappings, the zero page
// mapped everywhere) cannot make the host allocate more than the container already holds.
// Best effort: whatever fails, the rewrite writes into fresh pages as without it. Dense
// 2 MiB stretches are huge pages as policy says.
func preallocate(cg *cgroup.Cgroup, s *stage.Snapshot, policy memfile.HugePolicy) memfile.Preallocated {
	var total memfile.Preallocated
	st, err := cg.Stats()
	if err != nil || st.Rss == 0 {
		return total
	}
	budget := int64(st.Rss) / int64(os.Getpagesize())
	pids, err := cg.Procs()
	if err != nil {
		return total
	}
	if err := snapshot.MakeFamilyDir(s.FamilyDir); err != nil {
		return total
	}
	for _, pid := range pids {
		if budget <= 0 {
			break
		}
		nspid, err := memfile.NSPid(pid)
		if err != nil {
			continue // gone
		}
		runs, pages, err := memfile.AnonRuns(pid, budget)
		if err != nil || pages == 0 {
			continue
		}
		got, err := memfile.Preallocate(filepath.Join(s.FamilyDir, memfile.PreallocName(s.ID, nspid)), runs, policy)
		total.Bytes += got.Bytes
		total.HugePages += got.HugePages
		if got.HugeSlow {
			// The next process's would come as slowly.
			total.HugeSlow, policy = true, memfile.NoHugePages
		}
		budget -= pages
		if err != nil {
			fmt.Fprintf(os.Stderr, "lazyfork: dump %s: %v (the rewrite writes into fresh pages)\n", s.Source.Name, err)
			break
		}
	}
	return total
}

// dropPrealloc removes what preallocate made for s when no rewrite will take it (the dump
// failed): its files, and the family directory if that leaves it empty.
func dropPrealloc(s *stage.Snapshot) {
	ents, _ := os.ReadDir(s.FamilyDir)
	for _, e := range ents {
		if _, ok := memfile.ParsePreallocName(s.ID, e.Name()); ok {
			_ = os.Remove(filepath.Join(s.FamilyDir, e.Name()))
		}
	}
	_ = os.Remove(s.FamilyDir) // only if empty
}

// preallocTimed runs preallocate and says how long it took.
func preallocTimed(cg *cgroup.Cgroup, s *stage.Snapshot, policy memfile.HugePolicy) (memfile.Preallocated, time.Duration) {
	t := time.Now()
	got := preallocate(cg, s, policy)
	return got, time.Since(t)
}

// sweepZeroPages frees, in the background, the all-zero pages of the memory files m's
// rewrite made from placed pages (stage.DumpStats.PagesPlaced: the page server wrote
// every dumped page, zeros too; a rewrite from pages images leaves them as holes). Once
// the source runs again: punching a zero page does not change what anything mapping the
// file reads. The returned function waits for it.
func sweepZeroPages(ctx context.Context, m *stage.Snapshot) func() {
	if !m.Dump.PagesPlaced {
		return func() {}
	}
	refs, err := memfile.ReferencedFiles(m.CheckpointDir)
	if err != nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		end := trace.Step(ctx, "free the memory files' zero pages")
		defer end()
		for _, name := range refs {
			if strings.HasPrefix(name, m.ID+"-") {
				_, _ = memfile.PunchZeroPages(ctx, filepath.Join(m.FamilyDir, name))
			}
		}
	}()
	return func() { <-done }
}

// working counts this process's forks, dumps and restores in progress (busy):
// collapseLater waits while any runs.
var working atomic.Int64

// busy marks a fork, dump or restore in progress until the returned function is called.
func busy() func() {
	working.Add(1)
	return func() { working.Add(-1) }
}

// waitIdle returns once no fork, dump or restore runs in this process.
func waitIdle() {
	for working.Load() > 0 {
		time.Sleep(10 * time.Millisecond)
	}
}

// collapseLater makes, in the background, huge pages of the dense stretches that m's
// preallocation left in small pages because fresh huge pages came slowly
// (stage.DumpStats.PreallocHugeSlow: on this VM each waits on the host, 10-20 ms), once
// the source runs on them: forks made after map them without page tables (~0.4 MB less
// each for a working 256 MiB heap), and no pause or fork waits for the 1-3 s it takes.
// It works only while no fork, dump or restore runs in this process (a huge page that
// waits on the host holds a CPU the guest cannot give to anything else, and a collapse
// locks the stretch against the forks' faults: done beside the forks, it doubled their
// restore time), one stretch at a time, on a thread at SCHED_IDLE. Best effort: a process
// that exits first (the porcelain without a daemon) leaves the rest small.
func collapseLater(m *stage.Snapshot) {
	if !m.Dump.PreallocHugeSlow {
		return
	}
	refs, err := memfile.ReferencedFiles(m.CheckpointDir) // read now: the snapshot goes soon
	if err != nil {
		return
	}
	files := ownFiles(m, refs)
	go func() {
		// Never unlocked: the thread ends with this goroutine, its policy with it.
		runtime.LockOSThread()
		_ = unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0)
		for _, f := range files {
			_, _ = memfile.CollapseDense(context.Background(), f, waitIdle)
		}
	}()
}

// ownFiles keeps, of the memory files m's checkpoint refers to, m's own ones (named by its
// id), as paths inside its family directory: a name from another snapshot, with a slash or
// "..", is left out.
func ownFiles(m *stage.Snapshot, refs []string) []string {
	var files []string
	for _, name := range refs {
		if strings.HasPrefix(name, m.ID+"-") && filepath.Base(name) == name {
			files = append(files, filepath.Join(m.FamilyDir, name))
		}
	}
	return files
}
