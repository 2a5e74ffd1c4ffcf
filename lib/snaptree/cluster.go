package snaptree

import (
	"errors"
	"fmt"
	"time"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/ksm"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
)

// Cluster nodes. A cluster (containers sharing one network namespace, `create --join`)
// is one node whose id is its leader's: adopting any member adopts the whole cluster;
// a fork of it is a cluster fork (lib/fork.ForkCluster: one cut of every member, each
// fork a new namespace with all of them inside); suspend stops every member as one cut
// (fork.StopCluster) and packs each member's snapshot; resume restores them together
// (fork.StartCluster); prune deletes every member; eviction suspends the cluster as a
// unit. A cluster node has no keyframe: each fork takes a new cut (its members cannot
// be moved onto a snapshot one at a time), and the budget counts it as one live node
// whose RAM is the sum of its members' cgroups.

// clusterMembers locks and returns every member of the cluster led by leader, leader
// first, and records them in n.
func (o *op) clusterMembers(n *Node, leader *store.Container) ([]*store.Container, error) {
	ms, err := o.m.RT.Members(leader)
	if err != nil {
		return nil, err
	}
	var out []*store.Container
	var ids []string
	for _, m := range ms {
		c, err := o.lock(m.ID)
		if err != nil {
			return nil, err
		}
		if c.Cluster != leader.ID {
			return nil, fmt.Errorf("cluster %s: %s left it meanwhile", leader.ID, c.ID)
		}
		out = append(out, c)
		ids = append(ids, c.ID)
	}
	if n != nil {
		n.MemberIDs, n.Members = ids, len(ids)
	}
	return out, nil
}

// adoptCluster roots the tree at c's cluster: every member is stopped as one cut and
// started again inside the tree cgroup (their connections to each other continue), so
// the tree's budget sees their memory. On failure the cluster is started again where it
// was.
func (o *op) adoptCluster(leader *store.Container, label string) (*Node, error) {
	n := &Node{ID: leader.ID, Name: leader.Name, State: StateLive, Label: label, Kind: NodeKindCluster}
	ms, err := o.clusterMembers(n, leader)
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		if st := o.m.RT.State(m); st != store.StateRunning {
			return nil, invalidState("adopt cluster %s: member %s is %s; every member must be running", leader.Display(), m.Display(), st)
		}
	}
	snaps, err := fork.StopCluster(o.ctx, o.trt, leader, fork.ClusterOptions{KSM: o.t.KSM})
	if err != nil {
		return nil, fmt.Errorf("adopt cluster %s: %w", leader.Display(), err)
	}
	if err := fork.StartCluster(o.ctx, o.trt, leader); err != nil {
		if back := fork.StartCluster(o.ctx, o.m.RT, leader); back != nil {
			err = errors.Join(err, fmt.Errorf("starting it again outside the tree: %w", back))
		}
		return nil, fmt.Errorf("adopt cluster %s: %w", leader.Display(), err)
	}
	now := time.Now().UTC()
	n.Created, n.LastActive = now, now
	for _, s := range snaps {
		n.DirtyPages += int64(s.Dump.PagesWritten)
	}
	return n, nil
}

