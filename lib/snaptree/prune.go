package snaptree

import (
	"context"
	"errors"
	"fmt"

	"github.com/lazyfork/lazyfork/lib/budget"
	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/store"
)

// Protect sets (or clears) node's protection from eviction.
func (m *Manager) Protect(ctx context.Context, treeRef, node string, on bool) (*Node, *Tree, error) {
	return m.withNode(ctx, treeRef, node, func(o *op, n *Node, _ *store.Container) error {
		n.Protected = on
		kind := "protect"
		if !on {
			kind = "unprotect"
		}
		o.event(kind, n.ID)
		return nil
	})
}

// PruneResult says what a prune removed.
type PruneResult struct {
	Pruned []string `json:"pruned"`
	// TreeRemoved: the root was pruned, and with it the tree.
	TreeRemoved bool `json:"tree_removed"`
	// Freed bytes on tmpfs (memory files) and on disk (packed snapshots and files).
	TmpfsFreed int64 `json:"tmpfs_freed"`
	DiskFreed  int64 `json:"disk_freed"`
}

// Prune deletes node and its whole subtree: processes, records, snapshots, packed state,
// memory files and layers nothing else needs (a file a live node outside the subtree maps
// stays). Pruning the root removes the tree, a dropped one too.
func (m *Manager) Prune(ctx context.Context, treeRef, node string) (*PruneResult, *Tree, error) {
	res := &PruneResult{}
	t, err := m.withDropped(ctx, treeRef, true, func(o *op) error {
		n, _, err := o.node(node)
		if err != nil {
			return err
		}
		fams := families(o.t, o.m.RT)
		tmpfsBefore, diskBefore := tmpfsBytes(o.t, o.m.RT), diskBytes(o.t.Dir())
		var errs []error
		for _, id := range o.t.Subtree(n.ID) {
			if o.t.Nodes[id].Kind == NodeKindCluster {
				errs = append(errs, o.deleteMembers(id)...)
			}
			if c, err := o.lock(id); err == nil {
				if err := o.m.RT.Delete(c); err != nil {
					errs = append(errs, err)
					continue
				}
			}
			for _, p := range o.t.Nodes[id].Packed {
				errs = append(errs, fsutil.RemoveAll(p.Dir))
			}
			errs = append(errs, fsutil.RemoveAll(TreeDirNode(o.t.ID, id)))
			if u := o.locks[id]; u != nil {
				u()
				delete(o.locks, id)
			}
			delete(o.t.Nodes, id)
			res.Pruned = append(res.Pruned, id)
		}
		errs = append(errs, sweepStore(o.t))
		// Snapshots, families and layers whose last reference went (lib/fork's GC), then
		// the memory files of the remaining families that nothing maps or needs.
		errs = append(errs, fork.GC(o.m.RT))
		for _, f := range fams {
			_, err := FreeFamily(ctx, o.m.RT, f)
			errs = append(errs, err)
		}
		if n.ID == o.t.Root {
			if cg, err := cgroup.LoadOwned(o.t.Cgroup); err == nil {
				errs = append(errs, cg.Kill(), cg.Remove())
			}
			errs = append(errs, fsutil.RemoveAll(o.t.Dir()))
			res.TreeRemoved = true
		}
		res.TmpfsFreed = tmpfsBefore - tmpfsBytes(o.t, o.m.RT)
		res.DiskFreed = diskBefore - diskBytes(o.t.Dir())
		o.event("prune", n.ID, res.Pruned...)
		return errors.Join(errs...)
	})
	return res, t, err
}

// DropResult says what a drop did and where the state is.
type DropResult struct {
	Suspended []string `json:"suspended"`
	Dir       string   `json:"dir"` // where the tree's state stays on disk
}

// Drop forgets the tree: live members are suspended (stopped, their state packed to
// disk), the tree cgroup is removed, and tree.json is marked dropped. Everything on disk
// stays in Dir; the containers stay as stopped records.
func (m *Manager) Drop(ctx context.Context, treeRef string) (*DropResult, *Tree, error) {
	res := &DropResult{}
	t, err := m.with(ctx, treeRef, func(o *op) error {
		res.Dir = o.t.Dir()
		for _, n := range o.t.NodeList() {
			if n.State != StateLive {
				continue
			}
			if err := o.suspend(n.ID); err != nil {
				return err
			}
			res.Suspended = append(res.Suspended, n.ID)
		}
		if cg, err := cgroup.LoadOwned(o.t.Cgroup); err == nil {
			if err := cg.Remove(); err != nil {
				return err
			}
		}
		o.t.Dropped = true
		o.event("drop", "", res.Suspended...)
		return nil
	})
	return res, t, err
}

// Evict runs lib/budget's eviction now and returns the nodes it suspended.
func (m *Manager) Evict(ctx context.Context, treeRef string) ([]string, *Tree, error) {
	var out []string
	t, err := m.with(ctx, treeRef, func(o *op) error {
		plan := budgetTree(o.t).PlanEvict()
		out = plan.Suspend
		return o.execute(plan, "evict")
	})
	return out, t, err
}

// SetBudget replaces the tree's budget (and the tree cgroup's limits). A budget the tree
// is over first has the least-recently-active unprotected live nodes suspended until the
// tree is within it (lib/budget's PlanBudget; reported as an "evict" event), then eviction
// runs for the new RAM threshold. One the protected (or unresumable) nodes alone exceed is
// refused with a *budget.ChangeError naming them, before anything changed.
func (m *Manager) SetBudget(ctx context.Context, treeRef string, b Budget) (*Tree, error) {
	if err := b.Validate(); err != nil {
		return nil, fmt.Errorf("tree budget: %w", err)
	}
	return m.with(ctx, treeRef, func(o *op) error {
		plan, err := budgetTree(o.t).PlanBudget(b.Lib())
		if err != nil {
			return fmt.Errorf("tree %s: %w", o.t.ID, err)
		}
		// The suspensions write their deltas under the new budget (the plan fitted them
		// to its disk bound); one that fails leaves the old budget in force.
		old, evs := o.t.Budget, len(o.evs)
		o.t.Budget = b
		o.event("budget", "")
		if err := o.execute(plan, "evict"); err != nil {
			o.t.Budget, o.evs = old, o.evs[:evs]
			return err
		}
		// Evicted first: a lower memory limit than the group's charge would fail.
		if err := o.autoEvict(); err != nil {
			return err
		}
		return o.ensureCgroup()
	})
}

// ChangeError is lib/budget's refusal of a budget the tree cannot be brought within.
type ChangeError = budget.ChangeError
