package fork

import (
	"context"
	"runtime"
	"sync"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// early is what a repeat fork makes ready while its source is dumped: the forks' records,
// their cgroups, a criu service worker for each, moved into its groups once the dump is
// done, and a network namespace for each confined --net none fork. Those wait more than
// they compute (the records' fsyncs; each worker's move an RCU grace period, 8-15 ms
// here): beside the dump (~40 ms, criu's) and the rewrite they are off the fork's path.
// Restore takes them over (RestoreOptions.early); abort undoes them when the fork ends
// before. The caller calls dumped once Dump returns, whatever it returned.
type early struct {
	thawed  chan struct{} // closed once the dump has returned: the source runs again
	thawOne sync.Once
	done    chan struct{}
	err     error
	forks   []*store.Container
	ready   map[string]*prepared // by record id
	workers []*criu.Worker
}

// prepared is a fork's cgroup and service worker, made before its restore, and the
// network namespace with loopback up that a confined --net none fork joins (startIn).
type prepared struct {
	cg     *cgroup.Cgroup
	worker *criu.Worker
	netns  *network.NetNS // nil once startIn took it
}

// earlyFits reports whether a fork of c with o gets its forks ready during the dump: a
// repeat fork (the source maps its family already; the rewrite is short, so the dump is
// what the fork waits for) or a first one that swaps the source (its dump's preallocation
// leaves time before the freeze), of a few forks, with a criu service; not a cluster's,
// and not bridge mode (addresses are handed out with the snapshot's subnet).
func earlyFits(c *store.Container, o Options, swap bool) bool {
	return (c.Family != "" || swap) && !o.Copy && !o.Share && c.Cluster == "" && c.Net != container.NetBridge &&
		!o.PerForkCriu && o.NetNS == "" && o.Service != nil && o.Service.Alive() &&
		o.N >= 1 && o.N <= runtime.NumCPU()
}

// startEarly starts making c's forks ready; their records hold what the snapshot will copy
// of c (Dump takes it from the record), and Restore fills them again from the snapshot.
func startEarly(ctx context.Context, rt *container.Runtime, c *store.Container, o Options) *early {
	e := &early{thawed: make(chan struct{}), done: make(chan struct{}), ready: map[string]*prepared{}}
	go func() {
		defer close(e.done)
		e.err = e.prepare(ctx, rt, c, o)
	}()
	return e
}

func (e *early) prepare(ctx context.Context, rt *container.Runtime, c *store.Container, o Options) error {
	endReserve := trace.Step(ctx, "early: reserve the records")
	forks, err := rt.ReserveN(o.N, o.Names, func(f *store.Container) error {
		f.Image, f.Command, f.Env, f.WorkingDir, f.Hook = c.Image, c.Command, c.Env, c.WorkingDir, c.Hook
		f.Confine, f.Memory, f.PidsLimit, f.Net = c.Confine, c.Memory, c.PidsLimit, c.Net
		f.Parent, f.Depth = c.ID, c.Depth+1
		f.Family = c.Family
		return nil
	})
	endReserve()
	if err != nil {
		return err
	}
	e.forks = forks
	for _, f := range forks {
		endCg := trace.Step(ctx, "early: make the cgroup, set its limits")
		cg, err := cgroup.Create(f.ID, rt.CgroupParent)
		if err != nil {
			endCg()
			return err
		}
		f.Cgroup, f.CgroupV2 = cg.Paths, cg.V2
		err = cg.SetLimits(container.Limits(f))
		endCg()
		if err != nil {
			return err
		}
		// Guessed before the checkpoint exists: flat cgroups, as a container's almost always
		// are (criu.ServiceCgroupsFor); criu.Restore replaces a worker that guessed wrong.
		// Moved once criu's dump has returned (the source is thawed): a move holds
		// cgroup_mutex and the threadgroup rwsem that fork waits for through an RCU grace
		// period, and beside the frozen source's dump it lengthened the pause
		// (bench/README.md, repeat path). Not at post-dump either: the source is still
		// frozen there, and on v2 criu thaws it by writing cgroup.freeze under
		// cgroup_mutex. After the dump the move overlaps the rewrite.
		w := o.Service.PrepareWorker(ctx, criu.ServiceCgroups{Join: cg.AllProcsFiles(), Ignore: true, After: e.thawed})
		e.workers = append(e.workers, w)
		e.ready[f.ID] = &prepared{cg: cg, worker: w}
	}
	// What Dump's choice of namespace means for the checkpoint: it holds none, and the
	// restore joins a new one (startIn checks the checkpoint). Not beside the frozen
	// source's dump either.
	if c.Net != container.NetNone || c.Confine == nil || c.Confine.Privileged {
		return nil
	}
	select {
	case <-e.thawed:
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, f := range forks {
		endNS := trace.Step(ctx, "early: new network namespace")
		ns, err := network.NewNetNS()
		endNS()
		if err != nil {
			return err
		}
		e.ready[f.ID].netns = ns
	}
	return nil
}

// waitReady returns once the forks are ready: records, groups, namespaces, and the
// workers in their groups (a swap's dump waits for it before the freeze; see dumped).
func (e *early) waitReady() {
	<-e.done
	for _, w := range e.workers {
		w.Wait()
	}
}

// dumped tells the workers that criu's dump has returned (the source is thawed).
func (e *early) dumped() { e.thawOne.Do(func() { close(e.thawed) }) }

// closeWorkers ends the workers no restore took (a no-op for those that served one).
func (e *early) closeWorkers() {
	<-e.done
	for _, w := range e.workers {
		w.Close()
	}
	for _, p := range e.ready {
		if p.netns != nil {
			p.netns.Release()
			p.netns = nil
		}
	}
}

// abort undoes what was made ready: the fork ended before its restore.
func (e *early) abort(rt *container.Runtime) {
	e.closeWorkers()
	for _, f := range e.forks {
		_ = rt.Delete(f)
	}
}
