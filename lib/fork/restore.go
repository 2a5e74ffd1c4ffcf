package fork

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/nsthread"
	"github.com/lazyfork/lazyfork/lib/overlay"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// RestoreOptions tune a batch of forks.
type RestoreOptions struct {
	N     int      // how many forks
	Names []string // optional names, one per fork (fewer is fine)
	// Parallel bounds concurrent restores; 0 means the number of CPUs. A fork costs
	// ~31-35 ms of CPU (lf-restore and criu, and criu's code in the restored tree's root
	// task) and waits for RCU grace periods in criu's mount set-up; the cgroup move and
	// the set-up LazyFork does are made ahead (pipeline). 3 or 4 at a time gained nothing
	// measurable for 100 forks while a qemu guest held a core, and doubled a fork's
	// latency (bench/README.md, scale_trace.py and offcpu.py, 2 Dec); on an idle host 300
	// forks took 6.5-8.7 s 4 at a time against 9.5-15.2 s 2 at a time (1 Dec). The default
	// keeps a fork's latency, --parallel trades it for a batch's wall time.
	Parallel int
	// OnFork is called as each fork starts running (progress, JSON lines).
	OnFork func(stage.Fork)
	// Service serves the restores; nil starts one for this batch (a daemon keeps its own).
	Service *criu.Service
	// PerForkCriu starts a criu (swrk) for every fork instead, as before the service: only
	// to measure the difference.
	PerForkCriu bool
	// Hook: the wait for each fork's answer to RESEED, and whether a fork whose runtime
	// does not answer in time is kept anyway (Fork also uses it for QUIESCE).
	Hook hook.Options
	// NetNS restores a cluster member's snapshot (dumped from inside its cluster's
	// namespace) into the network namespace at this path, with a criu started there
	// (ForkCluster). Cluster is the new records' cluster id; ClusterLeader makes each new
	// record its own cluster's leader.
	NetNS         string
	Cluster       string
	ClusterLeader bool
	// ClusterAddr is, for members of a bridge-mode cluster fork, the fork leader's address
	// (the namespace's), which their records share.
	ClusterAddr string

	// early: the forks' records, cgroups and workers made ready during the dump (Fork).
	early *early
}

