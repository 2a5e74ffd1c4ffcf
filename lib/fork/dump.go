// Package fork is the fork pipeline: dump a running container with CRIU (Dump), move the
// image's memory into the family's memory files on tmpfs (Memfile), restore it as N new
// containers (Restore); plus stop/start and the reference counting of memory files and
// frozen layers (GC). The stage binaries and the porcelain both call these functions.
package fork

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/guard"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/memfile"
	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/snapshot"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// memKey names the /.lazyfork/mem bind in CRIU images (an external mount).
const memKey = "lfmem"

// Deadlines for CRIU calls: it can hang with all signals blocked, so every call ends.
var (
	DumpTimeout    = 2 * time.Minute
	RestoreTimeout = time.Minute
)

// ErrAllocator refuses a workload whose allocator relies on MADV_DONTNEED zero-fill.
var ErrAllocator = errors.New("unsupported allocator")

// ErrUserfaultfd refuses a workload holding a userfaultfd: CRIU has no dumper for one
// ("Can't dump file N of that type ... anon_inode:[userfaultfd]"), so no dump can succeed.
var ErrUserfaultfd = errors.New("holds a userfaultfd, which CRIU cannot checkpoint")

// ErrWatchNoPath refuses a workload watching, with inotify or fanotify, a file deleted
// while still open: CRIU saves a watch by the file's handle and reopens it by handle or
// by a path it finds; overlayfs gives no handles without nfs_export (which LazyFork's
// swap cannot use: docs/zdtm.md, inotify00) and a deleted file has no path ("fsnotify:
// Can't dump that handle"). Watches on files with a name fork (irmap).
var ErrWatchNoPath = errors.New("watches a file deleted while open (inotify/fanotify), which CRIU cannot checkpoint on overlayfs")

// DumpOptions tune a dump.
type DumpOptions struct {
	Exit  bool // end the source after the dump (lazyfork stop)
	Force bool // dump even if an unsupported allocator is mapped
	// Hook: how long to wait for the runtime hook's answer to QUIESCE, and whether to
	// snapshot anyway when it does not answer in time (default: fail). See lib/hook.
	Hook hook.Options
	// Swap leaves the source frozen after the dump with its upper directory moved (not
	// copied) to the snapshot's layer, for Swap in lifecycle.go to restore the source from
	// the snapshot and end the frozen processes, or to undo. The snapshot says whether it
	// happened (Snapshot.Swap): a tree holding a stopped task cannot be frozen first and
	// is copied as before.
	Swap bool
	// NetNS dumps from inside this network namespace (a cluster's): the checkpoint then holds
	// no namespace (Snapshot.SharedNetNS). Cut accepts a source the cluster's cut froze.
	NetNS string
	Cut   bool
	// Transient records this process as the snapshot's owner when the dump is done (GC
	// drops it once the process is gone): one write of the record instead of two, and no
	// moment where a crash leaves an ownerless snapshot of a live source behind.
	Transient bool
	// SmallPages: a swap's preallocated memory files stay in 4 KiB pages; HugePages: their
	// dense stretches are huge pages however slowly fresh ones come. Neither: huge pages
	// while they come fast (memfile.HugePagesWhileFast).
	SmallPages, HugePages bool
	// ready, for a swap, makes the new source's cgroup and criu worker while the source
	// runs (swapReady); Swap takes them. Undone here when no swap follows.
	ready *swapReady
	// Thawed, if set, is called once criu has returned, so with LeaveRunning (and no
	// Swap) once the source runs again: a repeat fork's early work waits for it.
	Thawed func()
}

// hugePolicy is how a swap's preallocation makes huge pages.
func (o DumpOptions) hugePolicy() memfile.HugePolicy {
	switch {
	case o.SmallPages:
		return memfile.NoHugePages
	case o.HugePages:
		return memfile.HugePagesAlways
	}
	return memfile.HugePagesWhileFast
}

