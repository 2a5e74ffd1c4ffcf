package snaptree

import (
	"context"
	"fmt"
	"time"

	"github.com/lazyfork/lazyfork/lib/budget"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
)

// ForkOptions tune a fork batch.
type ForkOptions struct {
	N      int
	Names  []string // optional container names, one per fork
	Labels []string // optional node labels, one per fork
}

// Fork makes o.N forks of node (a batch shares one dump) and returns their nodes. A live
// node without a keyframe gets one first (its first fork moves it onto its snapshot); a
// suspended node's forks are restored straight from its packed snapshot, and it stays
// suspended. The budget is checked first: least-recently-active unprotected nodes are
// suspended to make room, and a batch that cannot fit fails, changing nothing.
func (m *Manager) Fork(ctx context.Context, treeRef, node string, o ForkOptions) ([]*Node, *Tree, error) {
	var out []*Node
	t, err := m.with(ctx, treeRef, func(op *op) error {
		var err error
		out, err = op.fork(node, o)
		return err
	})
	return out, t, err
}

func (o *op) fork(ref string, fo ForkOptions) ([]*Node, error) {
	if fo.N <= 0 {
		return nil, badRequest("fork: -n must be at least 1")
	}
	if len(fo.Labels) > fo.N {
		return nil, badRequest("fork: %d labels for %d forks: give at most one label per fork", len(fo.Labels), fo.N)
	}
	n, c, err := o.node(ref)
	if err != nil {
		return nil, err
	}
	if n.State == StateExited {
		return nil, invalidState("fork %s: its processes are gone (killed or power cut) and it was not suspended; prune it", n.ID)
	}
	if err := o.makeRoom(n.ID, fo.N, o.estimate(n)); err != nil {
		return nil, err
	}
	if n.Kind == NodeKindCluster {
		return o.forkCluster(n, c, fo)
	}
	var forks []stage.Fork
	var dirty int64
	ro := fork.RestoreOptions{N: fo.N, Names: fo.Names}
	switch {
	case n.State == StateSuspended:
		p := n.PackedRole(RoleSuspend)
		if p == nil {
			return nil, fmt.Errorf("fork %s: suspended with no packed snapshot in tree.json", n.ID)
		}
		s, err := unpack(o.ctx, o.t, *p)
		if err != nil {
			return nil, err
		}
		forks, err = fork.Restore(o.ctx, o.trt, s, ro)
		// The packed copy stays on disk; the tmpfs copy is not needed after the restore.
		_ = fork.RemoveSnapshot(s)
		if err != nil {
			return nil, err
		}
		dirty = int64(s.Dump.PagesWritten)
		// Its forks map that snapshot's memory files: it is the node's keyframe now.
		if n.Keyframe != s.ID {
			n.HasKeyframe, n.Keyframe = true, s.ID
			n.Generation++
		}
	case !n.HasKeyframe:
		k, err := fork.Prepare(o.ctx, o.trt, c, fork.PrepareOptions{KSM: o.t.KSM})
		if err != nil {
			return nil, err
		}
		setKeyframe(n, k)
		o.event("prepare", n.ID)
		if forks, err = fork.Restore(o.ctx, o.trt, k, ro); err != nil {
			return nil, err
		}
	default:
		var s *stage.Snapshot
		forks, s, err = fork.Fork(o.ctx, o.trt, c, fork.Options{RestoreOptions: ro, KSM: o.t.KSM})
		if err != nil {
			return nil, err
		}
		if s != nil {
			dirty = int64(s.Dump.PagesWritten)
		}
	}
	kids := make([]*Node, len(forks))
	for i, f := range forks {
		kids[i] = &Node{ID: f.ID, Name: f.Name, Kind: NodeKind, Members: 1}
	}
	return o.addForks(n, kids, dirty, fo.Labels)
}

// addForks records a fork batch's new nodes as live children of n (labels in order),
// announces them, and evicts what the budget then asks for.
func (o *op) addForks(n *Node, kids []*Node, dirty int64, labels []string) ([]*Node, error) {
	now := time.Now().UTC()
	n.LastActive = now
	ids := make([]string, len(kids))
	for i, k := range kids {
		k.Parent, k.State, k.DirtyPages, k.Created, k.LastActive = n.ID, StateLive, dirty, now, now
		if i < len(labels) {
			k.Label = labels[i]
		}
		o.t.Nodes[k.ID] = k
		ids[i] = k.ID
	}
	o.event("fork", n.ID, ids...)
	refresh(o.t, o.m.RT)
	return kids, o.autoEvict()
}

// estimate is the RAM a fork of n is expected to take: n's own charge (a fork starts
// with none of n's private pages, so this is the bound once it has dirtied as much).
func (o *op) estimate(n *Node) int64 {
	return max(n.RAMBytes, 1)
}

