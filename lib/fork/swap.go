package fork

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/overlay"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// SwapRestoreTimeout bounds the restore of a swap, during which the source is frozen.
var SwapRestoreTimeout = 30 * time.Second

// Swap moves a source that Dump left frozen (DumpOptions.Swap) onto its snapshot: it
// restores the source from s in place (same id, name, hostname, hook, limits; new host
// pids, a new cgroup and an empty upper over the snapshot's layer, which is its old upper
// with the same inodes), checks that it runs, and only then ends the old, frozen
// processes. On any failure before that point the old source is thawed where it was, with
// its upper back in place: nothing is lost. Later dumps of the source capture only what
// it changes on top of the family's memory files.
// svc, when alive, serves the restore (a criu service started before the freeze: no
// criu to start while the source is paused); nil runs a criu of its own.
func Swap(ctx context.Context, rt *container.Runtime, c *store.Container, s *stage.Snapshot, svc *criu.Service) error {
	endOld, err := swap(ctx, rt, c, s, svc, nil)
	if err == nil {
		endOld()
	}
	return err
}

// swap is Swap with the new source's cgroup and criu worker made before the freeze
// (swapReady), when pre is not nil: it owns them from here on. Once the new source runs
// it returns, and the old processes end in the background: endOld waits for that.
func swap(ctx context.Context, rt *container.Runtime, c *store.Container, s *stage.Snapshot, svc *criu.Service, pre *prepared) (endOld func(), retErr error) {
	if pre != nil {
		p := pre
		defer func() {
			p.worker.Close()    // unless the restore took it
			if p.netns != nil { // nor its namespace
				p.netns.Release()
				p.netns = nil
			}
		}()
	}
	if svc != nil && !svc.Alive() {
		svc = nil
	}
	if pre != nil && svc == nil {
		// Its worker is the dead service's: the restore makes its own group and criu.
		pre.end()
		pre = nil
	}
	var oldCg *cgroup.Cgroup
	err := fmt.Errorf("snapshot %s did not leave the source frozen for a swap", s.ID)
	if s.Swap {
		oldCg, err = cgroup.LoadOwned(c.Cgroup)
	}
	if err != nil {
		pre.end()
		return nil, fmt.Errorf("swap %s: %w", c.Display(), err)
	}
	old := *c
	if pre != nil {
		// The record names the new group from here on: undo removes it as one the
		// restore made.
		c.Cgroup, c.CgroupV2 = pre.cg.Paths, pre.cg.V2
	}
	// The new source gets its own root and work directories: the old overlay still holds
	// its own (it is the frozen processes' root) until they end.
	dir := filepath.Dir(c.RootFS)
	newRoot, newWork := filepath.Join(dir, "rootfs-"+s.ID), filepath.Join(dir, "work-"+s.ID)
	undone := false
	undo := func() error {
		var errs []error
		if cg, err := cgroup.LoadOwned(c.Cgroup); err == nil && !maps.Equal(c.Cgroup, old.Cgroup) {
			errs = append(errs, cg.Kill(), cg.Remove())
		}
		if fsutil.IsMountPoint(newRoot) {
			errs = append(errs, unix.Unmount(newRoot, unix.MNT_DETACH))
		}
		errs = append(errs, fsutil.RemoveAll(newRoot), fsutil.RemoveAll(newWork))
		*c = old
		_ = fsutil.RemoveAll(c.Upper) // the new, empty upper
		// Bridge mode: the new source's namespace took the veth (same name, same
		// address); the old namespace gets one again.
		errs = append(errs, container.AttachNetwork(c.Pid, c, ""))
		errs = append(errs, os.Rename(s.Layer, c.Upper), oldCg.Thaw(), rt.Containers.Put(c))
		undone = true
		return errors.Join(errs...)
	}
	defer func() {
		if retErr != nil && !undone {
			if err := undo(); err != nil {
				retErr = fmt.Errorf("%w; undoing the swap: %v", retErr, err)
			} else {
				retErr = fmt.Errorf("%w (the source goes on as it was)", retErr)
			}
		}
	}()

	if err := checkRestorable(s); err != nil {
		return nil, err
	}
	if err := makeDumpedFamily(s); err != nil {
		return nil, err
	}
	// Held by the restore's criu too: GC waits for a criu whose caller was killed.
	unlock, hold, err := lockSharedHeld(ctx)
	if err != nil {
		return nil, fmt.Errorf("swap %s: %w", c.Display(), err)
	}
	keepLock := false
	defer func() {
		if !keepLock {
			unlock()
		}
	}()
	c.Lower, c.RootFS, c.Work = s.Lower, newRoot, newWork
	c.Family, c.MemDir = s.Family, s.FamilyDir
	// The old source is frozen until this restore ends: it gets SwapRestoreTimeout, not
	// the minute a fork's restore may take (a caller killed meanwhile would leave the source
	// frozen until GC), and a criu that logged an error is killed sooner (criu.ErrorGrace).
	rctx, cancel := context.WithTimeout(ctx, SwapRestoreTimeout)
	err = startIn(rctx, rt, c, s, c.Upper, c.ID+"-"+s.ID, svc, pre, hold, false, "", nil)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("swap %s: %w", c.Display(), err)
	}
	// Running, not just restored: the new init is alive a moment later.
	endAlive := trace.Step(ctx, "swap: check the new source runs")
	time.Sleep(10 * time.Millisecond)
	endAlive()
	if !container.Alive(c) {
		return nil, fmt.Errorf("swap %s: the restored source (pid %d) exited at once", c.Display(), c.Pid)
	}
	// The record names the new source before the old one goes: a crash from here on
	// leaves the new source running and the old frozen group for GC.
	endPut := trace.Step(ctx, "swap: write the record")
	err = rt.Containers.Put(c)
	endPut()
	if err != nil {
		return nil, fmt.Errorf("swap %s: %w", c.Display(), err)
	}
	// The old processes end in the background (killing a frozen heap, freeing its memory
	// and unmounting its root took 100-370 ms here): the caller restores its forks
	// meanwhile and waits (endOld) before it removes the snapshot, which until then lets
	// GC finish this should the caller die (recoverSwap). The state lock is held until
	// then, as during the swap.
	keepLock = true
	ended := make(chan struct{})
	display := c.Display()
	go func() {
		defer close(ended)
		defer unlock()
		var errs []error
		endKill := trace.Step(ctx, "swap: kill the old processes")
		// A dying process frees its memory itself (its whole heap here): at the lowest
		// priority, beside the forks' restore, which wants the CPUs.
		if pids, err := oldCg.Procs(); err == nil {
			for _, pid := range pids {
				_ = unix.Setpriority(unix.PRIO_PROCESS, pid, 19)
			}
		}
		err := oldCg.Kill()
		if err != nil {
			// Still dying after the kill's wait: at nice 19 on a loaded host (a TCG guest,
			// a heap of 30,000 mappings) exit can starve. The rest end at normal priority.
			if pids, perr := oldCg.Procs(); perr == nil {
				for _, pid := range pids {
					_ = unix.Setpriority(unix.PRIO_PROCESS, pid, 0)
				}
			}
			err = oldCg.Kill()
		}
		errs = append(errs, err)
		endKill()
		endRm := trace.Step(ctx, "swap: remove the old cgroup")
		errs = append(errs, oldCg.Remove())
		endRm()
		endUm := trace.Step(ctx, "swap: unmount the old root, remove its work dir")
		errs = append(errs, unix.Unmount(old.RootFS, unix.MNT_DETACH))
		errs = append(errs, fsutil.RemoveAll(old.Work), os.Remove(old.RootFS))
		endUm()
		if err := errors.Join(errs...); err != nil {
			// The new source runs; what is left of the old one is GC's.
			fmt.Fprintf(os.Stderr, "lazyfork: swap %s: cleaning up the old processes: %v\n", display, err)
		}
	}()
	return func() { <-ended }, nil
}

