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
	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
)

// ClusterOptions tune ForkCluster.
type ClusterOptions struct {
	N     int  // how many forks of the whole cluster
	Force bool // see DumpOptions.Force
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
	members, err := rt.Members(c)
	if err != nil {
		return nil, err
	}
	leader := members[0]
	for _, m := range members {
		if err := stage.CheckRecord(m); err != nil {
			return nil, fmt.Errorf("fork cluster %s: %w", leader.Display(), err)
		}
		if st := rt.State(m); st != store.StateRunning {
			return nil, fmt.Errorf("fork cluster %s: member %s is %s; every member must be running", leader.Display(), m.Display(), st)
		}
	}
	// The cluster's namespace, held open through the cut: the leader's.
	nsPath := fmt.Sprintf("/proc/%d/ns/net", leader.Pid)
	nsf, err := os.Open(nsPath)
	if err != nil {
		return nil, fmt.Errorf("fork cluster %s: %w", leader.Display(), err)
	}
	defer nsf.Close()
	held := fmt.Sprintf("/proc/self/fd/%d", nsf.Fd())

	out := &stage.ClusterFork{Kind: stage.KindClusterFork, Version: stage.Version, Cluster: leader.ID}
	var snaps []*stage.Snapshot
	defer func() {
		for _, s := range snaps {
			_ = RemoveSnapshot(s)
		}
		_ = Collect(rt)
	}()

	// The cut: every group frozen, one after the other as fast as the kernel allows.
	cgs := make([]*cgroup.Cgroup, len(members))
	frozeAt := make([]time.Time, len(members))
	thawed := false
	thawAll := func() error {
		var errs []error
		for _, cg := range cgs {
			if cg != nil {
				errs = append(errs, cg.Thaw())
			}
		}
		thawed = true
		return errors.Join(errs...)
	}
	defer func() {
		if !thawed {
			retErr = errors.Join(retErr, thawAll())
		}
	}()
	for i, m := range members {
		cg, err := cgroup.LoadOwned(m.Cgroup)
		if err != nil {
			return nil, fmt.Errorf("fork cluster %s: %w", leader.Display(), err)
		}
		if err := cg.Freeze(); err != nil {
			return nil, fmt.Errorf("fork cluster %s: freeze %s: %w", leader.Display(), m.Display(), err)
		}
		cgs[i], frozeAt[i] = cg, time.Now()
	}
	for _, m := range members {
		// CRIU finds the group frozen and leaves it so.
		s, err := Dump(ctx, rt, m, DumpOptions{Force: o.Force, NetNS: held, Cut: true})
		if err != nil {
			return nil, fmt.Errorf("fork cluster %s: %w", leader.Display(), err)
		}
		s.Owner = os.Getpid() // transient: GC drops it if this process dies
		if err := Save(s); err != nil {
			return nil, err
		}
		snaps = append(snaps, s)
	}
	if err := thawAll(); err != nil {
		return nil, fmt.Errorf("fork cluster %s: thaw: %w", leader.Display(), err)
	}
	thawedAt := time.Now()
	for i, m := range members {
		out.Members = append(out.Members, stage.ClusterMember{ID: m.ID, Name: m.Name, Snapshot: snaps[i].ID,
			PauseMs: stage.Ms(thawedAt.Sub(frozeAt[i])), FrozenMs: snaps[i].Dump.FrozenMs})
	}
	for i, s := range snaps {
		m, err := Memfile(ctx, s, MemfileOptions{Force: o.Force})
		if err != nil {
			return nil, err
		}
		snaps[i] = m
	}

	// The forks, one whole cluster at a time; a failure undoes every fork made so far.
	var made []*store.Container
	defer func() {
		if retErr != nil {
			for j := len(made) - 1; j >= 0; j-- {
				_ = rt.Delete(made[j])
			}
		}
	}()
	for f := 0; f < o.N; f++ {
		fs, err := restoreCluster(ctx, rt, snaps)
		for _, x := range fs {
			if x.ID != "" {
				if r, gerr := rt.Containers.Get(x.ID); gerr == nil {
					made = append(made, r)
				}
			}
		}
		if err != nil {
			return nil, fmt.Errorf("fork cluster %s: %w", leader.Display(), err)
		}
		out.Leaders = append(out.Leaders, fs[0].ID)
		for i := range out.Members {
			out.Members[i].Forks = append(out.Members[i].Forks, fs[i])
		}
	}
	return out, nil
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
