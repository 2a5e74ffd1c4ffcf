// Package daemon is LazyFork's daemon: an HTTP/JSON API on a unix socket (server.go)
// over Service, which performs each operation with the same lib packages the stage
// binaries and the porcelain use, on the same on-disk store. The daemon keeps no state of
// its own: every request reads the store and the live processes, so a restarted daemon
// sees exactly what was running before. The porcelain uses Service directly when no
// daemon runs, so both paths behave alike.
package daemon

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/doctor"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/guard"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/image"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// Version is the daemon's (and its API's) version.
const Version = "0.1.0"

// MaxForks bounds one fork request.
const MaxForks = 1000

// Service performs LazyFork's operations and publishes their events.
type Service struct {
	RT     *container.Runtime
	Events *Broker
	// Daemon describes the daemon this service runs in (nil in the porcelain).
	Daemon *client.DaemonInfo

	criuMu sync.Mutex
	criu   *criu.Service // the daemon's long-lived criu; see restoreService

	trees treeHub // snapshot trees (trees.go)
}

// NewService returns a service over rt.
func NewService(rt *container.Runtime) *Service {
	return &Service{RT: rt, Events: NewBroker()}
}

// restoreService returns the daemon's long-lived criu service, started on first use and
// again if it died; nil (each batch starts its own) in the porcelain or when it cannot start.
func (s *Service) restoreService(ctx context.Context) *criu.Service {
	if s.Daemon == nil {
		return nil
	}
	s.criuMu.Lock()
	defer s.criuMu.Unlock()
	if s.criu != nil && s.criu.Alive() {
		return s.criu
	}
	if s.criu != nil {
		s.criu.Close()
		s.criu = nil
	}
	svc, err := criu.StartService(ctx, criu.DefaultKdatDir(), s.RT.CRIU)
	if err != nil {
		return nil
	}
	s.criu = svc
	return svc
}

// Close stops what the service keeps running for its requests (the criu service).
func (s *Service) Close() {
	s.criuMu.Lock()
	defer s.criuMu.Unlock()
	if s.criu != nil {
		s.criu.Close()
		s.criu = nil
	}
}

func badRequest(format string, args ...any) *client.Error {
	return client.Errorf(http.StatusBadRequest, client.CodeBadRequest, format, args...)
}

// Create starts a new container.
func (s *Service) Create(ctx context.Context, req client.CreateRequest, progress io.Writer) (*client.Info, error) {
	o, err := s.createOptions(ctx, req, progress)
	if err != nil {
		return nil, err
	}
	c, err := s.RT.Create(ctx, o)
	if err != nil {
		return nil, err
	}
	s.Events.Publish(client.Event{Type: client.EventCreate, ID: c.ID, Name: c.Name})
	return s.info(c), nil
}

// createOptions checks a create request and resolves (or pulls) its image first, so
// that a missing image gets its own code (a tree's root is created from the same).
func (s *Service) createOptions(ctx context.Context, req client.CreateRequest, progress io.Writer) (container.CreateOptions, error) {
	if req.Image == "" {
		return container.CreateOptions{}, badRequest("image is required")
	}
	if err := hook.ValidatePath(req.Hook); err != nil {
		return container.CreateOptions{}, badRequest("%v", err)
	}
	if err := checkEnv(req.Env); err != nil {
		return container.CreateOptions{}, err
	}
	if mode, err := container.NetMode(req.Net); err != nil {
		return container.CreateOptions{}, badRequest("%v", err)
	} else if req.NAT && mode != container.NetBridge {
		return container.CreateOptions{}, badRequest("nat needs net bridge (a %s container has no address to masquerade)", mode)
	}
	if _, err := s.RT.Images.Get(ctx, req.Image, image.GetOptions{Progress: progress}); err != nil {
		if errors.Is(err, image.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return container.CreateOptions{}, client.Errorf(http.StatusNotFound, client.CodeImageNotFound, "%v", err)
		}
		return container.CreateOptions{}, err
	}
	env := slices.Clone(req.Env)
	if req.Hook != "" {
		env = append([]string{hook.EnvVar + "=" + req.Hook}, env...)
	}
	return container.CreateOptions{
		Image: req.Image, Name: req.Name, Command: req.Command, Env: env, Hook: req.Hook, Progress: progress,
		User: req.User, Memory: req.Memory, PidsLimit: req.PidsLimit, Privileged: req.Privileged,
		Net: req.Net, NAT: req.NAT, Join: req.Join,
	}, nil
}

