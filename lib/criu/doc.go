// Package criu runs CRIU for LazyFork: dump a process tree, restore it, ask the version and
// check the kernel. A call starts its own `criu swrk` child, or (a restore with
// RestoreOptions.Service) gets a worker of a long-lived `criu service`; either way it talks
// go-criu's rpc protobufs over a SOCK_SEQPACKET socket, answers CRIU's NOTIFY messages
// through an optional callback, and is bounded by a context deadline that ends in SIGKILL of
// criu or of the worker (it can hang with all signals blocked). go-criu's own client is not
// used: it has no deadline and leaks its socket into concurrently started children.
//
//	Dump(ctx, DumpOptions) (*DumpResult, error)
//	Restore(ctx, RestoreOptions) (*RestoreResult, error)
//	StartService(ctx, kdatDir, binary) (*Service, error); (*Service).Close()
//	(*Service).PrepareWorker(ctx, joinProcs) *Worker; (*Worker).Close()
//	Version(ctx, binary) (major, minor, patch int, err error)
//	Check(ctx, binary) error
//
// binary is the operator's CRIU (--criu / $LAZYFORK_CRIU, which the mains read; also
// DumpOptions.Binary and RestoreOptions.Binary): "" means FindBinary's default, the
// private one from `make setup`, else the distribution's.
//
// Service: a restore through swrk pays for exec'ing criu and, to join the fork's cgroups,
// the helper below (~30 ms of a ~55 ms fork here). A service worker is a fork() of an already
// running criu. The service stays in the caller's mount namespace (forks' overlays are
// mounted after it started, and a private namespace would not see them), so its workers load
// the probe cache from $XDG_RUNTIME_DIR, which criu reads for "unprivileged" requests: the
// service gets a copy of the cache a privileged criu saved. The worker's pid arrives with its
// first answer (SO_PASSCRED); Restore moves it into JoinCgroup before it clones anything.
// That move waits for an RCU grace period (8-15 ms here): PrepareWorker starts it early, so
// it overlaps the caller's own preparation (lib/fork mounts the fork's root meanwhile), and
// RestoreOptions.Worker hands the ready worker to the restore.
// Service restores are detached (criu refuses rst_sibling there): the root is the worker's
// child until the worker exits, which Restore waits for; StartService makes the caller a
// child subreaper, so the root is then the caller's child, as with swrk.
//
// Facts this package relies on (see shared/env/*.md):
//   - criu always gets CRIU_FAULT=130 in its environment: hardware breakpoints do not work in
//     some VMs and criu then hangs; the variable is harmless elsewhere.
//   - Image and work directories are passed as fds. The log and the stats file are written to
//     the work dir, so a restore with its own work dir leaves the checkpoint dir untouched and many
//     restores of one image can run at once.
//   - A call without a deadline in ctx and without Timeout gets DefaultTimeout.
//
// Restored processes: Restore sets rst_sibling, so the restored root task (the container's
// init) is created with CLONE_PARENT and becomes a child of the calling process, not of criu.
// The caller can therefore wait for it and collect its exit status (RestoreResult.Process);
// if the caller exits first, it is reparented like any orphan (to the nearest child
// subreaper or to PID 1), which reaps it. A caller that stays alive must Wait for it or it
// stays a zombie after it exits. If a restore fails or times out after criu created the root
// task, Restore kills and reaps that task itself. Restored roots must not rely on
// PR_SET_PDEATHSIG: their parent is whoever called Restore.
//
// Kernel probe cache (KdatDir): criu probes the kernel on every start (~40-60 ms) and keeps
// a cache only at /run/criu.kdat, and only when /run is a tmpfs. When KdatDir is set, /run is
// not a tmpfs and the dumped tree has its own mount namespace, criu is started in a private
// mount namespace (slave propagation, so nothing leaks back to the host) in which a
// per-criu-binary subdirectory of KdatDir, which must be on a tmpfs, is bind-mounted over
// /run. criu then loads and saves its cache there. The namespace dies with criu, so it also
// takes any mounts a SIGKILLed criu left behind (cgroup yard, mount-namespace roots) with it.
// It is skipped for trees that share the caller's mount namespace: criu would treat that
// namespace as the tree's own and dump (or restore into) it.
package criu