// makeRoom executes lib/budget's plan for adding n forks of parent: the nodes it names
// are suspended first. An OverBudgetError is returned as it is, before anything changed.
func (o *op) makeRoom(parent string, n int, ramEach int64) error {
	plan, err := budgetTree(o.t).PlanAdd(parent, n, ramEach, 0)
	if err != nil {
		return overBudget(err)
	}
	return o.execute(plan, "evict")
}

func (o *op) execute(plan budget.Plan, kind string) error {
	var done []string
	for _, id := range plan.Suspend {
		if err := o.suspend(id); err != nil {
			return fmt.Errorf("make room: suspend %s: %w", id, err)
		}
		done = append(done, id)
	}
	if len(done) > 0 {
		o.event(kind, "", done...)
	}
	return nil
}

// autoEvict suspends what lib/budget's PlanEvict names (the tree at 85% of its RAM
// budget or more).
func (o *op) autoEvict() error {
	refresh(o.t, o.m.RT)
	return o.execute(budgetTree(o.t).PlanEvict(), "evict")
}

// overBudget passes lib/budget's refusal on: its *OverBudgetError is one line naming
// the operation, the budget, the figures and the fix.
func overBudget(err error) error { return err }

// OverBudgetError is lib/budget's: an operation that cannot fit even after eviction.
type OverBudgetError = budget.OverBudgetError

// Prepare writes node's keyframe now (idempotent: a node that has one is left as it
// is); refresh writes a new generation for a node that has one. The old generation's
// files stay while anything maps them.
func (m *Manager) Prepare(ctx context.Context, treeRef, node string, refresh bool) (*Node, *Tree, error) {
	return m.withNode(ctx, treeRef, node, func(o *op, n *Node, c *store.Container) error {
		if n.Kind == NodeKindCluster {
			return invalidState("prepare %s: a cluster node has no keyframe: each fork of it takes a new cut of all %d members", n.ID, n.Members)
		}
		if n.HasKeyframe && !refresh {
			return nil
		}
		if n.State != StateLive {
			return invalidState("prepare %s: it is %s; resume it first", n.ID, n.State)
		}
		old := n.Keyframe
		k, err := fork.Prepare(ctx, o.trt, c, fork.PrepareOptions{KSM: o.t.KSM})
		if err != nil {
			return err
		}
		setKeyframe(n, k)
		n.LastActive = time.Now().UTC()
		if old != "" {
			// The old generation's snapshot goes; its memory files stay while mapped.
			if s, err := fork.LoadSnapshot(old); err == nil {
				_ = fork.RemoveSnapshot(s)
			}
			_ = dropPacked(o.t, n, old)
		}
		o.event("prepare", n.ID)
		return o.autoEvict()
	})
}

// Rollback makes a new branch: one new child of node restored from node's keyframe (its
// state when the keyframe was written), or from its suspended state when it has none.
// Node and its other children are left as they are.
func (m *Manager) Rollback(ctx context.Context, treeRef, node, name, label string) (*Node, *Tree, error) {
	var out *Node
	t, err := m.with(ctx, treeRef, func(o *op) error {
		n, c, err := o.node(node)
		if err != nil {
			return err
		}
		if n.Kind == NodeKindCluster {
			if name != "" {
				return badRequest("rollback %s: it is a cluster: names are per container, give a label instead", n.ID)
			}
			out, err = o.rollbackCluster(n, c, label)
			return err
		}
		var s *stage.Snapshot
		switch {
		case n.HasKeyframe:
			if s, err = o.keyframe(n); err != nil {
				return err
			}
		case n.PackedRole(RoleSuspend) != nil:
			if s, err = unpack(ctx, o.t, *n.PackedRole(RoleSuspend)); err != nil {
				return err
			}
			defer fork.RemoveSnapshot(s)
		default:
			return invalidState("rollback %s: it has no keyframe and is not suspended: nothing earlier to branch from (prepare it first)", n.ID)
		}
		if err := o.makeRoom(n.ID, 1, o.estimate(n)); err != nil {
			return err
		}
		var names []string
		if name != "" {
			names = []string{name}
		}
		forks, err := fork.Restore(ctx, o.trt, s, fork.RestoreOptions{N: 1, Names: names})
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		out = &Node{ID: forks[0].ID, Name: forks[0].Name, Parent: n.ID, State: StateLive, Label: label, Kind: NodeKind,
			Members: 1, Created: now, LastActive: now, From: s.ID}
		o.t.Nodes[out.ID] = out
		o.event("rollback", n.ID, out.ID)
		return o.autoEvict()
	})
	return out, t, err
}

// keyframe is n's keyframe snapshot on tmpfs, unpacked from disk if it was packed.
func (o *op) keyframe(n *Node) (*stage.Snapshot, error) {
	if s, err := fork.LoadSnapshot(n.Keyframe); err == nil {
		return s, nil
	}
	for _, p := range n.Packed {
		if p.Snapshot == n.Keyframe {
			return unpack(o.ctx, o.t, p)
		}
	}
	return nil, fmt.Errorf("node %s: its keyframe %s is neither on tmpfs nor packed (lost in a power cut while live)", n.ID, n.Keyframe)
}