// Restore makes o.N forks of a memfiled snapshot. Every fork is a new container with its
// own namespaces, cgroup, overlay upper and hostname, sharing the family memory files.
// When any fork fails the whole batch is undone and the first error returned.
func Restore(ctx context.Context, rt *container.Runtime, s *stage.Snapshot, o RestoreOptions) ([]stage.Fork, error) {
	defer busy()()
	ctx, end := trace.Start(ctx, fmt.Sprintf("restore %d fork(s)", o.N))
	defer end()
	endChecks := trace.Step(ctx, "check the snapshot, state lock (shared)")
	defer func() { endChecks() }()
	// Every path comes from the document: the checkpoint CRIU reads, the family bound into each
	// fork, the layers mounted as its root. Nothing is touched before they are known to
	// be LazyFork's.
	if err := stage.CheckSnapshot(s); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	switch s.State {
	case stage.SnapMemfiled, stage.SnapDumped:
	default:
		return nil, fmt.Errorf("restore %s: snapshot is %s; run lf-dump again", s.ID, s.State)
	}
	if o.N <= 0 {
		return nil, fmt.Errorf("restore %s: -n must be at least 1", s.ID)
	}
	if len(o.Names) > o.N {
		return nil, fmt.Errorf("restore %s: %d names for %d forks", s.ID, len(o.Names), o.N)
	}
	for _, n := range o.Names {
		if err := store.ValidateName(n); err != nil {
			return nil, err
		}
	}
	if err := checkRestorable(s); err != nil {
		return nil, err
	}
	if s.SharedNetNS && o.NetNS == "" {
		return nil, fmt.Errorf("restore %s: it is a cluster member's snapshot (no network namespace of its own): fork the cluster (`lazyfork cluster fork`)", s.ID)
	}
	unlock, hold, err := lockSharedHeld(ctx)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", s.ID, err)
	}
	defer unlock()
	if err := makeDumpedFamily(s); err != nil {
		return nil, err
	}
	endChecks()
	endChecks = func() {}
	par := o.Parallel
	if par <= 0 {
		par = runtime.NumCPU()
	}
	svc := o.Service
	if o.PerForkCriu || o.NetNS != "" {
		svc = nil
	} else if svc == nil || !svc.Alive() {
		if svc, err = criu.StartService(ctx, kdatDir(), rt.CRIU); err != nil {
			return nil, fmt.Errorf("restore %s: %w", s.ID, err)
		}
		defer svc.Close()
	}
	// Bridge mode: each fork gets an address of the source's subnet on its bridge.
	var alloc func() (string, error)
	member := o.Cluster != "" && !o.ClusterLeader
	if s.Net == container.NetBridge && member {
		if o.ClusterAddr == "" {
			return nil, fmt.Errorf("restore %s: a bridge-mode cluster member needs its cluster's address", s.ID)
		}
		alloc = func() (string, error) { return o.ClusterAddr, nil }
	} else if s.Net == container.NetBridge {
		subnet, err := netip.ParsePrefix(s.Addr)
		if err != nil {
			return nil, fmt.Errorf("restore %s: bridge mode without an address (%q)", s.ID, s.Addr)
		}
		alloc = rt.AddressAllocator(subnet.Masked())
	}
	fill := func(c *store.Container) error {
		c.Image, c.Command, c.Env, c.WorkingDir, c.Hook = s.Image, s.Command, s.Env, s.WorkingDir, s.Hook
		c.Confine, c.Memory, c.PidsLimit, c.Net = s.Confine, s.Memory, s.PidsLimit, s.Net
		c.Parent, c.Depth = s.Source.ID, s.Source.Depth+1
		c.Lower = s.Lower
		c.Family, c.MemDir = s.Family, s.FamilyDir
		c.Cluster = o.Cluster
		if o.ClusterLeader {
			c.Cluster = c.ID
		}
		if alloc != nil {
			c.Bridge, c.NAT = s.Bridge, s.NAT
			var err error
			c.Addr, err = alloc()
			return err
		}
		return nil
	}
	var forks []*store.Container
	ready := map[string]*prepared{}
	if e := o.early; e != nil {
		// Reserved, with cgroups and workers, during the dump (Fork); filled from the
		// snapshot now, written when each runs.
		endWait := trace.Step(ctx, "wait for the forks made ready during the dump")
		<-e.done
		endWait()
		defer e.closeWorkers() // those no restore took
		if e.err != nil {
			e.abort(rt)
			return nil, fmt.Errorf("restore %s: %w", s.ID, e.err)
		}
		for _, c := range e.forks {
			if err := fill(c); err != nil {
				e.abort(rt)
				return nil, fmt.Errorf("restore %s: %w", s.ID, err)
			}
		}
		forks, ready = e.forks, e.ready
		if svc != o.Service {
			// The service they were made for is gone: each restore gets a worker of svc.
			for _, p := range ready {
				p.worker.Close()
				p.worker = nil
			}
		}
	} else {
		// One reservation for the whole batch: the names are checked against the store once.
		endReserve := trace.Step(ctx, "reserve the records")
		forks, err = rt.ReserveN(o.N, o.Names, fill)
		endReserve()
		if err != nil {
			return nil, fmt.Errorf("restore %s: %w", s.ID, err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Without forks made ready during a dump, each fork's cgroup, worker and namespace are
	// made ahead of its restore (pipeline), two slots' worth.
	var pipe *pipeline
	if o.early == nil && svc != nil && o.NetNS == "" {
		pipe = startPipeline(ctx, rt, s, svc, forks, 2*par)
		defer pipe.close()
	}
	var (
		mu   sync.Mutex
		out  = make([]stage.Fork, o.N)
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, par)
	)
	// Slots are handed out in the forks' order: the pipeline makes them ready in that order.
dispatch:
	for i := 0; i < o.N; i++ {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break dispatch
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var once sync.Once
			release := func() { once.Do(func() { <-sem }) }
			defer release()
			if ctx.Err() != nil {
				return
			}
			begin := time.Now()
			pre := ready[forks[i].ID]
			var err error
			if pipe != nil {
				pre, err = pipe.take(ctx, i)
			}
			var f stage.Fork
			if err == nil {
				f, err = restoreOne(ctx, rt, s, svc, hold, forks[i], pre, o.Hook, o.NetNS, release, begin)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				cancel()
				return
			}
			out[i] = f
			if o.OnFork != nil {
				o.OnFork(f)
			}
		}(i)
	}
	wg.Wait()
	if err := ctx.Err(); err != nil && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("restore %s: %w", s.ID, context.Cause(ctx)))
	}
	if len(errs) > 0 {
		// All or nothing: a batch that failed half-way leaves no forks, and no records of
		// the ones it never started.
		if o.early != nil {
			o.early.closeWorkers() // out of the groups first
		}
		if pipe != nil {
			pipe.close()
		}
		for _, c := range forks {
			_ = rt.Delete(c)
		}
		return nil, errs[0]
	}
	return out, nil
}