// forkCluster makes fo.N forks of cluster node n (live: one new cut; suspended: from its
// members' packed snapshots, and it stays suspended), each a new cluster node.
func (o *op) forkCluster(n *Node, leader *store.Container, fo ForkOptions) ([]*Node, error) {
	if len(fo.Names) > 0 {
		return nil, badRequest("fork %s: it is a cluster of %d containers: names are per container, give labels instead", n.ID, n.Members)
	}
	var forks [][]stage.Fork
	var dirty int64
	if n.State == StateSuspended {
		snaps, err := o.unpackCluster(n, leader)
		defer func() {
			for _, s := range snaps {
				_ = fork.RemoveSnapshot(s) // the packed copies stay on disk
			}
		}()
		if err != nil {
			return nil, err
		}
		if forks, err = fork.RestoreCluster(o.ctx, o.trt, snaps, fo.N); err != nil {
			return nil, fmt.Errorf("fork cluster %s: %w", n.ID, err)
		}
		for _, s := range snaps {
			dirty += int64(s.Dump.PagesWritten)
		}
	} else {
		if _, err := o.clusterMembers(n, leader); err != nil {
			return nil, err
		}
		res, err := fork.ForkCluster(o.ctx, o.trt, leader, fork.ClusterOptions{N: fo.N, KSM: o.t.KSM})
		if err != nil {
			return nil, err
		}
		for f := range res.Leaders {
			var fs []stage.Fork
			for _, m := range res.Members {
				fs = append(fs, m.Forks[f])
			}
			forks = append(forks, fs)
		}
	}
	kids := make([]*Node, len(forks))
	for i, fs := range forks {
		kids[i] = &Node{ID: fs[0].ID, Name: fs[0].Name, Kind: NodeKindCluster, Members: len(fs)}
		for _, f := range fs {
			kids[i].MemberIDs = append(kids[i].MemberIDs, f.ID)
		}
	}
	return o.addForks(n, kids, dirty, fo.Labels)
}

