package fork

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/guard"
	"github.com/lazyfork/lazyfork/lib/ksm"
	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/overlay"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
)

// ClusterOptions tune ForkCluster.
type ClusterOptions struct {
	N     int  // how many forks of the whole cluster
	Force bool // see DumpOptions.Force
	KSM   bool // forks' memory mergeable by KSM (see Options.KSM; a ksm tree's)
}

// ForkCluster forks every member of c's cluster as one coordinated cut: all members'
// cgroups are frozen at once, each is dumped from inside the cluster's network namespace
// (which the images then do not hold), and all are thawed together, so the snapshots agree
// on every connection between members. Each of the o.N forks gets one new namespace
// (loopback up) with every member restored into it while its traffic is held, so no
// member resets a connection to one not restored yet; the members' connections to each
// other continue in every fork, and in the source cluster.
func ForkCluster(ctx context.Context, rt *container.Runtime, c *store.Container, o ClusterOptions) (_ *stage.ClusterFork, retErr error) {
	if o.N <= 0 {
		return nil, fmt.Errorf("fork cluster %s: -n must be at least 1", c.Display())
	}
	if err := needKSM(o.KSM, "fork cluster "+c.Display(), "fork without ksm"); err != nil {
		return nil, err
	}
	k, err := takeCut(ctx, rt, c, o.Force, "fork cluster")
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, s := range k.snaps {
			_ = RemoveSnapshot(s)
		}
		_ = Collect(rt)
	}()
	if err := k.thaw(); err != nil {
		return nil, fmt.Errorf("fork cluster %s: thaw: %w", k.leader().Display(), err)
	}
	thawedAt := time.Now()
	out := &stage.ClusterFork{Kind: stage.KindClusterFork, Version: stage.Version, Cluster: k.leader().ID}
	for i, m := range k.members {
		out.Members = append(out.Members, stage.ClusterMember{ID: m.ID, Name: m.Name, Snapshot: k.snaps[i].ID,
			PauseMs: stage.Ms(thawedAt.Sub(k.frozeAt[i])), FrozenMs: k.snaps[i].Dump.FrozenMs})
	}
	for i, s := range k.snaps {
		m, err := Memfile(ctx, s, MemfileOptions{Force: o.Force, KSM: o.KSM})
		if err != nil {
			return nil, err
		}
		k.snaps[i] = m
	}
	forks, err := RestoreCluster(ctx, rt, k.snaps, o.N)
	if err != nil {
		return nil, fmt.Errorf("fork cluster %s: %w", k.leader().Display(), err)
	}
	for _, fs := range forks {
		out.Leaders = append(out.Leaders, fs[0].ID)
		for i := range out.Members {
			out.Members[i].Forks = append(out.Members[i].Forks, fs[i])
		}
	}
	return out, nil
}

// RestoreCluster makes n forks of a cluster from its members' snapshots (one cut, leader
// first, each memfiled and dumped from inside the cluster's namespace): each fork is a
// new namespace with every member restored into it. forks[f][i] is member i's copy in
// fork f. A failure undoes every fork made so far.
func RestoreCluster(ctx context.Context, rt *container.Runtime, snaps []*stage.Snapshot, n int) (forks [][]stage.Fork, retErr error) {
	if n <= 0 || len(snaps) == 0 {
		return nil, fmt.Errorf("restore cluster: %d forks of %d members", n, len(snaps))
	}
	for _, s := range snaps {
		if !s.SharedNetNS {
			return nil, fmt.Errorf("restore cluster: snapshot %s is not a cluster member's (its image holds a namespace of its own): fork it alone", s.ID)
		}
	}
	var made []*store.Container
	defer func() {
		if retErr != nil {
			for j := len(made) - 1; j >= 0; j-- {
				_ = rt.Delete(made[j])
			}
		}
	}()
	for f := 0; f < n; f++ {
		fs, err := restoreCluster(ctx, rt, snaps)
		for _, x := range fs {
			if x.ID != "" {
				if r, gerr := rt.Containers.Get(x.ID); gerr == nil {
					made = append(made, r)
				}
			}
		}
		if err != nil {
			return nil, err
		}
		forks = append(forks, fs)
	}
	return forks, nil
}

// cut is a cluster frozen as one: every member's group frozen one after the other as
// fast as the kernel allows, then each dumped (left running, still frozen) from inside
// the cluster's namespace.
type cut struct {
	members []*store.Container
	cgs     []*cgroup.Cgroup
	frozeAt []time.Time
	snaps   []*stage.Snapshot
	thawed  bool
}