func checkEnv(env []string) error {
	for _, e := range env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return badRequest("env entry %q: want KEY=VALUE", e)
		}
	}
	return nil
}

// forkCount is how many forks a request asks for: n, or as many as it names (named:
// its names, labels), 1 when neither; a negative n or more than MaxForks is refused.
func forkCount(n int, named ...int) (int, error) {
	if n < 0 {
		return 0, badRequest("n must be at least 1")
	}
	n = max(n, slices.Max(append(named, 1)))
	if n > MaxForks {
		return 0, badRequest("n = %d: at most %d forks per request", n, MaxForks)
	}
	return n, nil
}

// Fork forks ref. The pipeline runs to the end even if ctx is cancelled half-way (a
// killed CRIU could leave the source frozen or half-dumped); if ctx was cancelled by then,
// the forks are deleted again, so a caller that went away leaves nothing behind.
func (s *Service) Fork(ctx context.Context, ref string, req client.ForkRequest, onFork func(client.Fork)) (*client.ForkResult, error) {
	n, err := forkCount(req.N, len(req.Names))
	if err != nil {
		return nil, err
	}
	c, ho, unlock, err := s.lockForDump(ctx, ref, req.HookOptions)
	if err != nil {
		return nil, err
	}
	defer unlock()
	run := context.WithoutCancel(ctx)
	forks, snap, err := fork.Fork(run, s.RT, c, fork.Options{Force: req.Force, Share: req.Share, Copy: req.Copy, HugePages: req.HugePages,
		RestoreOptions: fork.RestoreOptions{N: n, Names: req.Names, OnFork: onFork, Service: s.restoreService(run), Hook: ho}})
	if err != nil {
		return nil, err
	}
	res := &client.ForkResult{Forks: forks}
	if snap != nil {
		res.Snapshot = snap.ID
	}
	if ctx.Err() != nil {
		s.undo(forks)
		return nil, client.Errorf(499, client.CodeCanceled, "fork %s: cancelled by the client; the %d fork(s) made were deleted", ref, len(forks))
	}
	for _, f := range forks {
		s.Events.Publish(client.Event{Type: client.EventFork, ID: f.ID, Name: f.Name, Parent: f.Parent, Snapshot: f.Snapshot})
	}
	return res, nil
}

// ClusterFork forks every member of ref's cluster as one coordinated cut (lib/fork).
func (s *Service) ClusterFork(ctx context.Context, ref string, req client.ClusterForkRequest) (*client.ClusterFork, error) {
	n := req.N
	switch {
	case n < 0:
		return nil, badRequest("n must be at least 1")
	case n == 0:
		n = 1
	case n > MaxForks:
		return nil, badRequest("n = %d: at most %d forks per request", n, MaxForks)
	}
	c, unlock, err := guard.Lock(ctx, s.RT.Containers, ref, 0)
	if err != nil {
		return nil, err
	}
	defer unlock()
	members, err := s.RT.Members(c)
	if err != nil {
		return nil, err
	}
	for _, m := range members {
		if m.ID == c.ID {
			continue
		}
		_, unlockM, err := guard.Lock(ctx, s.RT.Containers, m.ID, 0)
		if err != nil {
			return nil, err
		}
		defer unlockM()
	}
	res, err := fork.ForkCluster(context.WithoutCancel(ctx), s.RT, c, fork.ClusterOptions{N: n, Force: req.Force})
	if err != nil {
		return nil, err
	}
	for _, m := range res.Members {
		for _, f := range m.Forks {
			s.Events.Publish(client.Event{Type: client.EventFork, ID: f.ID, Name: f.Name, Parent: f.Parent, Snapshot: f.Snapshot})
		}
	}
	return res, nil
}

// undo deletes forks nobody will learn about.
func (s *Service) undo(forks []client.Fork) {
	for _, f := range forks {
		if c, err := s.RT.Containers.Get(f.ID); err == nil {
			_ = s.RT.Delete(c)
		}
	}
	_ = fork.Collect(s.RT)
}

// hookOptions are a request's hook options, checked.
func hookOptions(o client.HookOptions) (hook.Options, error) {
	if o.HookTimeout < 0 {
		return hook.Options{}, badRequest("hook_timeout must not be negative")
	}
	return hook.Options{Timeout: time.Duration(o.HookTimeout * float64(time.Second)), Force: o.HookForce}, nil
}

