package fork

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/guard"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/overlay"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// Options for Fork: the union of the stages' options.
type Options struct {
	RestoreOptions
	Force bool
	// Share moves the source onto the snapshot too (it is dumped, ended and restored in
	// place from the memory files), so that the parent and its forks hold the heap once
	// instead of twice. Should its restore fail, it is left stopped (`lazyfork start`).
	// Superseded by the default swap (Copy false), which never loses the source.
	Share bool
	// Copy keeps the source running on its own memory and gives forks a copy of its files
	// (the behaviour before the swap became the default): every later fork dumps its whole
	// heap again, and forks see other inode numbers than the source.
	Copy bool
	// HugePages: nil keeps the defaults (a swap's preallocation makes the heap's dense
	// stretches huge pages while fresh ones come fast, memfile.HugePagesWhileFast; a
	// copy's rewrite does not: see memfile.Options.HugePages); true makes them huge pages
	// in both however slowly, false in neither.
	HugePages *bool
	// KSM marks the forks' memory mergeable (memfile.Options.KSM): opt-in per tree.
	KSM bool
}

// Fork runs the whole pipeline on a container: dump it (it keeps running), move the
// memory into files, restore N forks, drop the transient snapshot. A stopped container
// is forked straight from the snapshot it was stopped into.
func Fork(ctx context.Context, rt *container.Runtime, c *store.Container, o Options) ([]stage.Fork, *stage.Snapshot, error) {
	defer busy()()
	ctx, end := trace.Start(ctx, "fork "+c.Display())
	defer end()
	endChecks := trace.Step(ctx, "check the record, state and names")
	defer func() { endChecks() }() // once the checks are done (Dump's own are in its span)
	if err := stage.CheckRecord(c); err != nil {
		return nil, nil, fmt.Errorf("fork %s: %w", c.Display(), err)
	}
	if err := guard.Check(guard.OpFork, c, rt.State(c)); err != nil {
		return nil, nil, err
	}
	if c.State == store.StateStopped {
		s, err := LoadSnapshot(c.Snapshot)
		if err != nil {
			return nil, nil, fmt.Errorf("fork %s: %w", c.Display(), err)
		}
		forks, err := Restore(ctx, rt, s, o.RestoreOptions)
		return forks, s, err
	}
	// A MADV_MERGEABLE bit in the checkpoint fails CRIU's restore on a kernel without KSM.
	if err := needKSM(o.KSM, "fork "+c.Display(), "fork without ksm"); err != nil {
		return nil, nil, err
	}
	// Names are checked before the source is touched.
	for _, n := range o.Names {
		if err := store.ValidateName(n); err != nil {
			return nil, nil, err
		}
	}
	if err := rt.Containers.CheckNamesFree(o.Names); err != nil {
		return nil, nil, err
	}
	// The first fork of a container that runs on its own memory moves it onto the
	// snapshot (Swap): from then on it maps the family's memory files, so every later dump
	// holds only what it changed. Later forks leave it running (its upper keeps its inode
	// numbers; overlayfs would report new ones for files copied up after a second move).
	// A cluster member is never restored in place: that would take it out of the
	// cluster's namespace. Forked alone it is copied (its forks lose the other members).
	if c.Cluster != "" && o.Share {
		return nil, nil, fmt.Errorf("fork %s --share: it is a member of cluster %s, whose namespace it would leave; fork the cluster (`lazyfork cluster fork %s`) or fork it without --share", c.Display(), c.Cluster, c.Display())
	}
	swap := !o.Copy && !o.Share && c.Family == "" && c.Cluster == ""
	endChecks()
	endChecks = func() {}
	var ready *swapReady
	if swap && !o.PerForkCriu {
		// Started while the source runs: it serves the swap's restore (the source is paused
		// until that ends) and then the forks'.
		svc, stop := serviceForSwap(ctx, rt, o.Service)
		defer stop()
		o.Service = svc
		ready = newSwapReady(svc)
	}
	// A repeat fork, or a first one (the swap): its records, cgroups and criu workers are
	// made ready during the dump.
	var thawed func()
	if earlyFits(c, o, swap) {
		o.early = startEarly(ctx, rt, c, o)
		if swap {
			// A swap's source stays frozen after its dump, until its restore: its forks are
			// made ready before the freeze instead (the preallocation leaves the time), and
			// the dump waits for them.
			o.early.dumped()
			ready.alsoWait(o.early.waitReady)
		} else {
			thawed = o.early.dumped
		}
	}
	// Transient: GC drops the snapshot if this process dies.
	s, err := Dump(ctx, rt, c, DumpOptions{Force: o.Force, Exit: o.Share, Swap: swap, Hook: o.Hook, Transient: true,
		SmallPages: o.HugePages != nil && !*o.HugePages, HugePages: o.HugePages != nil && *o.HugePages, ready: ready, Thawed: thawed})
	if o.early != nil {
		o.early.dumped() // also when Dump failed before criu ran
	}
	if err != nil {
		if o.early != nil {
			o.early.abort(rt)
			o.early = nil
		}
		return nil, nil, err
	}
	if s.Swap {
		return forkSwapped(ctx, rt, c, s, o, ready)
	}
	keep := false
	defer func() {
		if !keep {
			defer trace.Step(ctx, "remove the snapshot")()
			_ = RemoveSnapshot(s)
		}
		collect(ctx, rt)
	}()
	endMemfile := trace.Step(ctx, "memfile: move the memory into the family's files")
	// The snapshot is removed once the forks run: nobody reads its shared-page count.
	m, err := Memfile(ctx, s, MemfileOptions{Force: o.Force, HugePages: o.HugePages != nil && *o.HugePages, KSM: o.KSM, SkipSharedCount: !o.Share})
	endMemfile()
	if o.Share {
		// The source is gone since the dump: bring it back first, from the memory files
		// if the rewrite worked, else from the plain checkpoint.
		if err == nil {
			s = m
		}
		s.Owner = 0 // until the source runs again, the snapshot is the source
		_ = Save(s)
		if serr := MarkStopped(rt, c, s); serr != nil {
			keep = true
			return nil, s, serr
		}
		if rerr := resume(ctx, rt, c, s); rerr != nil {
			keep = true // c stays stopped on s: `lazyfork start` retries
			return nil, s, fmt.Errorf("fork %s --share: %w (it is stopped; `lazyfork start %s` restarts it)", c.Display(), rerr, c.Display())
		}
		s.Owner = os.Getpid()
		_ = Save(s)
	}
	if err != nil {
		if o.early != nil {
			o.early.abort(rt)
		}
		return nil, nil, err
	}
	s = m
	forks, err := Restore(ctx, rt, s, o.RestoreOptions) // takes o.early over
	return forks, s, err
}

