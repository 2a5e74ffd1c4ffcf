package fork

import (
	"context"
	"fmt"
	"sync"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// pipeline makes a batch's forks ready (cgroup, limits, a service worker moved into the
// group, the network namespace a --net none fork joins) ahead of their restores, in
// order, at most ahead of them waiting. In the restore's path the move of the worker
// waited for an RCU grace period (cgroup v1 and v2 attach take cgroup_threadgroup_rwsem
// for writing, whose rcu_sync waits for one unless another writer was just there): made
// ahead, the wait overlaps other forks' restores, and moves that follow each other
// closely share one grace period. bench/offcpu.py shows where a restore waits.
type pipeline struct {
	items  []chan pipeItem
	tokens chan struct{}
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	made  []*prepared // every one made, taken or not: close ends those not taken
	taken map[*prepared]bool
}

type pipeItem struct {
	p   *prepared
	err error
}

// startPipeline starts making forks[i] ready, one after the other; take(i) returns each.
func startPipeline(ctx context.Context, rt *container.Runtime, s *stage.Snapshot, svc *criu.Service, forks []*store.Container, ahead int) *pipeline {
	ctx, cancel := context.WithCancel(ctx)
	pl := &pipeline{items: make([]chan pipeItem, len(forks)), tokens: make(chan struct{}, ahead), cancel: cancel,
		done: make(chan struct{}), taken: map[*prepared]bool{}}
	for i := range pl.items {
		pl.items[i] = make(chan pipeItem, 1)
	}
	// Decided by what the checkpoint holds, as startIn decides it.
	netns := s.Net == container.NetNone && !criu.CheckpointHasNetNS(s.CheckpointDir)
	go func() {
		defer close(pl.done)
		for i, c := range forks {
			select {
			case pl.tokens <- struct{}{}:
			case <-ctx.Done():
				pl.items[i] <- pipeItem{err: ctx.Err()}
				continue
			}
			p, err := pl.prepare(ctx, rt, s, svc, c, netns)
			pl.items[i] <- pipeItem{p: p, err: err}
		}
	}()
	return pl
}

func (pl *pipeline) prepare(ctx context.Context, rt *container.Runtime, s *stage.Snapshot, svc *criu.Service, c *store.Container, netns bool) (*prepared, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	endCg := trace.Step(ctx, "ahead: make the cgroup, set its limits")
	cg, err := cgroup.Create(c.ID, rt.CgroupParent)
	if err != nil {
		endCg()
		return nil, fmt.Errorf("fork %s: %w", c.ID, err)
	}
	c.Cgroup, c.CgroupV2 = cg.Paths, cg.V2
	err = cg.SetLimits(container.Limits(c))
	endCg()
	if err != nil {
		return nil, fmt.Errorf("fork %s: %w", c.ID, err)
	}
	p := &prepared{cg: cg, worker: svc.PrepareWorker(ctx, criu.ServiceCgroupsFor(s.CheckpointDir, cg.ProcsFiles(), cg.AllProcsFiles()))}
	pl.mu.Lock()
	pl.made = append(pl.made, p)
	pl.mu.Unlock()
	if netns {
		endNS := trace.Step(ctx, "ahead: new network namespace")
		ns, err := network.NewNetNS()
		endNS()
		if err != nil {
			return nil, fmt.Errorf("fork %s: %w", c.ID, err)
		}
		pl.mu.Lock()
		p.netns = ns
		pl.mu.Unlock()
	}
	return p, nil
}

// take waits until forks[i] is ready and hands it over: its restore (startIn) closes the
// worker and releases the namespace.
func (pl *pipeline) take(ctx context.Context, i int) (*prepared, error) {
	select {
	case it := <-pl.items[i]:
		<-pl.tokens
		if it.err != nil {
			return nil, it.err
		}
		pl.mu.Lock()
		pl.taken[it.p] = true
		pl.mu.Unlock()
		return it.p, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// close stops making forks ready and ends what no restore took (workers out of their
// groups, namespaces released), so that the groups can be removed.
func (pl *pipeline) close() {
	pl.cancel()
	// Tokens of forks nobody takes any more: the goroutine may wait for one.
	go func() {
		for {
			select {
			case <-pl.tokens:
			case <-pl.done:
				return
			}
		}
	}()
	<-pl.done
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for _, p := range pl.made {
		if pl.taken[p] {
			continue
		}
		p.worker.Close()
		if p.netns != nil {
			p.netns.Release()
			p.netns = nil
		}
	}
}