// checkRestorable fails early, with the fix, when what forks need is gone.
func checkRestorable(s *stage.Snapshot) error {
	if _, err := os.Stat(filepath.Join(s.CheckpointDir, "inventory.img")); err != nil {
		return fmt.Errorf("restore %s: its checkpoint %s is gone; take a new snapshot with lf-dump", s.ID, s.CheckpointDir)
	}
	if _, err := os.Stat(s.FamilyDir); err != nil && s.State != stage.SnapDumped {
		return fmt.Errorf("restore %s: its memory files %s are gone; take a new snapshot with lf-dump", s.ID, s.FamilyDir)
	}
	for _, l := range s.Lower {
		if _, err := os.Stat(l); err != nil {
			return fmt.Errorf("restore %s: its file system layer %s is gone; take a new snapshot with lf-dump", s.ID, l)
		}
	}
	return nil
}

// makeDumpedFamily gives a plain checkpoint (state dumped: every fork gets a full copy
// of the memory, the baseline LazyFork is measured against) the family directory its
// forks mount; it holds no memory files then.
func makeDumpedFamily(s *stage.Snapshot) error {
	if s.State != stage.SnapDumped {
		return nil
	}
	if err := MakeFamilyDir(s.FamilyDir); err != nil {
		return fmt.Errorf("restore %s: %w", s.ID, err)
	}
	return nil
}