// swapCannotCarry reports whether c's processes hold something a swap would change for
// them, so that a copy must be made instead.
func swapCannotCarry(cg *cgroup.Cgroup, c *store.Container) bool {
	if pid, _ := unlinkedWithOtherNames(cg); pid != 0 {
		// CRIU carries such a file by a hard link it makes beside the old name and
		// deletes after the dump: in a swap the upper is the snapshot's layer by then,
		// and the link would be gone from it (zdtm unlink_fstat03). A copy keeps it.
		return true
	}
	if wholeFileLock(cg, c.RootFS) {
		// A swap runs the source on a new overlay mount: every file's device number
		// changes. A program that recorded it checks it against the lock it holds
		// (zdtm file_locks01 compares fstat's st_dev with /proc's lock record). A copy
		// leaves the source on its mount.
		return true
	}
	if breakingLease(cg) {
		// CRIU restores a lease being broken by breaking it again, and the signal that
		// sends reaches the program (zdtm file_lease02-04): a swap would do that to the
		// source itself. A copy leaves the source as it is.
		return true
	}
	if c.Net == container.NetNone || c.Net == container.NetBridge {
		if _, queued := tcpSockets(c.Pid); queued {
			// CRIU leaves out a listener's connections no accept() took yet (see
			// criu.DumpOptions): a swap restores the source without them, and their
			// clients would be reset. A copy leaves the source's queue alone.
			return true
		}
	}
	// A restore changes what these observe: fanotify marks come back other than they
	// were (zdtm fanotify00 fails in a plain CRIU copy too). A swap would do that to the
	// source; a copy does not.
	pid, _ := lossyDescriptor(cg)
	return pid != 0
}

// dumpsInOwnNetNS: c is dumped from inside its own network namespace (a confined --net
// none container), so its checkpoint holds none and every restore makes a fresh one.
func dumpsInOwnNetNS(c *store.Container) bool {
	return c.Net == container.NetNone && c.Cluster == "" && c.Confine != nil && !c.Confine.Privileged
}

// LayersDir holds the frozen upper layers forks stack on.
func LayersDir() string { return paths.Layers() }

func kdatDir() string { return criu.DefaultKdatDir() }