func (k *cut) leader() *store.Container { return k.members[0] }

// thaw lets every member run on.
func (k *cut) thaw() error {
	var errs []error
	for _, cg := range k.cgs {
		if cg != nil {
			errs = append(errs, cg.Thaw())
		}
	}
	k.thawed = true
	return errors.Join(errs...)
}

// takeCut freezes and dumps c's whole cluster. On failure every member is thawed and no
// snapshot is left; on success the members are still frozen (see cut.thaw).
// needKSM refuses an operation (what) asked to map memory files mergeable on a host
// without KSM, naming fix: a MADV_MERGEABLE bit in a checkpoint fails CRIU's restore on
// such a kernel.
func needKSM(on bool, what, fix string) error {
	if !on {
		return nil
	}
	if err := ksm.Available(); err != nil {
		return fmt.Errorf("%s with ksm: %w: %s", what, err, fix)
	}
	return nil
}

func takeCut(ctx context.Context, rt *container.Runtime, c *store.Container, force bool, what string) (_ *cut, retErr error) {
	members, err := rt.Members(c)
	if err != nil {
		return nil, err
	}
	leader := members[0]
	for _, m := range members {
		if err := stage.CheckRecord(m); err != nil {
			return nil, fmt.Errorf("%s %s: %w", what, leader.Display(), err)
		}
		if st := rt.State(m); st != store.StateRunning {
			return nil, fmt.Errorf("%s %s: member %s is %s; every member must be running", what, leader.Display(), m.Display(), st)
		}
	}
	// The cluster's namespace, held open through the cut: the leader's.
	nsf, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", leader.Pid))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, leader.Display(), err)
	}
	defer nsf.Close()
	held := fmt.Sprintf("/proc/self/fd/%d", nsf.Fd())
	k := &cut{members: members, cgs: make([]*cgroup.Cgroup, len(members)), frozeAt: make([]time.Time, len(members))}
	defer func() {
		if retErr != nil {
			for _, s := range k.snaps {
				_ = RemoveSnapshot(s)
			}
			if !k.thawed {
				retErr = errors.Join(retErr, k.thaw())
			}
			_ = Collect(rt)
		}
	}()
	for i, m := range members {
		cg, err := cgroup.LoadOwned(m.Cgroup)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", what, leader.Display(), err)
		}
		if err := cg.Freeze(); err != nil {
			return nil, fmt.Errorf("%s %s: freeze %s: %w", what, leader.Display(), m.Display(), err)
		}
		k.cgs[i], k.frozeAt[i] = cg, time.Now()
	}
	for _, m := range members {
		// CRIU finds the group frozen and leaves it so.
		s, err := Dump(ctx, rt, m, DumpOptions{Force: force, NetNS: held, Cut: true})
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", what, leader.Display(), err)
		}
		s.Owner = os.Getpid() // transient: GC drops it if this process dies
		if err := Save(s); err != nil {
			return nil, err
		}
		k.snaps = append(k.snaps, s)
	}
	return k, nil
}

// StopCluster stops c's whole cluster as one cut: every member frozen at once, dumped
// from inside the cluster's namespace, and only once all dumps succeeded are they all
// ended (a failed dump leaves every member running as before). Each member is then a
// stopped record on its own snapshot (lib/fork.Stop's state); StartCluster brings them
// back together, their connections to each other intact. snaps[i] is member i's.
//
// o.Force and o.KSM are as for ForkCluster (a ksm tree's cluster maps its memory files
// mergeable once started again); o.N is not used.
func StopCluster(ctx context.Context, rt *container.Runtime, c *store.Container, o ClusterOptions) ([]*stage.Snapshot, error) {
	if err := needKSM(o.KSM, "stop cluster "+c.Display(), "stop it without ksm"); err != nil {
		return nil, err
	}
	k, err := takeCut(ctx, rt, c, o.Force, "stop cluster")
	if err != nil {
		return nil, err
	}
	var errs []error
	for i, m := range k.members {
		s := k.snaps[i]
		if err := k.cgs[i].Kill(); err != nil {
			errs = append(errs, fmt.Errorf("stop cluster %s: end %s: %w", k.leader().Display(), m.Display(), err))
		}
		s.LeftRunning, s.Owner = false, 0
		if mf, err := Memfile(ctx, s, MemfileOptions{Force: o.Force, KSM: o.KSM}); err == nil {
			s = mf
		} // else the plain CRIU image still restores
		s.LeftRunning, s.Owner = false, 0
		errs = append(errs, Save(s))
		k.snaps[i] = s
		errs = append(errs, MarkStopped(rt, m, s))
	}
	k.thawed = true // their groups are gone
	return k.snaps, errors.Join(errs...)
}

