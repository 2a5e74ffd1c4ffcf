// Package container runs LazyFork containers: create (overlay root, own cgroup, new
// pid/mount/uts/ipc namespaces, the user's command as pid 1), exec, freeze, thaw, delete
// and the live view of each container. The fork pipeline reuses its pieces.
package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/lazyfork/lazyfork/lib/criu"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/confine"
	"github.com/lazyfork/lazyfork/lib/container/config"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/image"
	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/overlay"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/procfs"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/undo"
)

// Runtime bundles the stores a command needs.
type Runtime struct {
	Containers   *store.Store
	Images       *image.Store
	CgroupParent string // "" = under the caller's own cgroup
	// Exe is the binary re-executed as the container set-up helper (default: this one).
	Exe string
	// Helper is lazyfork-helper, the small binary Exec starts to become a command inside a
	// container (lib/helper); Open sets the one next to the running binary (HelperBeside).
	Helper string
	// Network is where bridge-mode containers are attached; zero fields mean the
	// defaults (lib/network).
	Network network.Config
	// CRIU is the operator's CRIU binary (criu.FindBinary's explicit path); "" = the
	// private one from `make setup`, else the distribution's.
	CRIU string
}

// Config is the operator's settings a Runtime works with. The commands that make or
// dump containers embed it in their command lines, so kong reads them from the flags or
// the environment in the main; nothing in lib reads the environment for them.
type Config = config.Config // its own package: the lazyfork client parses it too

// Open opens the stores under paths.Root() with the operator's settings.
func Open(cfg Config) (*Runtime, error) {
	t, err := store.Open(paths.Containers())
	if err != nil {
		return nil, err
	}
	im, err := image.Open(paths.Images())
	if err != nil {
		return nil, err
	}
	im.MaxLayerBytes = cfg.MaxLayerBytes
	criu.KeepLogs(cfg.KeepCRIULogs)
	return &Runtime{Containers: t, Images: im, CgroupParent: cfg.CgroupParent, CRIU: cfg.CRIU,
		Network: network.Config{Bridge: cfg.Bridge, Subnet: cfg.Subnet}, Helper: HelperBeside()}, nil
}

// HelperName is the exec helper's file name (cmd/lazyfork-helper): make build, make
// install and the wheel put it next to lazyfork.
const HelperName = "lazyfork-helper"

// HelperBeside is the exec helper next to the running binary ("" if that is unknown).
func HelperBeside() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return filepath.Join(filepath.Dir(exe), HelperName)
}

// helper is r.Helper once it is known to be an executable file.
func (r *Runtime) helper() (string, error) {
	if r.Helper == "" {
		return "", fmt.Errorf("no exec helper (%s) is set for this runtime", HelperName)
	}
	if fi, err := os.Stat(r.Helper); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("the exec helper %s is missing or not executable: it belongs next to lazyfork; run `make build` (or `make install`, or reinstall the wheel)", r.Helper)
	}
	return r.Helper, nil
}

// CreateOptions are the user's choices for a new container.
type CreateOptions struct {
	Image    string
	Name     string
	Command  []string
	Env      []string
	Hook     string
	Progress io.Writer // image pull progress (human text)
	// User overrides the image's User: "uid[:gid]" or names from the image's /etc/passwd
	// and /etc/group.
	User string
	// Privileged opts out of confinement: every capability, no seccomp filter, no masked
	// /proc paths, no device list (what containers had before LazyFork confined them).
	Privileged bool
	// Memory (bytes) and PidsLimit cap the container's cgroup; 0 means no limit.
	Memory    int64
	PidsLimit int64
	// Net is the network mode: NetNone (default: a namespace of its own, loopback only),
	// NetBridge (a namespace of its own with an address on the LazyFork bridge) or NetHost
	// (the host's network, as containers had before).
	Net string
	// NAT masquerades a bridge-mode container's traffic to the host's other networks
	// (off by default: it reaches the host and the other bridge-mode containers only).
	NAT bool
	// Join names a running container (--net none or bridge) whose network namespace the
	// new one shares: together they are a cluster (like a pod), forked as one cut. The
	// member takes the cluster's network (Net "" or the same mode; no NAT of its own).
	Join string
}

// Network modes.
const (
	NetNone   = "none"
	NetBridge = "bridge"
	NetHost   = "host"
)