// Dump checkpoints c's whole process tree and freezes its upper layer at the same
// instant. The source keeps running unless o.Exit.
func Dump(ctx context.Context, rt *container.Runtime, c *store.Container, o DumpOptions) (out *stage.Snapshot, retErr error) {
	defer busy()()
	ctx, end := trace.Start(ctx, "dump")
	defer end()
	// What o.ready made goes unless the source was left frozen for the swap's restore.
	defer func() {
		if retErr != nil || out == nil || !out.Swap {
			o.ready.abort()
		}
	}()
	endChecks := trace.Step(ctx, "check the source (state, cgroup, processes)")
	defer func() { endChecks() }()
	name := c.Display()
	// The record names the processes, cgroup and upper the dump reads: refuse one that
	// names anything LazyFork did not make (a forged container.json, `lf-tree put`).
	if err := stage.CheckRecord(c); err != nil {
		return nil, fmt.Errorf("dump %s: %w", name, err)
	}
	state := rt.State(c)
	if o.Cut && state == store.StateFrozen {
		state = store.StateRunning // frozen by ForkCluster for the cut, not by the user
	}
	if err := guard.Check(guard.OpDump, c, state); err != nil {
		return nil, err
	}
	cg, err := cgroup.LoadOwned(c.Cgroup)
	if err != nil {
		return nil, fmt.Errorf("dump %s: %w", name, err)
	}
	// CRIU dumps the tree under c.Pid: it must be one of the container's own processes.
	pids, err := cg.Procs()
	if err != nil {
		return nil, fmt.Errorf("dump %s: %w", name, err)
	}
	if !slices.Contains(pids, c.Pid) {
		return nil, fmt.Errorf("dump %s: %w: its pid %d is not one of its cgroup's processes", name, stage.ErrForged, c.Pid)
	}
	endChecks()
	endChecks = trace.Step(ctx, "look for zero-fill allocators in the maps")
	if !o.Force {
		if libs := liveAllocators(cg); len(libs) > 0 {
			return nil, fmt.Errorf("dump %s: %w %s: it relies on MADV_DONTNEED returning zeros, which memory files do not; use glibc malloc, or --force to fork anyway", name, ErrAllocator, strings.Join(libs, ", "))
		}
	}

	endChecks()
	endChecks = func() {}
	// From here on the dump makes what no record references yet: GC waits.
	endLock := trace.Step(ctx, "state lock (shared)")
	unlock, hold, err := lockSharedHeld(ctx)
	endLock()
	if err != nil {
		return nil, fmt.Errorf("dump %s: %w", name, err)
	}
	defer unlock()

	id := newSnapshotID()
	s := &stage.Snapshot{
		Kind: stage.KindSnapshot, Version: stage.Version, ID: id, State: stage.SnapDumping,
		Dir: filepath.Join(paths.Snapshots(), id), Created: time.Now().UTC(),
		Source:      stage.Source{ID: c.ID, Name: c.Name, Depth: c.Depth, Pid: c.Pid},
		LeftRunning: !o.Exit,
		Owner:       os.Getpid(),
		Family:      c.Family,
		Layer:       filepath.Join(LayersDir(), id),
		Image:       c.Image, Command: c.Command, Env: c.Env, WorkingDir: c.WorkingDir, Hook: c.Hook,
		Confine: c.Confine, Memory: c.Memory, PidsLimit: c.PidsLimit, Net: c.Net,
		Bridge: c.Bridge, Addr: c.Addr, NAT: c.NAT, SharedNetNS: o.NetNS != "",
	}
	if s.Family == "" {
		s.Family = id // a root container's first generation of forks starts a family
	}
	s.FamilyDir = filepath.Join(paths.Families(), s.Family)
	s.CheckpointDir = filepath.Join(s.Dir, "images")
	s.Lower = append([]string{s.Layer}, c.Lower...)

	defer func() {
		if retErr != nil {
			_ = fsutil.RemoveAll(s.Dir)
			_ = fsutil.RemoveAll(s.Layer)
		}
	}()
	// The record exists before anything it references, so GC never sees an orphan.
	endSave := trace.Step(ctx, "save the snapshot record, make its directories")
	if err := Save(s); err != nil {
		return nil, fmt.Errorf("dump %s: %w", name, err)
	}
	if err := os.MkdirAll(s.CheckpointDir, 0o700); err != nil {
		return nil, fmt.Errorf("dump %s: %w", name, err)
	}
	if err := os.MkdirAll(LayersDir(), 0o700); err != nil {
		return nil, err
	}
	endSave()

	swap := o.Swap && !o.Exit
	var cannotCarry chan bool
	if swap {
		o.ready.start(ctx, rt, c, s)
		// What a swap cannot carry is looked for beside the preallocation (they read
		// /proc: ~20 ms here), not after it.
		cannotCarry = make(chan bool, 1)
		go func() { cannotCarry <- swapCannotCarry(cg, c) }()
	}
	// Whether this criu's page server can feed the memory files: a criu start (~7 ms) the
	// first time a process asks, beside the preallocation rather than after it.
	var wide chan bool
	if swap && c.Family == "" {
		wide = make(chan bool, 1)
		go func() { wide <- criu.SpeaksWidePageServer(ctx, rt.CRIU) }()
	}
	// A source's first swap (it runs on its own memory): its memory files' pages are
	// allocated now, while it runs, so that the rewrite it is frozen for writes into them.
	var pre memfile.Preallocated
	var preTime time.Duration
	if swap && c.Family == "" {
		endPre := trace.Step(ctx, "preallocate the memory files' pages")
		pre, preTime = preallocTimed(cg, s, o.hugePolicy())
		endPre()
		if pre.HugeSlow {
			trace.Step(ctx, "preallocate: fresh huge pages came slowly, the rest in small pages")()
		}
		defer func() {
			if retErr != nil {
				dropPrealloc(s)
			}
		}()
	}
	endHook := trace.Step(ctx, "hook: quiesce")
	err = hook.Quiesce(ctx, c, o.Hook)
	endHook()
	if err != nil {
		return nil, fmt.Errorf("dump %s: %w", name, err)
	}
	endSwapChecks := trace.Step(ctx, "swap: check what a swap cannot carry")
	if swap {
		if tid, _ := criu.StoppedTask(cg.FreezerDir()); tid != 0 {
			swap = false // freezing first would hang on it (see criu.StoppedTask)
		} else if <-cannotCarry {
			swap = false // a copy keeps what a swap would change (swapCannotCarry)
		} else {
			// Recorded before the freeze: should this process die from here on, GC finds
			// the snapshot's owner gone and gives the source back (recoverSwap).
			endSwapChecks()
			endSwapChecks = trace.Step(ctx, "swap: record it")
			s.Swap = true
			if err := Save(s); err != nil {
				return nil, fmt.Errorf("dump %s: %w", name, err)
			}
			endSwapChecks()
			endSwapChecks = func() {}
			// The new source's group and worker are ready before the pause starts.
			endReady := trace.Step(ctx, "swap: wait for the new source's cgroup and criu worker")
			o.ready.wait()
			endReady()
		}
		// Frozen at CRIU's pre-dump notification, just before CRIU freezes it itself, the
		// group stays frozen after the dump (CRIU restores the freezer state it found):
		// the source is paused until Swap ends or undoes it.
	}
	endSwapChecks()
	moved := false
	defer func() {
		if retErr != nil && swap {
			if moved {
				retErr = errors.Join(retErr, os.Rename(s.Layer, c.Upper))
			}
			retErr = errors.Join(retErr, cg.Thaw())
		}
	}()
	// A source's first swap: CRIU sends the pages to a page server that writes them into
	// the memory files (allocated above) at once, instead of into pages images that the
	// rewrite would copy again while the source is frozen. One process only: the rewrite
	// finds the pages a process shares copy-on-write with its parent (a pre-forking
	// server's workers) by comparing pages images (one forked before the freeze is
	// restored right, its shared pages stored twice). CRIU 4.2 and later only: 4.1's
	// page-server header is another size (its dumps hung on the server in the v2 guest).
	var ps *memfile.PageServer
	var psConn *os.File
	if swap && c.Family == "" && <-wide && singleProcess(cg) && snapshot.MakeFamilyDir(s.FamilyDir) == nil {
		if ps, err = memfile.StartPageServer(s.CheckpointDir, s.FamilyDir, s.ID); err == nil {
			psConn = ps.Conn
			defer func() {
				if ps != nil {
					ps.Abort()
				}
			}()
		} else {
			ps = nil // pages images as ever
		}
	}
	var layerTime time.Duration
	// Every restore of a confined --net none snapshot gives the tree a fresh namespace
	// with loopback up (startIn): what CRIU would dump of the container's namespace is
	// never used. So criu dumps from inside that namespace, and the checkpoint holds none:
	// no ip, iptables-save and nft runs (once half of a later fork's pause), and no walk of
	// the conntrack tables, which CRIU makes for every namespace it dumps, empty or not,
	// and which reads the host's whole conntrack hash (~25 ms of a repeat fork's pause).
	netns := o.NetNS
	if netns == "" && dumpsInOwnNetNS(c) {
		netns = fmt.Sprintf("/proc/%d/ns/net", c.Pid) // c.Pid is the group's (checked above)
	}
	tcpEstablished := c.Net == container.NetNone || c.Net == container.NetBridge
	// Connections are locked from just before the freeze until every socket is saved
	// (network.LockTCP says why). Only where there are some: a lock costs the dump two
	// netlink transactions, and the source's in-flight segments a retransmission.
	lockTCP := tcpEstablished && tcpConnected(c.Pid)
	var conns network.TCPLock
	defer func() { _ = conns.Unlock() }()
	res, err := criu.Dump(ctx, criu.DumpOptions{
		PageServer:     psConn,
		NetNS:          netns,
		Pid:            c.Pid,
		CheckpointDir:  s.CheckpointDir,
		LeaveRunning:   !o.Exit,
		FreezeCgroup:   cg.FreezerDir(),
		ExternalMounts: map[string]string{container.MemMount: memKey},
		// A container's own network namespace holds loopback only, and its processes are
		// frozen: nothing to lock (and these hosts have no iptables for CRIU's default).
		NetworkLock: criu.NetworkLockSkip,
		// In a namespace of its own (--net none) both ends of every TCP connection are in
		// the container: each fork gets the pair, connected, in its own namespace.
		// Bridge mode too: forks close their copies of connections that leave the
		// namespace (lib/network.CloseInherited); the source keeps them.
		TCPEstablished: tcpEstablished,
		Timeout:        DumpTimeout,
		KdatDir:        kdatDir(),
		Binary:         rt.CRIU,
		// A criu that outlives this process (killed) finishes or rolls back the dump;
		// GC must not give the source back before (criu would freeze it again).
		Hold: hold,
		Notify: func(script string, _ int) error {
			if script == "pre-dump" && lockTCP {
				if err := conns.Lock(fmt.Sprintf("/proc/%d/ns/net", c.Pid)); err != nil {
					return err
				}
			}
			if script == "pre-dump" && swap {
				// As late as can be: criu has set itself up and freezes the tree next.
				endFreeze := trace.Step(ctx, "freeze the source")
				defer endFreeze()
				return cg.Freeze()
			}
			if script != "post-dump" {
				return nil
			}
			if err := conns.Unlock(); err != nil {
				return err
			}
			// The tasks are still frozen: the file system copy matches the memory image
			// (CRIU checks open files by size on restore).
			t := time.Now()
			defer func() { layerTime = time.Since(t); trace.Add(ctx, "post-dump: freeze the upper layer", t, layerTime) }()
			if swap {
				// The upper itself becomes the layer: no copy, and every file keeps its
				// inode number, which programs such as SQLite check. The frozen source's
				// overlay still writes there if the swap is undone (renamed back).
				if err := os.Rename(c.Upper, s.Layer); err != nil {
					return fmt.Errorf("freeze layer: %w", err)
				}
				moved = true
				return nil
			}
			return copyTree(ctx, c.Upper, s.Layer)
		},
	})
	if o.Thawed != nil {
		o.Thawed()
	}
	if ps != nil {
		psConn.Close() // criu's copy: the stream ends with criu
		_, _, perr := ps.Wait(10 * time.Second)
		ps.Abort()
		ps = nil
		// The server's own failure (a full tmpfs) is the cause of criu's ("Broken pipe").
		if perr != nil && !(err != nil && errors.Is(perr, memfile.ErrStreamCut)) {
			err = errors.Join(perr, err)
		}
	}
	if err != nil {
		// Named after the fact, not looked for before every dump (a walk of every
		// descriptor): CRIU's line names the descriptor's number, not its process.
		if strings.Contains(err.Error(), "anon_inode:[userfaultfd]") {
			if pid, _ := findFd(cg, func(_, target string) string {
				if target == "anon_inode:[userfaultfd]" {
					return target
				}
				return ""
			}); pid != 0 {
				return nil, fmt.Errorf("dump %s: process %d (%s) %w; close it before forking", name, pid, procComm(pid), ErrUserfaultfd)
			}
		}
		if strings.Contains(err.Error(), "Can't dump that handle") {
			if pid, what := watchWithoutPath(cg, err); pid != 0 {
				return nil, fmt.Errorf("dump %s: process %d (%s) %w (%s); remove the watch, or keep a name for the file, before forking", name, pid, procComm(pid), ErrWatchNoPath, what)
			}
		}
		return nil, fmt.Errorf("dump %s: %w", name, err)
	}
	s.State, s.Owner, s.Swap = stage.SnapDumped, 0, swap
	if swap || o.Transient {
		s.Owner = os.Getpid() // transient until the swap is done (see recoverSwap) or as asked
	}
	endSize := trace.Step(ctx, "size the checkpoint")
	checkpointBytes := dirBytes(s.CheckpointDir)
	endSize()
	s.Dump = stage.DumpStats{
		WallMs: stage.Ms(res.Wall), FrozenMs: stage.Ms(res.Frozen), LayerMs: stage.Ms(layerTime),
		PagesWritten: res.PagesWritten, PagesScanned: res.PagesScanned, CheckpointBytes: checkpointBytes,
		PreallocMs: stage.Ms(preTime), PreallocBytes: pre.Bytes, PreallocHugePages: pre.HugePages, PreallocHugeSlow: pre.HugeSlow, PagesPlaced: psConn != nil,
	}
	defer trace.Step(ctx, "save the snapshot record")()
	if err := Save(s); err != nil {
		return nil, err
	}
	return s, nil
}

