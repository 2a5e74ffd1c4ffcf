package criu

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/checkpoint-restore/go-criu/v8/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// DefaultTimeout bounds a call whose context has no deadline and whose Timeout is zero.
const DefaultTimeout = 60 * time.Second

// DefaultGhostLimit is the largest open file whose every name was removed (a temporary file,
// tempfile.TemporaryFile) that a dump carries in the checkpoint; CRIU's own default is 1 MiB.
const DefaultGhostLimit = 64 << 20

// DefaultLogLevel is CRIU's debug level (-v4): the log then gives context around errors and
// names the restored root's PID, which Restore needs to clean up after an early failure.
const DefaultLogLevel = 4

// CgroupMode is CRIU's --manage-cgroups mode.
type CgroupMode int

// The zero value leaves CRIU's default (soft).
const (
	CgroupDefault CgroupMode = iota
	CgroupSoft
	CgroupFull
	CgroupStrict
	CgroupNone
	CgroupProps
	CgroupIgnore
)

// cgroupModes maps each mode to CRIU's.
var cgroupModes = [...]rpc.CriuCgMode{
	CgroupDefault: rpc.CriuCgMode_DEFAULT,
	CgroupSoft:    rpc.CriuCgMode_SOFT,
	CgroupFull:    rpc.CriuCgMode_FULL,
	CgroupStrict:  rpc.CriuCgMode_STRICT,
	CgroupNone:    rpc.CriuCgMode_CG_NONE,
	CgroupProps:   rpc.CriuCgMode_PROPS,
	CgroupIgnore:  rpc.CriuCgMode_IGNORE,
}

func (m CgroupMode) rpc() (rpc.CriuCgMode, error) {
	if m < 0 || int(m) >= len(cgroupModes) {
		return 0, fmt.Errorf("unknown cgroup mode %d", int(m))
	}
	return cgroupModes[m], nil
}

// NetworkLock is CRIU's --network-lock method; it only matters for trees with their own
// network namespace or TCP connections.
type NetworkLock int

// The zero value leaves CRIU's default (iptables, which these hosts lack: use nftables).
const (
	NetworkLockDefault NetworkLock = iota
	NetworkLockIptables
	NetworkLockNftables
	NetworkLockSkip
)

func (n NetworkLock) rpc() (*rpc.CriuNetworkLockMethod, error) {
	var m rpc.CriuNetworkLockMethod
	switch n {
	case NetworkLockDefault:
		return nil, nil
	case NetworkLockIptables:
		m = rpc.CriuNetworkLockMethod_IPTABLES
	case NetworkLockNftables:
		m = rpc.CriuNetworkLockMethod_NFTABLES
	case NetworkLockSkip:
		m = rpc.CriuNetworkLockMethod_SKIP
	default:
		return nil, fmt.Errorf("unknown network lock method %d", int(n))
	}
	return &m, nil
}

// NotifyFunc is called for each of CRIU's action-script notifications ("pre-dump",
// "post-dump", "setup-namespaces", "post-setup-namespaces", "pre-restore", "post-restore",
// "pre-resume", "post-resume", "network-lock", "network-unlock", ...). pid is the host PID of
// the tree's root task where CRIU sends one (setup-namespaces, post-restore), else 0.
// Returning an error makes CRIU abort the dump or restore. It runs while the tasks are frozen
// (post-dump) or not yet resumed (post-restore): keep it short, it counts against the deadline.
type NotifyFunc func(script string, pid int) error