// lockForDump checks a dumping request's hook options, then takes ref's lock: a bad
// request waits for no lock.
func (s *Service) lockForDump(ctx context.Context, ref string, o client.HookOptions) (*store.Container, hook.Options, func(), error) {
	ho, err := hookOptions(o)
	if err != nil {
		return nil, ho, nil, err
	}
	endLock := trace.Step(ctx, "lock the container")
	c, unlock, err := guard.Lock(ctx, s.RT.Containers, ref, 0)
	endLock()
	return c, ho, unlock, err
}

// Stop snapshots ref and ends its processes.
func (s *Service) Stop(ctx context.Context, ref string, req client.StopRequest) (*client.Info, error) {
	c, ho, unlock, err := s.lockForDump(ctx, ref, req.HookOptions)
	if err != nil {
		return nil, err
	}
	defer unlock()
	snap, err := fork.Stop(context.WithoutCancel(ctx), s.RT, c, ho)
	if err != nil {
		return nil, err
	}
	s.Events.Publish(client.Event{Type: client.EventStop, ID: c.ID, Name: c.Name, Snapshot: snap.ID})
	return s.info(c), nil
}

// Start restarts a stopped container from its snapshot.
func (s *Service) Start(ctx context.Context, ref string) (*client.Info, error) {
	c, unlock, err := guard.Lock(ctx, s.RT.Containers, ref, 0)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := fork.Start(context.WithoutCancel(ctx), s.RT, c); err != nil {
		return nil, err
	}
	s.Events.Publish(client.Event{Type: client.EventStart, ID: c.ID, Name: c.Name})
	return s.info(c), nil
}

// Delete ends ref's processes and removes everything it holds; its forks keep running.
func (s *Service) Delete(ctx context.Context, ref string) error {
	if err := s.deleteOne(ctx, ref); err != nil {
		return err
	}
	return fork.Collect(s.RT)
}

// DeleteAll deletes each of refs, telling done how each went, then collects what they
// shared once: a collection reads every record, so one per container made deleting N
// containers cost N x N record reads. It returns the collection's error.
// Nothing deleted, nothing to collect: a refused delete touches no state.
//
// Every running container of a batch is frozen first: deleted one at a time, the others
// kept the CPUs meanwhile (100 of ~960 busy forks took 12 min at load 90, 2 Dec). One
// whose delete then fails is thawed again: a refused delete leaves it as it was.
func (s *Service) DeleteAll(ctx context.Context, refs []string, done func(ref string, err error)) error {
	frozen := map[string]bool{}
	if len(refs) > 1 {
		for _, ref := range refs {
			if s.freezeRunning(ctx, ref) {
				frozen[ref] = true
			}
		}
	}
	if afterFreezeAll != nil {
		afterFreezeAll()
	}
	deleted := 0
	for _, ref := range refs {
		err := s.deleteOne(ctx, ref)
		if err == nil {
			deleted++
		} else if frozen[ref] {
			if terr := s.thawFrozen(ctx, ref); terr != nil {
				err = errors.Join(err, terr)
			}
		}
		done(ref, err)
	}
	if deleted == 0 {
		return nil
	}
	return fork.Collect(s.RT)
}

// afterFreezeAll, when set (tests), runs between DeleteAll's freezes and its deletes.
var afterFreezeAll func()

// freezeRunning freezes ref if it is running and its lock is free now, and says so.
func (s *Service) freezeRunning(ctx context.Context, ref string) bool {
	// A busy one is not waited for (its delete will be).
	c, unlock, err := guard.Lock(ctx, s.RT.Containers, ref, time.Millisecond)
	if err != nil {
		return false
	}
	defer unlock()
	return s.RT.State(c) == store.StateRunning && s.RT.Freeze(c) == nil
}

// thawFrozen thaws ref, which freezeRunning froze and whose delete failed (also when
// the caller's context ended it).
func (s *Service) thawFrozen(ctx context.Context, ref string) error {
	c, unlock, err := guard.Lock(context.WithoutCancel(ctx), s.RT.Containers, ref, 10*time.Second)
	if err != nil {
		return fmt.Errorf("thaw %s after its delete failed: %w", ref, err)
	}
	defer unlock()
	if err := s.RT.Thaw(c); err != nil {
		return fmt.Errorf("thaw %s after its delete failed: %w", ref, err)
	}
	return nil
}

func (s *Service) deleteOne(ctx context.Context, ref string) error {
	c, unlock, err := guard.Lock(ctx, s.RT.Containers, ref, 0)
	if err != nil {
		return err
	}
	defer unlock()
	if err := s.RT.Delete(c); err != nil {
		return err
	}
	s.Events.Publish(client.Event{Type: client.EventDelete, ID: c.ID, Name: c.Name})
	return nil
}