// tcpConnected reports whether the network namespace of pid holds a TCP socket in a
// connected state (/proc/PID/net/tcp{,6}: anything but LISTEN, CLOSE and TIME_WAIT, which
// no process owns).
func tcpConnected(pid int) bool {
	connected, _ := tcpSockets(pid)
	return connected
}

// tcpSockets reports whether the network namespace of pid holds a TCP socket in a
// connected state, and whether a listener there holds connections no accept() took yet.
func tcpSockets(pid int) (connected, queued bool) {
	if !network.TCPInUse(fmt.Sprintf("/proc/%d/net", pid)) {
		return false, false // no TCP socket at all: no walk of the host's connection table
	}
	for _, f := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// "  0: 0100007F:22B0 0100007F:A1C4 01 00000000:00000000 ...": the fourth
			// field is the state, the fifth tx:rx queue, a listener's rx its accept queue.
			fs := strings.Fields(line)
			if len(fs) < 5 {
				continue
			}
			switch fs[3] {
			case "0A":
				if _, rx, ok := strings.Cut(fs[4], ":"); ok && strings.Trim(rx, "0") != "" {
					queued = true
				}
			case "07", "06":
			default:
				connected = true
			}
		}
	}
	return connected, queued
}

// singleProcess reports whether the group holds one process (threads aside).
func singleProcess(cg *cgroup.Cgroup) bool {
	pids, err := cg.Procs()
	return err == nil && len(pids) == 1
}