// Stop snapshots c and ends its processes. It keeps no process memory (its memory is in
// the family files), stays forkable, and Start brings it back from the snapshot.
func Stop(ctx context.Context, rt *container.Runtime, c *store.Container, h hook.Options) (*stage.Snapshot, error) {
	if c.Cluster != "" {
		// Started again, it would come back in a namespace of its own, out of the cluster.
		return nil, fmt.Errorf("stop %s: it is a member of cluster %s; stopping one member is not supported (delete it, or fork the cluster)", c.Display(), c.Cluster)
	}
	if err := guard.Check(guard.OpStop, c, rt.State(c)); err != nil {
		return nil, err
	}
	s, err := Dump(ctx, rt, c, DumpOptions{Exit: true, Hook: h})
	if err != nil {
		return nil, err
	}
	// The processes are gone now: from here on the snapshot is the container.
	if m, err := Memfile(ctx, s, MemfileOptions{}); err == nil {
		s = m
	} // else the plain checkpoint still restores; Start copes with both
	if err := MarkStopped(rt, c, s); err != nil {
		return s, err
	}
	return s, nil
}

// MarkStopped records that c was dumped with its processes ended: its cgroup goes, its
// root is unmounted (the upper stays), and the snapshot becomes what it restarts from.
func MarkStopped(rt *container.Runtime, c *store.Container, s *stage.Snapshot) error {
	var errs []error
	if cg, err := cgroup.LoadOwned(c.Cgroup); err == nil {
		errs = append(errs, cg.Kill(), cg.Remove())
	}
	errs = append(errs, overlay.Unmount(c.RootFS))
	// Its namespace goes with its processes, the veth with it, but asynchronously: gone
	// now, and its address stays in the record for Start.
	errs = append(errs, network.Detach(c.ID))
	c.State, c.Snapshot, c.Pid, c.StartTime = store.StateStopped, s.ID, 0, 0
	errs = append(errs, rt.Containers.Put(c))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop %s: %w", c.Display(), err)
	}
	return nil
}

// Start restores a stopped container from its snapshot, in place: same id, name and
// upper layer.
func Start(ctx context.Context, rt *container.Runtime, c *store.Container) error {
	if err := guard.Check(guard.OpStart, c, rt.State(c)); err != nil {
		return err
	}
	if err := stage.CheckRecord(c); err != nil {
		return fmt.Errorf("start %s: %w", c.Display(), err)
	}
	s, err := LoadSnapshot(c.Snapshot)
	if err != nil {
		return fmt.Errorf("start %s: %w", c.Display(), err)
	}
	if s.SharedNetNS && c.Cluster != "" {
		return startWithCluster(ctx, rt, c)
	}
	if err := resume(ctx, rt, c, s); err != nil {
		return err
	}
	_ = RemoveSnapshot(s)
	return Collect(rt)
}