// NetMode checks a --net value ("" means the default, none).
func NetMode(s string) (string, error) {
	switch s {
	case "", NetNone:
		return NetNone, nil
	case NetHost, NetBridge:
		return s, nil
	}
	return "", fmt.Errorf("network mode %q: use none (a network namespace of its own, loopback only), bridge (plus an address on the LazyFork bridge) or host", s)
}

// MemDir is where a root container's (empty) /.lazyfork/mem lives on the host.
func MemDir(id string) string { return filepath.Join(paths.Run(), "mem", id) }

// Create starts a new container and records it. On failure nothing remains.
func (r *Runtime) Create(ctx context.Context, o CreateOptions) (_ *store.Container, retErr error) {
	if o.Name != "" {
		if err := store.ValidateName(o.Name); err != nil {
			return nil, err
		}
	}
	img, err := r.Images.Get(ctx, o.Image, image.GetOptions{Progress: o.Progress})
	if err != nil {
		return nil, err
	}
	args := o.Command
	if len(args) == 0 {
		args = append(slices.Clone(img.Entrypoint), img.Cmd...)
	}
	if len(args) == 0 {
		return nil, errors.New("no command given and the image has none: add `-- COMMAND [ARGS...]`")
	}
	env := mergeEnv(img.Env, o.Env)
	if o.Memory < 0 || o.PidsLimit < 0 {
		return nil, fmt.Errorf("memory limit %d and pids limit %d: limits must be positive (0 means none)", o.Memory, o.PidsLimit)
	}
	var leader *store.Container
	var joinNS *os.File
	if o.Join != "" {
		if o.Net != "" {
			if _, err := NetMode(o.Net); err != nil {
				return nil, err
			}
		}
		var err error
		if leader, joinNS, err = r.joinable(o.Join, o.Net, o.NAT); err != nil {
			return nil, err
		}
		defer joinNS.Close()
		o.Net = leader.Net
	}
	net, err := NetMode(o.Net)
	if err != nil {
		return nil, err
	}
	var alloc func() (string, error)
	netCfg := r.Network.WithDefaults()
	if leader != nil {
		// A member shares the leader's namespace, address and bridge.
	} else if net == NetBridge {
		subnet, err := netCfg.Check()
		if err != nil {
			return nil, err
		}
		alloc = r.AddressAllocator(subnet)
	} else if o.NAT {
		return nil, fmt.Errorf("--nat needs --net bridge (a %s container has no address to masquerade)", net)
	}
	prof := confine.Default()
	if o.Privileged {
		prof = confine.Privileged()
	}
	user := o.User
	if user == "" {
		user = img.User
	}

	var cleanup undo.Stack
	defer func() {
		if retErr != nil {
			if err := cleanup.Run(); err != nil {
				retErr = fmt.Errorf("%w (clean-up also failed: %v)", retErr, err)
			}
		}
	}()

	c, err := r.Reserve(o.Name, func(c *store.Container) error {
		c.Image = img.Name
		c.Command = args
		c.Env = env
		c.WorkingDir = img.WorkingDir
		c.Hook = o.Hook
		c.Memory, c.PidsLimit = o.Memory, o.PidsLimit
		c.Net = net
		if leader != nil {
			c.Cluster = leader.ID
			c.Bridge, c.Addr, c.NAT = leader.Bridge, leader.Addr, leader.NAT
		}
		c.Confine = &prof
		if alloc != nil {
			c.Bridge, c.NAT = netCfg.Bridge, o.NAT
			var err error
			if c.Addr, err = alloc(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	cleanup.Push(func() error { return r.Containers.Remove(c.ID) })
	cleanup.Push(func() error { return r.releaseNetwork(c) })

	lower := slices.Clone(img.Layers)
	slices.Reverse(lower) // overlayfs wants the top-most layer first
	c.Lower = lower
	layer := overlay.Layer{Lower: c.Lower, Upper: c.Upper, Work: c.Work, Target: c.RootFS}
	if err := overlay.Prepare(layer); err != nil {
		return nil, err
	}
	cleanup.Push(func() error { return overlay.Teardown(layer) })

	// The user is looked up in the image's own account files, inside the mounted root.
	if err := prof.ResolveUser(c.RootFS, user); err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	if prof.Home != "" && !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "HOME=") }) {
		env = append(env, "HOME="+prof.Home)
		c.Env = env
	}

	if err := os.MkdirAll(c.MemDir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", c.MemDir, err)
	}
	cleanup.Push(func() error { return fsutil.RemoveAll(c.MemDir) })

	cg, err := cgroup.Create(c.ID, r.CgroupParent)
	if err != nil {
		return nil, err
	}
	cleanup.Push(func() error { _ = cg.Kill(); return cg.Remove() })
	if err := cg.SetLimits(Limits(c)); err != nil {
		return nil, err
	}

	// A --net none container's namespace is made from the network nursery (a TCP hash
	// table of its own, which every dump of it walks while it is frozen: network.NewNetNS)
	// and joined by its init, not cloned from the host's. Bridge mode keeps the clone: its
	// link is moved into the init's namespace before the init would have joined one.
	if c.Net == NetNone && joinNS == nil {
		ns, err := network.NewNetNS()
		if err != nil {
			return nil, fmt.Errorf("create: %w", err)
		}
		defer ns.Release() // the init is in it once startInit returns
		if joinNS, err = os.Open(ns.Path); err != nil {
			return nil, fmt.Errorf("create: open its network namespace: %w", err)
		}
		defer joinNS.Close()
	}
	pid, err := r.startInit(cg, initConfig{
		RootFS: c.RootFS, Hostname: c.Hostname, Args: args, Env: env,
		WorkingDir: c.WorkingDir, MemDir: c.MemDir, Confine: prof, OwnNet: c.Net != NetHost && joinNS == nil,
		JoinNet: joinNS != nil,
	}, func(pid int) error { return AttachNetwork(pid, c, "") }, joinNS)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", c.Display(), err)
	}
	c.Pid = pid
	c.StartTime, _ = StartTime(pid)
	c.State = store.StateRunning
	c.Owner = 0
	if err := r.Containers.Put(c); err != nil {
		return nil, err
	}
	return c, nil
}