// DumpOptions describe one checkpoint.
type DumpOptions struct {
	Pid           int    // host PID of the tree's root (the container's init)
	CheckpointDir string // created if missing
	WorkDir       string // log and stats-dump go here; "" means CheckpointDir
	LeaveRunning  bool
	FreezeCgroup  string // freezer cgroup directory to freeze the tree with, "" to use ptrace
	// ExternalMounts declares mounts that are not part of the checkpoint: path inside the
	// tree's mount namespace -> key (e.g. "/.lazyfork/mem" -> "lfmem").
	ExternalMounts map[string]string
	CgroupMode     CgroupMode
	// CgroupYard is where every controller is mounted as <yard>/<ctrl>, for criu to read
	// the tree's cgroups there (see RestoreOptions.CgroupYard; "" picks the same default).
	// Without one criu mounts each hierarchy anew for the dump while the tree is frozen:
	// ~1 ms each, 12 ms of a repeat fork's pause on a hybrid host.
	CgroupYard  string
	NetworkLock NetworkLock
	// File locks are dumped unless this is set: SQLite, apt, pip and databases hold them,
	// and without it CRIU refuses any tree that holds one.
	SkipFileLocks bool
	// TCPEstablished dumps established TCP connections (TCP repair). Only for a tree in a
	// network namespace of its own, where both ends of every connection are in the tree.
	TCPEstablished bool
	// EmptyNetNS dumps the tree's network namespace without its contents (links,
	// addresses, routes, rules, firewall): criu runs ip and iptables-save for those while
	// the tree is frozen. Only for trees every restore gives a fresh namespace
	// (RestoreOptions.EmptyNetNS); sockets are dumped as ever.
	EmptyNetNS bool
	GhostLimit uint32 // largest deleted-but-open file to carry in the checkpoint; 0: DefaultGhostLimit
	LogFile    string // name in WorkDir; "" means "dump.log"
	LogLevel   int    // 0 means DefaultLogLevel
	Timeout    time.Duration
	KdatDir    string // tmpfs directory for criu's kernel probe cache; "" disables it
	Notify     NotifyFunc
	// Hold is kept open by criu until it exits (the caller's state lock): a criu that
	// outlives a killed caller still holds it, so GC waits for it (swrk only).
	Hold *os.File
	// NetNS is a network namespace (a /proc/.../ns/net path) criu runs in: the tree's own
	// namespace is then criu's and is not dumped (cluster members: their shared namespace
	// is made again for each fork, and every member restored into it).
	NetNS string
	// Binary is the operator's criu (FindBinary's explicit path); "" = the default one.
	Binary string
	// PageServer, if set, is a connected stream socket criu sends the pages to with its
	// page-server protocol (memfile.PageServer) instead of writing pagemap and pages
	// images (swrk's ps.fd).
	PageServer *os.File
}