// unpackCluster puts every member's suspended snapshot of cluster node n back on tmpfs,
// in member order (leader first).
func (o *op) unpackCluster(n *Node, leader *store.Container) ([]*stage.Snapshot, error) {
	ms, err := o.clusterMembers(n, leader)
	if err != nil {
		return nil, err
	}
	var out []*stage.Snapshot
	for _, m := range ms {
		if m.State != store.StateStopped || m.Snapshot == "" {
			return out, invalidState("cluster %s: member %s is %s with no snapshot (prune the node)", n.ID, m.Display(), m.State)
		}
		var s *stage.Snapshot
		for _, p := range n.Packed {
			if p.Snapshot == m.Snapshot && p.Role == RoleSuspend {
				if s, err = unpack(o.ctx, o.t, p); err != nil {
					return out, err
				}
			}
		}
		if s == nil {
			// Stopped but not packed (a suspend that died before packing): on tmpfs.
			if s, err = fork.LoadSnapshot(m.Snapshot); err != nil {
				return out, fmt.Errorf("cluster %s: member %s: its snapshot %s is neither packed nor on tmpfs (prune the node)", n.ID, m.Display(), m.Snapshot)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// suspendCluster stops every member of cluster node n as one cut, packs each member's
// snapshot with the memory files it needs, and frees their RAM.
func (o *op) suspendCluster(n *Node, leader *store.Container, ram int64) error {
	if _, err := o.clusterMembers(n, leader); err != nil {
		return err
	}
	snaps, err := fork.StopCluster(o.ctx, o.trt, leader, fork.ClusterOptions{KSM: o.t.KSM})
	if err != nil {
		if snaps != nil {
			n.State = StateExited // stopped, some member's record not updated: see refresh
		}
		return err
	}
	n.State = StateSuspended
	var dirty, bytes int64
	for _, s := range snaps {
		p, err := pack(o.t, n, s, RoleSuspend)
		if err != nil {
			// Not packed: the snapshots stay on tmpfs, where resume finds them.
			return err
		}
		_ = dropPacked(o.t, n, s.ID)
		n.Packed = append(n.Packed, p)
		dirty += int64(s.Dump.PagesWritten)
		bytes += p.Bytes
	}
	n.DirtyPages, n.DeltaBytes, n.RAMBytes = dirty, bytes, ram
	if err := o.t.Save(); err != nil {
		return err
	}
	var errs []error
	for _, s := range snaps {
		errs = append(errs, fork.RemoveSnapshot(s))
	}
	for _, s := range snaps {
		_, err := FreeFamily(o.ctx, o.m.RT, s.Family)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// resumeCluster restores every member of suspended cluster node n together, in place,
// after the budget check.
func (o *op) resumeCluster(n *Node, leader *store.Container) error {
	plan, err := budgetTree(o.t).PlanResume(n.ID, n.RAMBytes)
	if err != nil {
		return overBudget(err)
	}
	if err := o.execute(plan, "evict"); err != nil {
		return err
	}
	snaps, err := o.unpackCluster(n, leader)
	if err != nil {
		return err
	}
	if err := fork.StartCluster(o.ctx, o.trt, leader); err != nil {
		return err
	}
	n.State, n.LastActive = StateLive, time.Now().UTC()
	for _, s := range snaps {
		if err := dropPacked(o.t, n, s.ID); err != nil {
			return err
		}
	}
	n.DeltaBytes = 0
	return sweepStore(o.t)
}

// rollbackCluster branches a new cluster node from suspended cluster node n's state.
func (o *op) rollbackCluster(n *Node, leader *store.Container, label string) (*Node, error) {
	if n.State != StateSuspended {
		return nil, invalidState("rollback %s: a cluster node has no keyframe (each fork of it is a new cut); only a suspended one has an earlier state to branch from", n.ID)
	}
	snaps, err := o.unpackCluster(n, leader)
	defer func() {
		for _, s := range snaps {
			_ = fork.RemoveSnapshot(s)
		}
	}()
	if err != nil {
		return nil, err
	}
	if err := o.makeRoom(n.ID, 1, o.estimate(n)); err != nil {
		return nil, err
	}
	forks, err := fork.RestoreCluster(o.ctx, o.trt, snaps, 1)
	if err != nil {
		return nil, fmt.Errorf("rollback cluster %s: %w", n.ID, err)
	}
	now := time.Now().UTC()
	k := &Node{ID: forks[0][0].ID, Parent: n.ID, State: StateLive, Label: label, Kind: NodeKindCluster,
		Members: len(forks[0]), Created: now, LastActive: now, From: snaps[0].ID}
	for _, f := range forks[0] {
		k.MemberIDs = append(k.MemberIDs, f.ID)
	}
	o.t.Nodes[k.ID] = k
	o.event("rollback", n.ID, k.ID)
	return k, o.autoEvict()
}

// deleteMembers deletes every member of cluster node id but its leader (prune; the
// leader goes as any node does).
func (o *op) deleteMembers(id string) []error {
	n := o.t.Nodes[id]
	ids := n.MemberIDs
	if l, err := o.m.RT.Containers.Get(id); err == nil {
		if ms, err := o.m.RT.Members(l); err == nil {
			ids = nil
			for _, m := range ms {
				ids = append(ids, m.ID)
			}
		}
	}
	var errs []error
	for _, m := range ids {
		if m == id {
			continue
		}
		c, err := o.lock(m)
		if err != nil {
			continue // gone already
		}
		if c.Cluster != id {
			continue // never delete what is no longer this cluster's
		}
		errs = append(errs, o.m.RT.Delete(c))
	}
	return errs
}

// refreshCluster is refresh for a live cluster node: live while every member runs; its
// RAM and CPU time are its members' together.
func refreshCluster(t *Tree, n *Node, rt *container.Runtime, now time.Time) {
	l, err := rt.Containers.Get(n.ID)
	if err != nil {
		n.State, n.RAMBytes = StateExited, 0
		return
	}
	ms, err := rt.Members(l)
	if err != nil {
		n.State, n.RAMBytes = StateExited, 0
		return
	}
	var ram, merging int64
	var ticks uint64
	var ids []string
	for _, m := range ms {
		if rt.State(m) == store.StateExited || m.State == store.StateStopped {
			n.State, n.RAMBytes = StateExited, 0
			return
		}
		ids = append(ids, m.ID)
		cg, err := container.Cgroup(m)
		if err != nil {
			continue
		}
		if st, err := cg.Stats(); err == nil {
			ram += int64(st.MemoryBytes)
		}
		if tk, ok := cpuTicks(cg); ok {
			ticks += tk
		}
		if t.KSM {
			p, _ := ksm.CgroupMergingPages(cg.Paths)
			merging += p
		}
	}
	n.State, n.RAMBytes, n.KSMMergingPages = StateLive, ram, merging
	n.MemberIDs, n.Members = ids, len(ids)
	if ticks != n.CPUTicks {
		n.CPUTicks, n.LastActive = ticks, now
	}
}