// Reserve records a new container in state "creating" under the store lock, so two
// creates racing for one name cannot both win. The record already names every path and
// cgroup the container will own, so a crash half-way leaves something Delete can clean.
func (r *Runtime) Reserve(name string, fill func(*store.Container) error) (*store.Container, error) {
	cs, err := r.ReserveN(1, []string{name}, fill)
	if err != nil {
		return nil, err
	}
	return cs[0], nil
}

// ReserveN reserves n containers as Reserve does, names[i] naming the i-th ("" or missing:
// no name), under one lock and one look at the names in use: a batch of named forks would
// otherwise read every record in the store once per fork. It reserves all or none.
func (r *Runtime) ReserveN(n int, names []string, fill func(*store.Container) error) (_ []*store.Container, retErr error) {
	if len(names) > n {
		return nil, fmt.Errorf("%d names for %d containers", len(names), n)
	}
	unlock, err := r.Containers.Lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	taken := map[string]string{} // name -> id
	if slices.ContainsFunc(names, func(s string) bool { return s != "" }) {
		if taken, err = r.Containers.NamesInUse(); err != nil {
			return nil, err
		}
	}
	var out []*store.Container
	defer func() {
		if retErr != nil {
			for _, c := range out {
				_ = r.Containers.Remove(c.ID)
			}
		}
	}()
	ids := map[string]bool{}
	for i := 0; i < n; i++ {
		name := ""
		if i < len(names) {
			name = names[i]
		}
		if name != "" {
			if id, ok := taken[name]; ok {
				if slices.ContainsFunc(out, func(c *store.Container) bool { return c.ID == id }) {
					return nil, fmt.Errorf("%w: %q is given twice", store.ErrNameInUse, name)
				}
				return nil, fmt.Errorf("%w: %q is container %s (pick another name or delete it)", store.ErrNameInUse, name, id)
			}
		}
		id := r.Containers.NewID()
		for ids[id] {
			id = r.Containers.NewID()
		}
		ids[id] = true
		c := &store.Container{ID: id, Name: name, Hostname: id, Created: time.Now().UTC(), State: store.StateCreating, Owner: os.Getpid()}
		layer := overlay.Dir(r.Containers.Path(id), nil)
		c.Upper, c.Work, c.RootFS, c.MemDir = layer.Upper, layer.Work, layer.Target, MemDir(id)
		cg, err := cgroup.Resolve(id, r.CgroupParent)
		if err != nil {
			return nil, err
		}
		c.Cgroup, c.CgroupV2 = cg.Paths, cg.V2
		if err := fill(c); err != nil {
			return nil, err
		}
		out = append(out, c)
		if name != "" {
			taken[name] = id
		}
	}
	// Each record is fsynced: written side by side, the syncs share journal commits (a
	// batch of 1,000 waited for 125 commits 8 at a time).
	var g errgroup.Group
	g.SetLimit(64)
	for _, c := range out {
		g.Go(func() error { return r.Containers.Put(c) })
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

func mergeEnv(base, extra []string) []string {
	out := slices.Clone(base)
	if !slices.ContainsFunc(out, func(e string) bool { return strings.HasPrefix(e, "PATH=") }) {
		out = append(out, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	for _, e := range extra {
		k, _, _ := strings.Cut(e, "=")
		out = slices.DeleteFunc(out, func(x string) bool { return strings.HasPrefix(x, k+"=") })
		out = append(out, e)
	}
	return out
}

// InitTimeout bounds the container set-up helper: from its start to the exec of the
// user's command.
var InitTimeout = time.Minute

// startInit re-executes this binary as the set-up helper in new namespaces, puts it in
// the cgroup before it does anything, and waits until it has exec'd the user's command
// (the error pipe closes on exec) or reported why it could not.
func (r *Runtime) startInit(cg *cgroup.Cgroup, cfg initConfig, prepare func(pid int) error, netns *os.File) (int, error) {
	exe := r.Exe
	if exe == "" {
		exe = "/proc/self/exe"
	}
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer cfgR.Close()
	defer cfgW.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer errR.Close()
	cmd := exec.Command(exe, InitArg)
	cmd.ExtraFiles = []*os.File{cfgR, errW}
	if netns != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, netns) // fd 5: joined by the helper
	}
	cmd.Env = []string{}
	flags := uintptr(syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC)
	if cfg.OwnNet && !cfg.JoinNet {
		flags |= syscall.CLONE_NEWNET
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: flags,
		// The container's pid 1 must lead its own session inside the pid namespace, or
		// CRIU refuses to dump it.
		Setsid: true,
	}
	if err := cmd.Start(); err != nil {
		errW.Close()
		return 0, fmt.Errorf("start container init: %w", err)
	}
	errW.Close()
	pid := cmd.Process.Pid
	fail := func(err error) (int, error) {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return 0, err
	}
	if err := cg.AddProc(pid); err != nil {
		return fail(err)
	}
	// The helper waits for its config: its namespaces are ready before the user's
	// command runs (bridge mode's network).
	if prepare != nil {
		if err := prepare(pid); err != nil {
			return fail(err)
		}
	}
	// The helper gets InitTimeout to read its config and exec the command: one stuck
	// (a hung mount) is killed instead of holding the caller forever.
	deadline := time.Now().Add(InitTimeout)
	_ = cfgW.SetWriteDeadline(deadline)
	_ = errR.SetReadDeadline(deadline)
	if err := json.NewEncoder(cfgW).Encode(cfg); err != nil {
		return fail(fmt.Errorf("send init config: %w", err))
	}
	cfgW.Close()
	msg, err := io.ReadAll(io.LimitReader(errR, 64<<10))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fail(fmt.Errorf("container init did not start the command within %v", InitTimeout))
	}
	if len(msg) > 0 {
		return fail(errors.New(string(msg)))
	}
	// Reap it when it ends if this process lives that long (daemon, tests); a short-lived
	// CLI leaves it to the host's init.
	go func() { _ = cmd.Wait() }()
	return pid, nil
}

// StartTime reads a process's start time (clock ticks since boot) from /proc, which
// together with the pid identifies it even after pid reuse.
func StartTime(pid int) (uint64, error) {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return 0, err
	}
	if st.State == 'Z' || st.State == 'X' {
		return 0, fmt.Errorf("process %d has exited", pid)
	}
	return st.StartTime, nil
}

// Alive reports whether the container's recorded init is still the same live process.
func Alive(c *store.Container) bool {
	if c.Pid <= 0 {
		return false
	}
	st, err := StartTime(c.Pid)
	return err == nil && st == c.StartTime
}

// Limits are the cgroup limits and device list of c's processes, for its own group and
// each fork's (CRIU does not copy limits into a group it did not create).
func Limits(c *store.Container) cgroup.Limits {
	return cgroup.Limits{Memory: c.Memory, Pids: c.PidsLimit, Devices: !c.ConfineProfile().Privileged}
}

// Cgroup loads the container's cgroup.
func Cgroup(c *store.Container) (*cgroup.Cgroup, error) {
	// Only a group under the project's subtree: a forged record must not aim kill or
	// freeze at a foreign cgroup.
	return cgroup.LoadOwned(c.Cgroup)
}