// restoreOne starts the reserved fork c; the batch deletes it if anything fails. Its
// restore_ms runs from begin (its slot; its record was written with the batch's) to running.
// release gives the batch's restore slot back once the tree runs: waiting for the fork's
// runtime to answer RESEED and writing its record need no CPU of the batch's and must not
// hold the next fork back.
func restoreOne(ctx context.Context, rt *container.Runtime, s *stage.Snapshot, svc *criu.Service, hold *os.File, c *store.Container, pre *prepared, h hook.Options, netns string, release func(), begin time.Time) (stage.Fork, error) {
	ctx, end := trace.Start(ctx, "fork "+c.ID)
	defer end()
	// The slot goes back once criu has resumed the tree (post-resume): what criu does after
	// that (its mount namespace's teardown waits for RCU grace periods, its root yard's
	// rmdir for the journal) needs no slot, and the fork's restore still ends with it.
	err := startIn(ctx, rt, c, s, c.Upper, c.ID, svc, pre, hold, true, netns, release)
	release()
	if err != nil {
		return stage.Fork{}, err
	}
	endReseed := trace.Step(ctx, "hook: reseed")
	err = hook.Reseed(ctx, c, h)
	endReseed()
	if err != nil {
		return stage.Fork{}, fmt.Errorf("fork %s: %w", c.ID, err)
	}
	restoreMs := stage.Ms(time.Since(begin))
	c.Timings = map[string]float64{"dump_ms": s.Dump.WallMs, "frozen_ms": s.Dump.FrozenMs, "restore_ms": restoreMs}
	if s.Memfile != nil {
		c.Timings["memfile_ms"] = s.Memfile.Ms
	}
	if s.Dump.PreallocMs > 0 {
		c.Timings["prealloc_ms"] = s.Dump.PreallocMs
	}
	if s.SwapMs > 0 {
		c.Timings["swap_ms"] = s.SwapMs
	}
	// Not synced: the record ReserveN synced names everything GC must clean, and the pid
	// written now does not outlive a crash of the machine either (store.Update).
	endPut := trace.Step(ctx, "write the record")
	err = rt.Containers.Update(c)
	endPut()
	if err != nil {
		return stage.Fork{}, err
	}
	return stage.Fork{
		Kind: stage.KindFork, Version: stage.Version, ID: c.ID, Name: c.Name, Parent: c.Parent,
		Depth: c.Depth, Pid: c.Pid, Hostname: c.Hostname, Snapshot: s.ID, Family: c.Family,
		RestoreMs: restoreMs, Address: addrOnly(c.Addr),
	}, nil
}

// start mounts c's overlay (lower = the snapshot's stack, the given upper), makes its
// cgroup and restores the snapshot into them. The caller undoes a failure with Delete.
func start(ctx context.Context, rt *container.Runtime, c *store.Container, s *stage.Snapshot, upper string, svc *criu.Service, hold *os.File) error {
	return startIn(ctx, rt, c, s, upper, c.ID, svc, nil, hold, true, "", nil)
}