// Freeze pauses every process of ref.
func (s *Service) Freeze(ctx context.Context, ref string) error {
	return s.locked(ctx, ref, s.RT.Freeze, client.EventFreeze)
}

// Thaw resumes a frozen container.
func (s *Service) Thaw(ctx context.Context, ref string) error {
	return s.locked(ctx, ref, s.RT.Thaw, client.EventThaw)
}

// locked runs op on ref under its lock and publishes the event when it succeeds.
func (s *Service) locked(ctx context.Context, ref string, op func(*store.Container) error, event string) error {
	c, unlock, err := guard.Lock(ctx, s.RT.Containers, ref, 0)
	if err != nil {
		return err
	}
	defer unlock()
	if err := op(c); err != nil {
		return err
	}
	s.Events.Publish(client.Event{Type: event, ID: c.ID, Name: c.Name})
	return nil
}

// execOptions checks an exec request and turns it into runtime options.
func execOptions(req client.ExecRequest) (container.ExecOptions, error) {
	o := container.ExecOptions{Args: req.Argv, Env: req.Env, Cwd: req.Cwd}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return o, badRequest("argv is required: the command and its arguments")
	}
	if err := checkEnv(req.Env); err != nil {
		return o, err
	}
	if req.Timeout < 0 {
		return o, badRequest("timeout must not be negative")
	}
	o.Timeout = time.Duration(req.Timeout * float64(time.Second))
	switch {
	case req.Stdin != "" && req.StdinBase64 != "":
		return o, badRequest("give stdin or stdin_base64, not both")
	case req.StdinBase64 != "":
		b, err := base64.StdEncoding.DecodeString(req.StdinBase64)
		if err != nil {
			return o, badRequest("stdin_base64: %v", err)
		}
		o.Stdin = bytes.NewReader(b)
	case req.Stdin != "":
		o.Stdin = strings.NewReader(req.Stdin)
	}
	return o, nil
}

// Exec runs a command inside ref and returns its output.
func (s *Service) Exec(ctx context.Context, ref string, req client.ExecRequest) (*client.ExecResult, error) {
	o, err := execOptions(req)
	if err != nil {
		return nil, err
	}
	if req.TTY {
		return nil, badRequest("tty needs a streamed exec (Upgrade: %s)", client.UpgradeHeader)
	}
	c, err := s.RT.Containers.Resolve(ref)
	if err != nil {
		return nil, err
	}
	res, err := s.RT.Exec(ctx, c, o)
	if err != nil {
		return nil, execError(ctx, err, c, req.Timeout)
	}
	return &client.ExecResult{Stdout: res.Stdout, Stderr: res.Stderr, ExitCode: res.ExitCode}, nil
}

// ExecStream runs a command inside ref on the given streams and returns its exit code.
func (s *Service) ExecStream(ctx context.Context, ref string, req client.ExecRequest, stdio client.Stdio) (int, error) {
	o, err := execOptions(req)
	if err != nil {
		return -1, err
	}
	endResolve := trace.Step(ctx, "resolve the container")
	c, err := s.RT.Containers.Resolve(ref)
	endResolve()
	if err != nil {
		return -1, err
	}
	o.Stdin, o.Stdout, o.Stderr = stdio.Stdin, stdio.Stdout, stdio.Stderr
	if o.Stderr == nil {
		o.Stderr = o.Stdout
	}
	res, err := s.RT.Exec(ctx, c, o)
	if err != nil {
		return -1, execError(ctx, err, c, req.Timeout)
	}
	return res.ExitCode, nil
}

func execError(ctx context.Context, err error, c *store.Container, timeout float64) error {
	if errors.Is(err, context.DeadlineExceeded) && timeout > 0 && ctx.Err() == nil {
		return client.Errorf(http.StatusGatewayTimeout, client.CodeExecTimeout, "exec in %s: the command ran longer than its timeout (%gs) and was killed", c.Display(), timeout)
	}
	return err
}

// Get returns ref's live view.
func (s *Service) Get(ctx context.Context, ref string) (*client.Info, error) {
	c, err := s.RT.Containers.Resolve(ref)
	if err != nil {
		return nil, err
	}
	in := s.info(c)
	if c.Parent != "" {
		if p, err := s.RT.Containers.Get(c.Parent); err == nil {
			in.ParentName = p.Name
		}
	}
	return in, nil
}