// LayerCopyTimeout bounds the copy of a container's upper directory, which runs while
// its processes are frozen (CRIU's post-dump callback): a copy that hangs (a stuck file
// system) fails the dump instead of keeping the source paused.
var LayerCopyTimeout = time.Minute

// copyTree copies an overlay upper directory with everything overlayfs keeps in it
// (whiteout devices, opaque xattrs, ownership, hard links): fsutil.CopyTree, as `cp -a`
// would, without starting a process while the source is paused.
func copyTree(ctx context.Context, src, dst string) error {
	ctx, cancel := context.WithTimeout(ctx, LayerCopyTimeout)
	defer cancel()
	err := fsutil.CopyTree(ctx, src, dst)
	if ctx.Err() != nil {
		return fmt.Errorf("freeze layer: the copy of %s did not finish within %v (the source stays paused while it runs): %w", src, LayerCopyTimeout, ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("freeze layer: %w", err)
	}
	return nil
}

// findFd walks the open descriptors of every process of the group and returns the first
// for which match(fd path, link target) gives a non-empty answer, with its pid, or 0.
func findFd(cg *cgroup.Cgroup, match func(path, target string) string) (int, string) {
	pids, err := cg.Procs()
	if err != nil {
		return 0, ""
	}
	for _, pid := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			path := filepath.Join(dir, e.Name())
			if target, err := os.Readlink(path); err == nil {
				if found := match(path, target); found != "" {
					return pid, found
				}
			}
		}
	}
	return 0, ""
}