// startWithCluster starts the cluster c was stopped with (StopCluster: a dropped tree's
// cluster node) as one: c's own lock is the caller's, the other members' are taken here.
// c is updated from its record.
func startWithCluster(ctx context.Context, rt *container.Runtime, c *store.Container) error {
	members, err := rt.Members(c)
	if err != nil {
		return fmt.Errorf("start %s: %w", c.Display(), err)
	}
	for _, m := range members {
		if m.ID == c.ID {
			continue
		}
		_, unlock, err := guard.Lock(ctx, rt.Containers, m.ID, 0)
		if err != nil {
			return fmt.Errorf("start %s: its cluster's member %s: %w", c.Display(), m.Display(), err)
		}
		defer unlock()
	}
	if err := StartCluster(ctx, rt, members[0]); err != nil {
		return err
	}
	fresh, err := rt.Containers.Get(c.ID)
	if err != nil {
		return err
	}
	*c = *fresh
	return nil
}

// resume restores stopped c from s in place. On failure c is stopped as before.
func resume(ctx context.Context, rt *container.Runtime, c *store.Container, s *stage.Snapshot) (retErr error) {
	if s.SharedNetNS {
		return fmt.Errorf("start %s: it was stopped with its cluster %s, whose namespace its snapshot does not hold: start it with its cluster", c.Display(), c.Cluster)
	}
	return resumeIn(ctx, rt, c, s, "")
}

// resumeIn is resume into the network namespace at netns (a cluster member's; "" for a
// namespace of its own).
func resumeIn(ctx context.Context, rt *container.Runtime, c *store.Container, s *stage.Snapshot, netns string) (retErr error) {
	if err := checkRestorable(s); err != nil {
		return err
	}
	if err := makeDumpedFamily(s); err != nil {
		return err
	}
	saved := *c
	defer func() {
		if retErr != nil {
			if cg, err := cgroup.LoadOwned(c.Cgroup); err == nil {
				_ = cg.Kill()
				_ = cg.Remove()
			}
			_ = overlay.Unmount(c.RootFS)
			*c = saved
		}
	}()
	c.Family, c.MemDir = s.Family, s.FamilyDir
	if err := startIn(ctx, rt, c, s, c.Upper, c.ID, nil, nil, nil, true, netns, nil); err != nil {
		return fmt.Errorf("start %s: %w", c.Display(), err)
	}
	c.Snapshot = ""
	return rt.Containers.Put(c)
}

// serviceForSwap returns a criu service for a swap's restore: have if alive,
// else one started now (stop closes it), or nil (a swrk criu restores it then).
func serviceForSwap(ctx context.Context, rt *container.Runtime, have *criu.Service) (*criu.Service, func()) {
	if have != nil && have.Alive() {
		return have, func() {}
	}
	svc, err := criu.StartService(ctx, kdatDir(), rt.CRIU)
	if err != nil {
		return nil, func() {}
	}
	return svc, func() { svc.Close() }
}

// forkSwapped finishes a fork whose dump left the source frozen (DumpOptions.Swap): the
// rewrite, the source moved onto the snapshot (Swap), then the forks. The source is never
// lost: until Swap has a new source running, any failure thaws the old one as it was.
func forkSwapped(ctx context.Context, rt *container.Runtime, c *store.Container, s *stage.Snapshot, o Options, ready *swapReady) ([]stage.Fork, *stage.Snapshot, error) {
	// The forks made ready during the dump go unless Restore takes them.
	keepEarly := false
	defer func() {
		if o.early != nil && !keepEarly {
			o.early.abort(rt)
		}
	}()
	m, err := Memfile(ctx, s, MemfileOptions{Force: o.Force, HugePages: o.HugePages != nil && *o.HugePages, KSM: o.KSM})
	if err != nil {
		ready.abort()
		err = errors.Join(err, undoSwapDump(c, s))
		_ = RemoveSnapshot(s)
		_ = Collect(rt)
		return nil, nil, err
	}
	swapStart := time.Now()
	endOld, err := swap(ctx, rt, c, m, o.Service, ready.take())
	if err != nil {
		_ = RemoveSnapshot(m)
		_ = Collect(rt)
		return nil, nil, err
	}
	m.SwapMs = stage.Ms(time.Since(swapStart))
	// The source maps the snapshot's family now; the snapshot stays while forks are made
	// and goes once nothing needs it (GC counts the source's lower layers and family).
	m.Owner = os.Getpid()
	_ = Save(m)
	defer func() {
		// The old processes end beside the forks' restore; the snapshot, which lets GC
		// finish that should this process die, goes after.
		endWait := trace.Step(ctx, "swap: wait for the old processes' end")
		endOld()
		endWait()
		endRm := trace.Step(ctx, "remove the snapshot")
		_ = RemoveSnapshot(m)
		endRm()
		collect(ctx, rt)
	}()
	defer sweepZeroPages(ctx, m)() // beside the forks' restore, after the pause
	collapseLater(m)
	if o.N == 0 {
		return nil, m, nil
	}
	keepEarly = true
	forks, err := Restore(ctx, rt, m, o.RestoreOptions) // takes o.early over
	return forks, m, err
}
