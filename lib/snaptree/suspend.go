package snaptree

import (
	"context"
	"fmt"
	"time"

	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
)

// Suspend stops node into a snapshot, packs it (and its keyframe) to disk with every
// memory file it needs, and deletes from tmpfs what nothing else needs: its RAM is freed.
func (m *Manager) Suspend(ctx context.Context, treeRef, node string) (*Node, *Tree, error) {
	return m.withNode(ctx, treeRef, node, func(o *op, n *Node, _ *store.Container) error {
		if n.State == StateSuspended {
			return nil
		}
		if err := o.suspend(n.ID); err != nil {
			return err
		}
		o.event("suspend", n.ID)
		return nil
	})
}

func (o *op) suspend(id string) error {
	n := o.t.Nodes[id]
	c, err := o.lock(id)
	if err != nil {
		return err
	}
	if n.State != StateLive {
		return invalidState("suspend %s: it is %s; only a live node can be suspended", id, n.State)
	}
	ram := n.RAMBytes
	// Disk headroom for what is about to be written (its RAM and family at most).
	if plan, err := budgetTree(o.t).PlanKeyframe(id, ram); err != nil {
		return overBudget(err)
	} else if len(plan.Suspend) > 0 {
		if err := o.execute(plan, "evict"); err != nil {
			return err
		}
	}
	if n.Kind == NodeKindCluster {
		return o.suspendCluster(n, c, ram)
	}
	s, err := fork.Stop(o.ctx, o.trt, c, hook.Options{})
	if err != nil {
		return err
	}
	n.State = StateSuspended
	p, err := pack(o.t, n, s, RoleSuspend)
	if err != nil {
		// Not packed: the snapshot stays on tmpfs, where lazyfork start still finds it.
		n.State = StateExited
		return err
	}
	_ = dropPacked(o.t, n, s.ID)
	n.Packed = append(n.Packed, p)
	n.DirtyPages = int64(s.Dump.PagesWritten)
	n.DeltaBytes = p.Bytes
	n.RAMBytes = ram
	// The keyframe goes to disk too: on tmpfs it would keep its files in RAM.
	if n.HasKeyframe {
		if k, err := fork.LoadSnapshot(n.Keyframe); err == nil {
			if kp, err := pack(o.t, n, k, RoleKeyframe); err == nil {
				_ = dropPacked(o.t, n, k.ID)
				n.Packed = append(n.Packed, kp)
				_ = fork.RemoveSnapshot(k)
			}
		}
	}
	// tree.json names the packed copy before the tmpfs one goes (a crash in between
	// leaves both).
	if err := o.save(); err != nil {
		return err
	}
	if err := fork.RemoveSnapshot(s); err != nil {
		return err
	}
	_, err = FreeFamily(o.ctx, o.m.RT, s.Family)
	return err
}

// Resume restores a suspended node in place (same id and name) from its packed
// snapshot, applying its whole delta, after the budget check (chain depth included).
func (m *Manager) Resume(ctx context.Context, treeRef, node string) (*Node, *Tree, error) {
	return m.withNode(ctx, treeRef, node, func(o *op, n *Node, c *store.Container) error {
		if n.State == StateLive {
			return nil
		}
		if n.Kind == NodeKindCluster {
			if err := o.resumeCluster(n, c); err != nil {
				return err
			}
			o.event("resume", n.ID)
			return o.autoEvict()
		}
		p := n.PackedRole(RoleSuspend)
		var s *stage.Snapshot
		if p == nil {
			// Stopped but not packed (`lazyfork stop`, or a suspend whose process died
			// before packing): its snapshot on tmpfs restarts it.
			if c.State == store.StateStopped {
				s, _ = fork.LoadSnapshot(c.Snapshot)
			}
			if s == nil {
				return invalidState("resume %s: it is %s and has no snapshot to resume from (prune it)", n.ID, n.State)
			}
		}
		plan, err := budgetTree(o.t).PlanResume(n.ID, n.RAMBytes)
		if err != nil {
			return overBudget(err)
		}
		if err := o.execute(plan, "evict"); err != nil {
			return err
		}
		if p != nil {
			if s, err = unpack(ctx, o.t, *p); err != nil {
				return err
			}
		}
		if c.Snapshot != s.ID || c.State != store.StateStopped {
			return fmt.Errorf("resume %s: its record is %s on snapshot %q, not the packed %s", n.ID, c.State, c.Snapshot, s.ID)
		}
		if err := fork.Start(ctx, o.trt, c); err != nil {
			return err
		}
		n.State, n.LastActive = StateLive, time.Now().UTC()
		if s.ID == n.Keyframe && p != nil {
			// Forks were made from the suspended state: it stays on disk as the keyframe.
			p.Role = RoleKeyframe
		} else if err := dropPacked(o.t, n, s.ID); err != nil {
			return err
		}
		n.DeltaBytes = 0
		if err := sweepStore(o.t); err != nil {
			return err
		}
		o.event("resume", n.ID)
		return o.autoEvict()
	})
}