// unlinkedWithOtherNames finds a process of the group holding open a file whose name was
// removed while other hard links to it remain (CRIU's "link remap" case), and its path.
func unlinkedWithOtherNames(cg *cgroup.Cgroup) (int, string) {
	return findFd(cg, func(path, target string) string {
		if !strings.HasPrefix(target, "/") || !strings.HasSuffix(target, " (deleted)") {
			return ""
		}
		var st unix.Stat_t
		if unix.Stat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 0 {
			return strings.TrimSuffix(target, " (deleted)")
		}
		return ""
	})
}

// groupLocks calls match with the fields of every /proc/locks line held by a process of
// the group ("1: FLOCK  ADVISORY  WRITE 1234 00:3f:5678 0 EOF") or with no owner (an OFD
// lock's pid is -1) and reports whether match said yes to one.
func groupLocks(cg *cgroup.Cgroup, match func(f []string) bool) bool {
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return false
	}
	pids, err := cg.Procs()
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || (f[4] != "-1" && !slices.Contains(pids, atoiOr(f[4], 0))) {
			continue
		}
		if match(f) {
			return true
		}
	}
	return false
}

// breakingLease reports whether a process of the group holds a file lease that is being
// broken (/proc/locks: "N: LEASE  BREAKING  TYPE PID ...").
func breakingLease(cg *cgroup.Cgroup) bool {
	return groupLocks(cg, func(f []string) bool { return f[1] == "LEASE" && f[2] == "BREAKING" && f[4] != "-1" })
}