// StartCluster restores c's stopped cluster (StopCluster) in place: one new namespace
// (in bridge mode attached with the cluster's own address by the leader's restore) with
// every member restored into it, same ids, names and upper layers, while its traffic is
// held. On failure every member is stopped as before.
func StartCluster(ctx context.Context, rt *container.Runtime, c *store.Container) (retErr error) {
	members, err := rt.Members(c)
	if err != nil {
		return err
	}
	leader := members[0]
	snaps := make([]*stage.Snapshot, len(members))
	for i, m := range members {
		if err := guard.Check(guard.OpStart, m, rt.State(m)); err != nil {
			return fmt.Errorf("start cluster %s: %w", leader.Display(), err)
		}
		if err := stage.CheckRecord(m); err != nil {
			return fmt.Errorf("start cluster %s: %w", leader.Display(), err)
		}
		if snaps[i], err = LoadSnapshot(m.Snapshot); err != nil {
			return fmt.Errorf("start cluster %s: member %s: %w", leader.Display(), m.Display(), err)
		}
		if !snaps[i].SharedNetNS {
			return fmt.Errorf("start cluster %s: member %s was stopped alone (its snapshot holds a namespace of its own)", leader.Display(), m.Display())
		}
	}
	ns, err := network.NewNetNS()
	if err != nil {
		return err
	}
	defer ns.Release() // the restored members hold the namespace from here on
	var pass []netip.Addr
	if p, err := netip.ParsePrefix(leader.Addr); err == nil && leader.Net == container.NetBridge {
		pass = append(pass, p.Addr()) // CRIU's FINs to half-closed connections' own address
	}
	release, err := network.HoldTraffic(ns.Path, pass...)
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, release()) }()
	var back []*store.Container
	saved := map[string]store.Container{}
	defer func() {
		if retErr == nil {
			return
		}
		for _, m := range back {
			if cg, err := cgroup.LoadOwned(m.Cgroup); err == nil {
				_ = cg.Kill()
				_ = cg.Remove()
			}
			_ = overlay.Unmount(m.RootFS)
			*m = saved[m.ID]
			_ = rt.Containers.Put(m)
		}
	}()
	for i, m := range members {
		saved[m.ID] = *m
		if err := resumeIn(ctx, rt, m, snaps[i], ns.Path); err != nil {
			return fmt.Errorf("start cluster %s: %w", leader.Display(), err)
		}
		back = append(back, m)
	}
	for _, s := range snaps {
		_ = RemoveSnapshot(s)
	}
	return Collect(rt)
}

// restoreCluster restores one fork of a cluster: a new namespace, traffic held, the
// members restored into it leader first, traffic released.
func restoreCluster(ctx context.Context, rt *container.Runtime, snaps []*stage.Snapshot) (_ []stage.Fork, retErr error) {
	ns, err := network.NewNetNS()
	if err != nil {
		return nil, err
	}
	defer ns.Release() // the restored members hold the namespace from here on
	var pass []netip.Addr
	if s := snaps[0]; s.Net == container.NetBridge {
		if p, err := netip.ParsePrefix(s.Addr); err == nil {
			pass = append(pass, p.Addr())
		}
	}
	release, err := network.HoldTraffic(ns.Path, pass...)
	if err != nil {
		return nil, err
	}
	defer func() { retErr = errors.Join(retErr, release()) }()
	var out []stage.Fork
	cluster, addr := "", ""
	for i, s := range snaps {
		fs, err := Restore(ctx, rt, s, RestoreOptions{N: 1, NetNS: ns.Path, Cluster: cluster, ClusterLeader: i == 0, ClusterAddr: addr})
		if err != nil {
			return out, err
		}
		out = append(out, fs[0])
		if i == 0 {
			cluster = fs[0].ID
			// Bridge mode: the leader's restore attached the namespace with the fork's
			// own address (and parked the parent's); the members share it.
			if l, err := rt.Containers.Get(cluster); err == nil {
				addr = l.Addr
			}
		}
	}
	if s := snaps[0]; s.Net == container.NetBridge && s.Addr != "" {
		// Every member is back: their copies of the parent's sockets bound to its address
		// (connections to the outside) are closed before any packet leaves.
		if err := network.CloseInheritedIn(ns.Path, s.Addr); err != nil {
			return out, err
		}
	}
	return out, nil
}