// RestoreOptions describe one restore.
type RestoreOptions struct {
	CheckpointDir string // read only: nothing is written into it
	WorkDir       string // required, one per restore; log and stats-restore go here
	Root          string // new root of the tree's mount namespace; must be a mount point
	// CgroupRoots places the tree's cgroups: "ctrl:/path" for one controller (e.g.
	// "memory:/lazyfork/f1") or "/path" for all of them.
	CgroupRoots []string
	// CgroupYard is a directory where every controller in the checkpoint is mounted as
	// <yard>/<ctrl> ("unified" for cgroup2). "" picks /sys/fs/cgroup when that is a v1 or
	// hybrid layout; otherwise CRIU mounts its own yard in the work dir (which a SIGKILLed
	// criu can leave mounted: Restore unmounts such leftovers).
	CgroupYard  string
	CgroupMode  CgroupMode
	NetworkLock NetworkLock
	// TCPEstablished restores established TCP connections dumped with it.
	TCPEstablished bool
	// EmptyNetNS gives the tree a new, empty network namespace instead of the dumped
	// one's interfaces and addresses (--empty-ns net): the caller configures it on the
	// setup-namespaces notification, before sockets are restored into it.
	EmptyNetNS bool
	// ExternalMounts maps the keys declared at dump time to host paths
	// (e.g. "lfmem" -> "/dev/shm/lazyfork/families/f1").
	ExternalMounts map[string]string
	LogFile        string // name in WorkDir; "" means "restore.log"
	LogLevel       int    // 0 means DefaultLogLevel
	Timeout        time.Duration
	KdatDir        string // see DumpOptions.KdatDir
	// JoinCgroup lists cgroup.procs files criu joins before it starts, so the kernel
	// memory of cloning the tree (task structs, stacks, namespaces) is charged to the
	// restored tree's group rather than to the caller's.
	JoinCgroup []string
	// JoinCgroupAll, when set, lists the cgroup.procs files of every hierarchy of the
	// tree's new groups, the device allow-list's included. A restore the service serves
	// then puts its worker in all of them and, when the checkpoint's cgroups are flat
	// (CheckpointCgroupsFlat), leaves cgroups to the clone (CgroupIgnore): criu no longer
	// checks each hierarchy's group, moves the root task into each again and restores
	// nothing there (LazyFork sets the limits). On cgroup v2 the worker is already under
	// the allow-list (its eBPF program is attached to the one group it joins).
	JoinCgroupAll []string
	Notify        NotifyFunc
	// Hold is kept open by criu until it exits (the caller's state lock): a criu that
	// outlives a killed caller still holds it, so GC waits for it (swrk only).
	Hold *os.File
	// NetNS is a network namespace criu runs in, and restores a tree dumped without a
	// namespace of its own (DumpOptions.NetNS) into. Served by swrk, never the service.
	NetNS string
	// JoinNetNS is a network namespace (an nsfs path) the restored tree joins (--join-ns
	// net): for a tree dumped without a namespace of its own, put in a new one made by the
	// caller instead of criu's. The service serves it (criu itself stays where it is).
	JoinNetNS string
	// Service, when set, serves the restore from a long-lived criu instead of a new swrk
	// (trees without their own mount namespace still get a swrk).
	Service *Service
	// Worker is Service's worker prepared for this restore (Service.PrepareWorker with
	// ServiceCgroupsFor of these options); nil: one is made now. Restore uses or closes it.
	Worker *Worker
	// Binary is the criu a swrk restore runs (FindBinary's explicit path; "" = the
	// default one). A Service runs the one it was started with.
	Binary string
}

// rpcModes translates the cgroup mode and the network lock, which dumps and restores set
// alike.
func rpcModes(m CgroupMode, n NetworkLock) (rpc.CriuCgMode, *rpc.CriuNetworkLockMethod, error) {
	cg, err := m.rpc()
	if err != nil {
		return 0, nil, err
	}
	nl, err := n.rpc()
	return cg, nl, err
}

// criuOpts translates DumpOptions into CRIU's RPC options; the fds are the caller's.
func (o *DumpOptions) criuOpts(checkpointFd, workFd int) (*rpc.CriuOpts, error) {
	if o.Pid <= 0 {
		return nil, fmt.Errorf("dump: no pid")
	}
	cg, nl, err := rpcModes(o.CgroupMode, o.NetworkLock)
	if err != nil {
		return nil, err
	}
	opts := &rpc.CriuOpts{
		ImagesDirFd:    proto.Int32(int32(checkpointFd)),
		WorkDirFd:      proto.Int32(int32(workFd)),
		Pid:            proto.Int32(int32(o.Pid)),
		LeaveRunning:   proto.Bool(o.LeaveRunning),
		ShellJob:       proto.Bool(false),
		TcpEstablished: proto.Bool(o.TCPEstablished),
		FileLocks:      proto.Bool(!o.SkipFileLocks),
		// A file open under a name that was since removed while other links remain gets a
		// temporary link in the tree's own file system, so it is restored (the frozen upper
		// layer is copied after CRIU made it).
		LinkRemap: proto.Bool(true),
		// A listener's connections that no accept() took yet are left out: CRIU refuses
		// the whole tree otherwise ("In-flight connection"), and a busy server always has
		// some. A restored copy loses them as a dropped handshake would (their clients
		// are reset); the running source keeps them (fork.Dump copies rather than swaps).
		TcpSkipInFlight:   proto.Bool(true),
		GhostLimit:        proto.Uint32(DefaultGhostLimit),
		LogFile:           proto.String(orDefault(o.LogFile, "dump.log")),
		LogLevel:          proto.Int32(int32(logLevel(o.LogLevel))),
		ManageCgroupsMode: &cg,
		NetworkLock:       nl,
		NotifyScripts:     proto.Bool(o.Notify != nil),
		External:          externals(o.ExternalMounts, func(path, key string) string { return "mnt[" + path + "]:" + key }),
	}
	if o.EmptyNetNS {
		opts.EmptyNs = proto.Uint32(unix.CLONE_NEWNET)
	}
	if yard := orDefault(o.CgroupYard, defaultCgroupYard()); yard != "" {
		opts.CgroupYard = proto.String(yard)
	}
	if o.FreezeCgroup != "" {
		opts.FreezeCgroup = proto.String(o.FreezeCgroup)
	}
	if o.GhostLimit != 0 {
		opts.GhostLimit = proto.Uint32(o.GhostLimit)
	}
	return opts, nil
}