// wholeFileLock reports whether a flock(2) or open-file-description lock is held on a file
// of the container's own overlay mount (root): /proc/locks names the locked inode by its
// device. POSIX (fcntl) record locks are left out: SQLite takes them for every write and,
// in WAL mode, holds one as long as a connection is open, and forks of such programs keep
// their swap (they check inode numbers, which a swap keeps).
func wholeFileLock(cg *cgroup.Cgroup, root string) bool {
	var st unix.Stat_t
	if root == "" || unix.Stat(root, &st) != nil {
		return false
	}
	dev := fmt.Sprintf("%02x:%02x:", unix.Major(st.Dev), unix.Minor(st.Dev))
	return groupLocks(cg, func(f []string) bool {
		return len(f) >= 6 && (f[1] == "FLOCK" || f[1] == "OFDLCK") && strings.HasPrefix(f[5], dev)
	})
}

func atoiOr(s string, def int) int {
	if n, err := strconv.Atoi(s); err == nil {
		return n
	}
	return def
}

// procComm is a process's command name, for messages ("?" if it is gone).
func procComm(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// handleRe is CRIU's warning before "Can't dump that handle": the watched inode.
var handleRe = regexp.MustCompile(`Handle 0x[0-9a-f]+:0x([0-9a-f]+) cannot be opened`)

// watchWithoutPath finds the process of the group whose inotify or fanotify mark CRIU
// could not save (dumpErr's log names the inode; without it, the first mark on a file
// open as deleted), and says which file it is.
func watchWithoutPath(cg *cgroup.Cgroup, dumpErr error) (int, string) {
	want := ""
	var ce *criu.Error
	if errors.As(dumpErr, &ce) {
		if m := handleRe.FindStringSubmatch(ce.Excerpt); m != nil {
			want = m[1]
		}
	}
	deleted := map[string]string{} // inode (hex) of a file open as deleted -> its old path
	_, _ = findFd(cg, func(path, target string) string {
		var st unix.Stat_t
		if strings.HasSuffix(target, " (deleted)") && unix.Stat(path, &st) == nil {
			deleted[strconv.FormatUint(st.Ino, 16)] = target
		}
		return ""
	})
	pid, what := findFd(cg, func(path, target string) string {
		if target != "anon_inode:inotify" && target != "anon_inode:[fanotify]" {
			return ""
		}
		b, _ := os.ReadFile(strings.Replace(path, "/fd/", "/fdinfo/", 1))
		for _, l := range strings.Split(string(b), "\n") {
			i := strings.Index(l, " ino:")
			if !strings.HasPrefix(l, "inotify ") && !strings.HasPrefix(l, "fanotify ") || i < 0 {
				continue
			}
			ino := strings.Fields(l[i+len(" ino:"):])[0]
			if ino == want || want == "" && deleted[ino] != "" {
				if f := deleted[ino]; f != "" {
					return fmt.Sprintf("inode 0x%s, %s", ino, f)
				}
				return "inode 0x" + ino
			}
		}
		return ""
	})
	return pid, what
}

// lossyDescriptor returns a process of the group holding a descriptor that a restore does
// not give back as it was (fanotify), and its kind, or 0. (A userfaultfd cannot be
// dumped at all: ErrUserfaultfd.)
func lossyDescriptor(cg *cgroup.Cgroup) (int, string) {
	return findFd(cg, func(_, target string) string {
		if target == "anon_inode:[fanotify]" {
			return "fanotify"
		}
		return ""
	})
}

// liveAllocators looks for allocators that assume MADV_DONTNEED zero-fill in the maps of
// every process of the container.
func liveAllocators(cg *cgroup.Cgroup) []string {
	pids, err := cg.Procs()
	if err != nil {
		return nil
	}
	found := map[string]bool{}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 6 {
				continue
			}
			if a, ok := memfile.ZeroFillAllocator(f[5]); ok {
				found[a] = true
			}
		}
	}
	var out []string
	for a := range found {
		out = append(out, a)
	}
	return out
}

func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}