// startIn is start with the container's cgroup named cgName (a swapped source gets a new
// group while its old processes are still frozen in the one named by its id). hold is the
// state lock criu keeps while it runs (see criu.RestoreOptions.Hold). rename sets
// the restored tree's hostname to the record's (forks); a swapped source keeps whatever
// its processes had set, as it is the same container.
//
// netns, for a cluster member's snapshot, is the namespace criu runs in and restores into.
// pre, if any, is the cgroup (named cgName) and service worker made ready during the dump.
// resumed, if not nil, is called when criu reports the tree resumed (before it answers).
func startIn(ctx context.Context, rt *container.Runtime, c *store.Container, s *stage.Snapshot, upper, cgName string, svc *criu.Service, pre *prepared, hold *os.File, rename bool, netns string, resumed func()) error {
	var cg *cgroup.Cgroup
	var worker *criu.Worker
	if pre != nil {
		cg, worker = pre.cg, pre.worker
	} else {
		endCg := trace.Step(ctx, "make the cgroup, set its limits")
		var err error
		cg, err = cgroup.Create(cgName, rt.CgroupParent)
		if err != nil {
			endCg()
			return fmt.Errorf("fork %s: %w", c.ID, err)
		}
		c.Cgroup, c.CgroupV2 = cg.Paths, cg.V2
		err = cg.SetLimits(container.Limits(c))
		endCg()
		if err != nil {
			return fmt.Errorf("fork %s: %w", c.ID, err)
		}
		// The service's worker for the restore is moved into the group while the root
		// is mounted and the network namespace made: the move waits for an RCU grace
		// period.
		if svc != nil && netns == "" {
			worker = svc.PrepareWorker(ctx, criu.ServiceCgroupsFor(s.CheckpointDir, cg.ProcsFiles(), cg.AllProcsFiles()))
		}
	}
	defer worker.Close() // unless the restore took it
	layer := overlay.Layer{Lower: c.Lower, Upper: upper, Work: c.Work, Target: c.RootFS}
	endMount := trace.Step(ctx, "mount the overlay")
	err := overlay.Prepare(layer)
	endMount()
	if err != nil {
		return fmt.Errorf("fork %s: %w", c.ID, err)
	}
	work := filepath.Join(paths.Run(), "work", c.ID)
	defer fsutil.RemoveAll(work)
	// A fork (not the source restored in place) inherits sockets bound to its parent's
	// address; see network.Attachment.
	parentAddr := ""
	if c.Net == container.NetBridge && s.Addr != "" && s.Addr != c.Addr {
		parentAddr = s.Addr
	}
	// A confined --net none container cannot change its namespace (no CAP_NET_ADMIN):
	// a fresh one with loopback up is all its image's would give, and making it is far
	// cheaper than CRIU's restore of the dumped one (which runs ip and iptables-restore).
	// A privileged one keeps CRIU's restore (its sysctls and firewall rules).
	freshNone := s.Net == container.NetNone && netns == "" && !s.SharedNetNS && s.Confine != nil && !s.Confine.Privileged
	// Dumped from inside its namespace (see Dump), the checkpoint holds none: the tree
	// joins a new one with loopback up instead of criu's (the host's). Decided by what the
	// checkpoint holds, not by the document's confinement.
	joinNetNS := ""
	if s.Net == container.NetNone && netns == "" && !criu.CheckpointHasNetNS(s.CheckpointDir) {
		var ns *network.NetNS
		if pre != nil && pre.netns != nil {
			ns, pre.netns = pre.netns, nil // made during the dump
		} else {
			endNS := trace.Step(ctx, "new network namespace")
			var err error
			ns, err = network.NewNetNS()
			endNS()
			if err != nil {
				return fmt.Errorf("fork %s: %w", c.ID, err)
			}
		}
		defer ns.Release() // the restored tree holds the namespace from here on
		joinNetNS, freshNone = ns.Path, false
	}
	// Connections come back one socket at a time: until every one is there, a restored
	// socket's packets would be answered with resets (network.LockTCP). Locked from
	// before the first socket (the namespace is made here, or by CRIU: at
	// setup-namespaces) until post-restore, when all are there and still in repair mode
	// (CRIU takes them out of it later).
	var conns network.TCPLock
	lockTCP := func(nsPath string) error {
		if conns.Held() || netns != "" || !criu.CheckpointHasTCP(s.CheckpointDir) {
			return nil
		}
		return conns.Lock(nsPath)
	}
	defer func() { _ = conns.Unlock() }() // a failed restore: its namespace goes with it anyway
	if joinNetNS != "" {
		if err := lockTCP(joinNetNS); err != nil {
			return fmt.Errorf("fork %s: %w", c.ID, err)
		}
	}
	rctx, endRestore := trace.Start(ctx, "criu restore")
	res, err := criu.Restore(rctx, criu.RestoreOptions{
		CheckpointDir:  s.CheckpointDir,
		WorkDir:        work,
		Root:           c.RootFS,
		CgroupRoots:    cg.CriuRootArgs(),
		ExternalMounts: map[string]string{memKey: s.FamilyDir},
		NetworkLock:    criu.NetworkLockSkip, // see Dump
		TCPEstablished: s.Net == container.NetNone || s.Net == container.NetBridge,
		// Bridge mode: the namespace is made here, with the fork's own address, before
		// CRIU restores sockets into it (setup-namespaces below).
		EmptyNetNS: (s.Net == container.NetBridge && netns == "") || freshNone,
		JoinNetNS:  joinNetNS,
		Timeout:    RestoreTimeout,
		KdatDir:    kdatDir(),
		Binary:     rt.CRIU,
		JoinCgroup: cg.ProcsFiles(),
		// With the service, criu's worker joins every group of the fork and the tree is
		// cloned into them; criu's own cgroup restore is skipped when the checkpoint allows.
		JoinCgroupAll: cg.AllProcsFiles(),
		Service:       svc,
		Worker:        worker,
		Hold:          hold,
		NetNS:         netns,
		Notify: func(script string, pid int) error {
			if script == "post-resume" && resumed != nil {
				resumed() // criu tells no pid with this one
			}
			if pid <= 0 {
				return nil
			}
			switch script {
			case "setup-namespaces":
				if joinNetNS == "" {
					if err := lockTCP(fmt.Sprintf("/proc/%d/ns/net", pid)); err != nil {
						return err
					}
				}
				if freshNone {
					return network.LoopbackUp(pid)
				}
				return container.AttachNetwork(pid, c, parentAddr)
			case "post-restore":
				// Every socket is back, still in repair mode: restored connections would
				// keep IPv4's 524-byte minimum segment (network.ResyncTCPMSS says why).
				// Not fatal: a connection it could not reach only keeps small segments.
				if criu.CheckpointHasTCP(s.CheckpointDir) {
					t := time.Now()
					_, _ = network.ResyncTCPMSS(pid)
					trace.Add(ctx, "post-restore: resync tcp segment sizes", t, time.Since(t))
				}
				if err := conns.Unlock(); err != nil {
					return err
				}
				// A namespace CRIU restored has its dumped ruleset back: the dump's lock
				// (see Dump) too, which nothing else would remove.
				if joinNetNS == "" && netns == "" && criu.CheckpointHasNetNS(s.CheckpointDir) {
					if err := network.UnlockTCP(fmt.Sprintf("/proc/%d/ns/net", pid)); err != nil {
						return err
					}
				}
				// A cluster fork's members may all hold the parent's sockets: closed
				// once every one is restored (restoreCluster).
				if parentAddr != "" && netns == "" {
					// Copies of the parent's connections to the outside would speak
					// with the parent's address: closed before the fork runs.
					if err := network.CloseInherited(pid, parentAddr); err != nil {
						return err
					}
				}
				// CRIU restores the source's UTS namespace; rename it before the tasks
				// resume so the workload never sees its parent's hostname. A hostname the
				// workload set itself (a privileged one can) is its own: it stays, and
				// the fork's record says so (zdtm utsname).
				if rename {
					kept, err := renameHost(pid, s.Source.ID, c.Hostname)
					if kept != "" {
						c.Hostname = kept
					}
					return err
				}
			}
			return nil
		},
	})
	endRestore()
	if err != nil {
		return fmt.Errorf("fork %s from %s: %w", c.ID, s.ID, err)
	}
	// Reap the restored init if we live long enough (tests, daemon).
	go func() { _, _ = res.Process.Wait() }()
	defer trace.Step(ctx, "read the restored init's start time")()
	c.Pid = res.Pid
	c.StartTime, err = container.StartTime(res.Pid)
	if err != nil {
		return fmt.Errorf("fork %s: restored pid %d: %w", c.ID, res.Pid, err)
	}
	c.State = store.StateRunning
	c.Owner = 0
	return nil
}

// addrOnly is the address of a record's "10.88.0.2/16", "" if none.
func addrOnly(cidr string) string {
	if p, err := netip.ParsePrefix(cidr); err == nil {
		return p.Addr().String()
	}
	return ""
}

// renameHost sets the hostname of pid's UTS namespace to name if it is still given, the
// one LazyFork gave the source (its id); else it returns the hostname the workload set,
// left as it is. It runs on a locked OS thread that is thrown away afterwards (it keeps
// the foreign namespace).
func renameHost(pid int, given, name string) (kept string, err error) {
	err = nsthread.RunPid(pid, "uts", unix.CLONE_NEWUTS, func() error {
		var u unix.Utsname
		if err := unix.Uname(&u); err != nil {
			return err
		}
		if cur := unix.ByteSliceToString(u.Nodename[:]); given != "" && cur != given {
			kept = cur
			return nil
		}
		return unix.Sethostname([]byte(name))
	})
	if err != nil {
		return "", fmt.Errorf("set hostname of %d: %w", pid, err)
	}
	return kept, nil
}