// List returns the live view of every container, oldest first.
func (s *Service) List(ctx context.Context) ([]client.Info, error) {
	all, err := s.RT.Containers.List()
	if err != nil {
		return nil, err
	}
	names := map[string]string{}
	for _, c := range all {
		names[c.ID] = c.Name
	}
	out := make([]client.Info, 0, len(all))
	for _, c := range all {
		in := s.info(c)
		in.ParentName = names[c.Parent]
		out = append(out, *in)
	}
	return out, nil
}

// Tree returns the containers as a forest: roots are containers whose parent is gone.
func (s *Service) Tree(ctx context.Context) ([]client.TreeNode, error) {
	rows, err := s.List(ctx)
	if err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	kids := map[string][]client.Info{}
	for _, r := range rows {
		ids[r.ID] = true
	}
	var roots []client.Info
	for _, r := range rows {
		if r.Parent == "" || !ids[r.Parent] {
			roots = append(roots, r)
		} else {
			kids[r.Parent] = append(kids[r.Parent], r)
		}
	}
	var build func(client.Info) client.TreeNode
	build = func(in client.Info) client.TreeNode {
		n := client.TreeNode{Info: in, Children: []client.TreeNode{}}
		for _, k := range kids[in.ID] {
			n.Children = append(n.Children, build(k))
		}
		return n
	}
	out := make([]client.TreeNode, 0, len(roots))
	for _, r := range roots {
		out = append(out, build(r))
	}
	return out, nil
}

// Stats returns ref's memory (cgroup), family, snapshot and timing figures.
func (s *Service) Stats(ctx context.Context, ref string) (*client.Stats, error) {
	c, err := s.RT.Containers.Resolve(ref)
	if err != nil {
		return nil, err
	}
	st := &client.Stats{Info: *s.info(c), Family: c.Family, Timings: c.Timings}
	if cg, err := container.Cgroup(c); err == nil {
		if cs, err := cg.Stats(); err == nil {
			st.Rss, st.Cache, st.Kmem, st.MappedFile = cs.Rss, cs.Cache, cs.Kmem, cs.MappedFile
		}
	}
	if c.Family != "" {
		st.FamilyBytes = fork.FamilyBytes(c.Family)
	}
	if c.State == store.StateStopped {
		st.Snapshot, _ = fork.LoadSnapshot(c.Snapshot)
	}
	return st, nil
}

// Status returns host facts, container totals and, in a daemon, the daemon.
func (s *Service) Status(ctx context.Context) (*client.Status, error) {
	rows, err := s.List(ctx)
	if err != nil {
		return nil, err
	}
	st := &client.Status{Containers: len(rows), Root: paths.Root(), Run: paths.Run(), Daemon: s.Daemon}
	st.Host = doctor.Run(ctx, paths.Run(), s.RT.CRIU)
	for _, r := range rows {
		st.Memory += r.MemoryBytes
		switch r.State {
		case store.StateRunning:
			st.Running++
		case store.StateFrozen:
			st.Frozen++
		case store.StateStopped:
			st.Stopped++
		default:
			st.Exited++
		}
	}
	return st, nil
}

// GC removes memory files, layers and snapshots nothing references any more.
func (s *Service) GC(ctx context.Context) error { return fork.GC(s.RT) }

// Clean deletes every stopped or exited container (`lazyfork daemon clean`).
func (s *Service) Clean(ctx context.Context) ([]string, error) {
	all, err := s.RT.Containers.List()
	if err != nil {
		return nil, err
	}
	deleted := []string{}
	var errs []error
	for _, c := range all {
		if st := s.RT.State(c); st != store.StateStopped && st != store.StateExited {
			continue
		}
		if err := s.Delete(ctx, c.ID); err != nil {
			if !errors.Is(err, store.ErrNotFound) {
				errs = append(errs, err)
			}
			continue
		}
		deleted = append(deleted, c.ID)
	}
	return deleted, errors.Join(errs...)
}

// Logs writes ref's output log to w; with follow it keeps going until ctx ends or the
// container is deleted.
func (s *Service) Logs(ctx context.Context, ref string, follow bool, w io.Writer) error {
	c, err := s.RT.Containers.Resolve(ref)
	if err != nil {
		return err
	}
	f, err := container.OpenLog(c) // inside the container's root, regular files only
	if err != nil {
		return err
	}
	defer f.Close()
	for i := 0; ; i++ {
		if _, err := io.Copy(w, f); err != nil {
			return err
		}
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		if !follow {
			return nil
		}
		if i%5 == 4 {
			if _, err := s.RT.Containers.Get(c.ID); err != nil {
				return nil // deleted
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// info is the live view of c in the API's shape.
func (s *Service) info(c *store.Container) *client.Info {
	in := s.RT.Inspect(c)
	return &in
}
