package fork

import (
	"context"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// swapReady is the new source's cgroup and criu service worker, made while the source
// still runs (beside the preallocation and the hook's quiesce) instead of while it is
// frozen for the swap's restore: the group's creation and the worker's start and move
// into it (an RCU grace period on v1) were ~20 ms of the first fork's pause. Dump starts
// it once the snapshot record exists and waits for it before the freeze; Swap takes it
// over. The group has the name Swap's restore would give it (recoverSwap's), so GC ends
// it like one that restore made.
type swapReady struct {
	svc  *criu.Service
	done chan struct{}
	pre  *prepared
	also []func() // more to wait for before the freeze (alsoWait)
}

// alsoWait makes wait (before the freeze) call wait too: the forks' readiness (early),
// whose cgroup moves would otherwise run beside the frozen dump.
func (r *swapReady) alsoWait(wait func()) {
	if r != nil {
		r.also = append(r.also, wait)
	}
}

// newSwapReady returns a swapReady for a swap's restore served by svc, or nil (no
// service: the restore makes its own group and criu).
func newSwapReady(svc *criu.Service) *swapReady {
	if svc == nil || !svc.Alive() {
		return nil
	}
	return &swapReady{svc: svc}
}

// start makes the group and the worker for c's restore from s in the background.
func (r *swapReady) start(ctx context.Context, rt *container.Runtime, c *store.Container, s *stage.Snapshot) {
	if r == nil || r.done != nil {
		return
	}
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		end := trace.Step(ctx, "swap: make the new source's cgroup and criu worker")
		defer end()
		cg, err := cgroup.Create(c.ID+"-"+s.ID, rt.CgroupParent)
		if err != nil {
			return // the restore makes it and reports what fails
		}
		if err := cg.SetLimits(container.Limits(c)); err != nil {
			_ = cg.Remove()
			return
		}
		// Flat groups, guessed before the checkpoint exists (see early.prepare).
		w := r.svc.PrepareWorker(ctx, criu.ServiceCgroups{Join: cg.AllProcsFiles(), Ignore: true})
		p := &prepared{cg: cg, worker: w}
		// Dumped from inside its namespace, the new source gets a fresh one (startIn).
		if dumpsInOwnNetNS(c) {
			endNS := trace.Step(ctx, "swap: new network namespace")
			if ns, err := network.NewNetNS(); err == nil {
				p.netns = ns
			}
			endNS()
		}
		w.Wait()
		r.pre = p
	}()
}

// wait returns once start's work, and what alsoWait added, has ended.
func (r *swapReady) wait() {
	if r == nil {
		return
	}
	if r.done != nil {
		<-r.done
	}
	for _, w := range r.also {
		w()
	}
}

// take hands what was made to the restore (nil if nothing was: it makes its own).
func (r *swapReady) take() *prepared {
	if r == nil {
		return nil
	}
	r.wait()
	p := r.pre
	r.pre = nil
	return p
}

// abort undoes what was made and not taken: the swap does not happen.
func (r *swapReady) abort() {
	r.take().end()
}

// end undoes a swap's prepared group, worker and namespace that no restore took.
func (p *prepared) end() {
	if p == nil {
		return
	}
	p.worker.Close()
	_ = p.cg.Kill()
	_ = p.cg.Remove()
	if p.netns != nil {
		p.netns.Release()
		p.netns = nil
	}
}