// undoSwapDump thaws a source that a swap dump left frozen and puts its upper back, when
// the swap cannot go on (the rewrite failed).
func undoSwapDump(c *store.Container, s *stage.Snapshot) error {
	var errs []error
	if _, err := os.Stat(s.Layer); err == nil {
		errs = append(errs, os.Rename(s.Layer, c.Upper))
	}
	if cg, err := cgroup.LoadOwned(c.Cgroup); err == nil {
		errs = append(errs, cg.Thaw())
	}
	return errors.Join(errs...)
}

// recoverSwap finishes what a swap left when the process running it died (GC calls it for
// a swap snapshot whose owner is gone). If the record still names the old processes, the
// swap never committed: any new source is ended and the old one gets its upper back and is
// thawed. If the record names the new source, the old, frozen processes and their root
// are ended. Either way exactly one source runs afterwards.
func recoverSwap(rt *container.Runtime, c *store.Container, s *stage.Snapshot) error {
	dir := rt.Containers.Path(c.ID)
	newRoot, newWork := filepath.Join(dir, "rootfs-"+s.ID), filepath.Join(dir, "work-"+s.ID)
	newCgName, oldCgName := c.ID+"-"+s.ID, c.ID
	var errs []error
	parent := groupParent(rt, c)
	endGroup := func(name string) { errs = append(errs, endGroupNamed(parent, name)) }
	if c.RootFS != newRoot { // not committed: the old processes stay
		endGroup(newCgName)
		if fsutil.IsMountPoint(newRoot) {
			errs = append(errs, unix.Unmount(newRoot, unix.MNT_DETACH))
		}
		errs = append(errs, fsutil.RemoveAll(newRoot), fsutil.RemoveAll(newWork))
		if _, err := os.Stat(s.Layer); err == nil {
			// The upper was moved; whatever stands in its place is the new source's, empty.
			errs = append(errs, fsutil.RemoveAll(c.Upper), os.Rename(s.Layer, c.Upper))
		}
		if container.Alive(c) {
			errs = append(errs, container.AttachNetwork(c.Pid, c, "")) // see Swap's undo
		}
		if cg, err := cgroup.LoadOwned(c.Cgroup); err == nil {
			errs = append(errs, cg.Thaw())
		}
	} else { // committed: the old processes go
		if cg, err := cgroup.Resolve(oldCgName, parent); err == nil && !maps.Equal(cg.Paths, c.Cgroup) {
			endGroup(oldCgName)
		}
		old := overlay.Dir(dir, nil)
		if old.Target != c.RootFS && fsutil.IsMountPoint(old.Target) {
			errs = append(errs, unix.Unmount(old.Target, unix.MNT_DETACH))
		}
		if old.Work != c.Work {
			errs = append(errs, fsutil.RemoveAll(old.Work))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("recover the swap of %s: %w", c.Display(), err)
	}
	return nil
}

// groupParent is where c's groups are: beside the group its record names (a tree
// member's, old and new, are inside the tree's cgroup, not under the runtime's parent,
// and a gc may run in another cgroup than the command that made them).
func groupParent(rt *container.Runtime, c *store.Container) string {
	if len(c.Cgroup) > 0 {
		return cgroup.ParentOf(c.Cgroup)
	}
	return rt.CgroupParent
}

// endGroupNamed kills and removes the project's cgroup called name under parent, if it
// exists.
func endGroupNamed(parent, name string) error {
	r, err := cgroup.Resolve(name, parent)
	if err != nil {
		return nil
	}
	if cgroup.CheckOwned(r.Paths) != nil {
		return nil // not the project's
	}
	cg, err := cgroup.LoadOwned(r.Paths)
	if err != nil {
		// Not in every hierarchy: a creation cut short, before any process went in.
		return r.Remove()
	}
	return errors.Join(cg.Kill(), cg.Remove())
}