// criuOpts translates RestoreOptions into CRIU's RPC options; the fds are the caller's and
// yard is the resolved cgroup yard ("" for none).
func (o *RestoreOptions) criuOpts(checkpointFd, workFd int, yard string) (*rpc.CriuOpts, error) {
	cg, nl, err := rpcModes(o.CgroupMode, o.NetworkLock)
	if err != nil {
		return nil, err
	}
	roots, err := cgroupRoots(o.CgroupRoots)
	if err != nil {
		return nil, err
	}
	opts := &rpc.CriuOpts{
		ImagesDirFd:    proto.Int32(int32(checkpointFd)),
		WorkDirFd:      proto.Int32(int32(workFd)),
		RstSibling:     proto.Bool(true),
		ShellJob:       proto.Bool(false),
		TcpEstablished: proto.Bool(o.TCPEstablished),
		// Harmless when the checkpoint holds no lock; needed when it does.
		FileLocks:         proto.Bool(true),
		LogFile:           proto.String(orDefault(o.LogFile, "restore.log")),
		LogLevel:          proto.Int32(int32(logLevel(o.LogLevel))),
		ManageCgroupsMode: &cg,
		CgRoot:            roots,
		NetworkLock:       nl,
		// Always on: the setup-namespaces notification names the root task, which Restore
		// must kill and reap if criu fails or is killed later on.
		NotifyScripts: proto.Bool(true),
		External:      externals(o.ExternalMounts, func(key, path string) string { return "mnt[" + key + "]:" + path }),
	}
	if o.Root != "" {
		opts.Root = proto.String(o.Root)
	}
	if o.EmptyNetNS {
		opts.EmptyNs = proto.Uint32(unix.CLONE_NEWNET)
	}
	if o.JoinNetNS != "" {
		if o.EmptyNetNS || o.NetNS != "" {
			return nil, errors.New("restore: a tree joins one network namespace: JoinNetNS with EmptyNetNS or NetNS")
		}
		opts.JoinNs = append(opts.JoinNs, &rpc.JoinNamespace{Ns: proto.String("net"), NsFile: proto.String(o.JoinNetNS)})
	}
	if yard != "" {
		opts.CgroupYard = proto.String(yard)
	}
	return opts, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func logLevel(l int) int {
	if l == 0 {
		return DefaultLogLevel
	}
	return l
}

// externals formats a map as --external strings, sorted so requests are reproducible.
func externals(m map[string]string, format func(k, v string) string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]string, 0, len(m))
	for _, k := range keys {
		out = append(out, format(k, m[k]))
	}
	return out
}

func cgroupRoots(specs []string) ([]*rpc.CgroupRoot, error) {
	var roots []*rpc.CgroupRoot
	for _, s := range specs {
		ctrl, path := "", s
		if !strings.HasPrefix(s, "/") {
			ctrl, path, _ = strings.Cut(s, ":")
		}
		if !strings.HasPrefix(path, "/") || (ctrl == "" && path != s) {
			return nil, fmt.Errorf("cgroup root %q: want ctrl:/path or /path", s)
		}
		r := &rpc.CgroupRoot{Path: proto.String(path)}
		if ctrl != "" {
			r.Ctrl = proto.String(ctrl)
		}
		roots = append(roots, r)
	}
	return roots, nil
}
