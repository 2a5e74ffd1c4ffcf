package criu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/checkpoint-restore/go-criu/v8/rpc"
	"github.com/moby/sys/mountinfo"

	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/nsthread"
	"github.com/lazyfork/lazyfork/lib/trace"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// Service is a long-lived `criu service`. Each restore through it is served by a worker
// that the service fork()s: no exec of criu (and of the probe-cache helper) per restore, and
// every worker loads the probe cache (see StartService). That is most of what a fork cost
// besides CRIU's own work (see shared/env/tuning-findings.md).
//
// The service listens on a socket in a directory only root can enter (criu makes the socket
// itself world-connectable). It dies with the process that started it (PR_SET_PDEATHSIG),
// and Close kills it. StartService makes the calling process a child subreaper: restored
// trees are children of criu's worker, and when the worker exits they are reparented to the
// caller, which can then wait for them like the roots of a swrk restore.
type Service struct {
	cmd  *exec.Cmd
	dir  string
	sock string
	kdat bool
	out  *os.File
	// ownNS: the service runs in a mount namespace of its own, a slave of ours (through
	// the helper): each fork's root, mounted in ours, reaches it for the restore and is
	// detached there afterwards (forget), so the namespace every worker copies for a
	// restored tree keeps the size it had, however many forks run (a worker's restore
	// copied, and then unmounted, every fork's root: ~6.5 ms of system time per restore
	// with 1,000 mounts).
	ownNS bool

	closeOnce sync.Once
	exited    chan struct{} // closed when the service process was reaped

	// Roots of restored trees waiting to be detached from the service's namespace by one
	// goroutine after their restore has answered (forgetLater); busy is the one being
	// detached now. A detach waits for an RCU grace period (namespace_unlock): in the
	// restore it lengthened every fork's.
	fmu     sync.Mutex
	fcond   *sync.Cond
	pending []string
	busy    string
	fkick   chan struct{}
}

// serviceDirPrefix names the socket directories; the pid of the owner follows, so that a
// later StartService can remove what a killed owner left.
const serviceDirPrefix = "service-"

// StartService starts `criu service` of binary (FindBinary's explicit path, "" = the
// default) and waits until it listens. Close it when done.
//
// The service runs in a mount namespace of its own that is a slave of the caller's (when
// the binary has the helper, see MaybeKdatHelper): forks' root file systems are mounted in
// the caller's after it started and must reach it, which a private namespace (how swrk
// gets the probe cache) would not allow. Its workers load the probe cache instead from $XDG_RUNTIME_DIR, where criu looks
// when a request is "unprivileged": the service's directory gets a copy of the cache a
// privileged criu saved (see primeKdat), so the loaded kernel facts are the full ones. As
// root, "unprivileged" changes nothing else a restore does (it skips the time namespace,
// which LazyFork trees do not have; the rest are fallbacks for missing capabilities).
func StartService(ctx context.Context, kdatDir, binary string) (*Service, error) {
	bin, err := binaryPath(binary)
	if err != nil {
		return nil, fmt.Errorf("criu service: find criu: %w", err)
	}
	base := kdatDir
	if base == "" {
		base = DefaultKdatDir()
	}
	if err := os.MkdirAll(base, 0o700); err != nil {
		return nil, fmt.Errorf("criu service: %w", err)
	}
	removeDeadServiceDirs(base)
	dir, err := os.MkdirTemp(base, fmt.Sprintf("%s%d-", serviceDirPrefix, os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("criu service: %w", err)
	}
	sock := filepath.Join(dir, "criu.sock")
	if len(sock) >= len(unix.RawSockaddrUnix{}.Path) {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("criu service: socket path %s is too long; set LAZYFORK_RUN to a shorter directory", sock)
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("criu service: become child subreaper: %w", err)
	}
	s := &Service{dir: dir, sock: sock, exited: make(chan struct{})}
	if kdatDir != "" {
		// Without a cache every worker probes the kernel again: slower, still correct.
		if cache, err := primeKdat(ctx, kdatDir, bin); err == nil {
			s.kdat = copyFile(cache, filepath.Join(dir, kdatCacheName)) == nil
		}
	}
	if err := s.start(ctx, bin); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func (s *Service) start(ctx context.Context, bin string) error {
	outFd, err := unix.MemfdCreate("criu-service-output", unix.MFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("criu service: memfd: %w", err)
	}
	s.out = os.NewFile(uintptr(outFd), "criu-service-output")
	ready, readyW, err := os.Pipe()
	if err != nil {
		s.out.Close()
		return fmt.Errorf("criu service: %w", err)
	}
	defer ready.Close()

	args := []string{"service", "--address", s.sock, "--status-fd", "3"}
	if s.kdat {
		// criu probes the kernel before it serves; unprivileged, it loads our cache instead.
		args = append(args, "--unprivileged")
	}
	cmd := exec.Command(bin, args...)
	if self, err := os.Executable(); err == nil && helperReady {
		cmd = exec.Command(self, append([]string{KdatHelperArg, slaveNSArg, "", bin}, args...)...)
		s.ownNS = true
	}
	cmd.ExtraFiles = []*os.File{readyW}
	cmd.Stdout, cmd.Stderr = s.out, s.out
	cmd.Env = append(criuEnv(), "XDG_RUNTIME_DIR="+s.dir)
	cmd.SysProcAttr = &unix.SysProcAttr{Pdeathsig: unix.SIGKILL}
	s.cmd = cmd

	// Pdeathsig fires when the thread that forked the child exits, and Go ends threads whose
	// goroutine exits locked (setns helpers do). So the service is started from a thread
	// that is locked, and kept, until the service is gone.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer close(s.exited)
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	err = <-started
	readyW.Close()
	if err != nil {
		s.out.Close()
		return fmt.Errorf("criu service: start criu: %w", err)
	}
	// criu writes one byte to the status fd once it listens; EOF means it died.
	waitCtx, cancel := withDeadline(ctx, 30*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		b := make([]byte, 1)
		_, err := ready.Read(b)
		got <- err
	}()
	select {
	case err = <-got:
	case <-waitCtx.Done():
		err = waitCtx.Err()
	}
	if err != nil {
		s.kill()
		return fmt.Errorf("criu service did not start: %v: %s", err, readCapped(s.out, 2048))
	}
	if s.ownNS {
		// Never unmount anything in our own namespace.
		mine, err1 := os.Readlink("/proc/self/ns/mnt")
		its, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", cmd.Process.Pid))
		s.ownNS = err1 == nil && err2 == nil && mine != its
	}
	// The roots of forks that ran before it started are no use to it either.
	s.detachOverlays()
	return nil
}

// adopt gives the service's namespace root, a restored tree's root file system mounted
// in ours, when it did not get it by propagation (a private host mount): a clone of that
// mount (open_tree) attached at the same path there (move_mount).
func (s *Service) adopt(root string) error {
	if !s.ownNS || root == "" {
		return nil
	}
	// An earlier tree's root at the same path (a swapped source) is detached first: a
	// detach still to come would take this one with it.
	s.settle(root)
	fd, err := unix.OpenTree(unix.AT_FDCWD, root, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("clone mount %s: %w", root, err)
	}
	defer unix.Close(fd)
	var ours unix.Stat_t
	_ = unix.Stat(filepath.Dir(root), &ours)
	return s.inNS(func() error {
		if fsutil.IsMountPoint(root) {
			return nil // propagated
		}
		if err := unix.MoveMount(fd, "", unix.AT_FDCWD, root, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			// Whether the path is there says whose the failure is: the lookup's or the mount's.
			var st unix.Stat_t
			there := "the path is there"
			if serr := unix.Stat(root, &st); serr != nil {
				up := filepath.Dir(root)
				for unix.Stat(up, &st) != nil && up != "/" {
					up = filepath.Dir(up)
				}
				there = fmt.Sprintf("the path is not: %v; its deepest ancestor there is %s, on device %d:%d (%s in ours: %d:%d)",
					serr, up, unix.Major(st.Dev), unix.Minor(st.Dev), filepath.Dir(root), unix.Major(ours.Dev), unix.Minor(ours.Dev))
			}
			return fmt.Errorf("attach %s in the criu service's mount namespace (%s): %w", root, there, err)
		}
		return nil
	})
}

// forget detaches root, a restored tree's root file system, from the service's namespace
// (see ownNS); it stays mounted in ours.
func (s *Service) forget(root string) {
	if root == "" {
		return
	}
	_ = s.inNS(func() error {
		for i := 0; i < 3 && fsutil.IsMountPoint(root); i++ {
			if err := unix.Unmount(root, unix.MNT_DETACH); err != nil {
				return err
			}
		}
		return nil
	})
}

// forgetLater queues forget(root) for the service's detaching goroutine: the restore that
// used root has answered and need not wait for the detach.
func (s *Service) forgetLater(root string) {
	if !s.ownNS || root == "" {
		return
	}
	s.fmu.Lock()
	if s.fkick == nil {
		s.fkick = make(chan struct{}, 1)
		s.fcond = sync.NewCond(&s.fmu)
		go s.forgetLoop()
	}
	s.pending = append(s.pending, root)
	s.fmu.Unlock()
	select {
	case s.fkick <- struct{}{}:
	default:
	}
}

// forgetLoop detaches queued roots one after the other until the service exits (its
// namespace goes with it).
func (s *Service) forgetLoop() {
	for {
		select {
		case <-s.fkick:
		case <-s.exited:
			return
		}
		for {
			s.fmu.Lock()
			if len(s.pending) == 0 {
				s.fmu.Unlock()
				break
			}
			root := s.pending[0]
			s.pending = s.pending[1:]
			s.busy = root
			s.fmu.Unlock()
			s.forget(root)
			s.fmu.Lock()
			s.busy = ""
			s.fcond.Broadcast()
			s.fmu.Unlock()
		}
	}
}

// settle returns once no detach of root is queued or running: a queued one is done now.
func (s *Service) settle(root string) {
	s.fmu.Lock()
	if s.fcond == nil {
		s.fmu.Unlock()
		return
	}
	queued := false
	for i := slices.Index(s.pending, root); i >= 0; i = slices.Index(s.pending, root) {
		s.pending = slices.Delete(s.pending, i, i+1)
		queued = true
	}
	for s.busy == root {
		s.fcond.Wait()
	}
	s.fmu.Unlock()
	if queued {
		s.forget(root)
	}
}

// detachOverlays detaches the overlay mounts of the service's namespace that are roots of
// containers, which a restore never needs but the one it is given. An overlay holding the
// service's own root, socket or binary stays: a host whose root is an overlay (a live
// image, a container, the v2 test guest) would otherwise leave criu with nothing.
func (s *Service) detachOverlays() {
	if !s.ownNS {
		return
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", s.cmd.Process.Pid))
	if err != nil {
		return
	}
	needed := []string{s.dir, s.cmd.Path}
	if len(s.cmd.Args) > 4 && s.cmd.Args[1] == KdatHelperArg {
		needed = append(needed, s.cmd.Args[4]) // the criu the helper execs
	}
	for i, p := range needed {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			needed[i] = real
		}
	}
	ms, err := mountinfo.GetMountsFromReader(f, func(m *mountinfo.Info) (skip, stop bool) {
		return m.FSType != "overlay" || holdsAny(m.Mountpoint, needed), false
	})
	f.Close()
	if err != nil || len(ms) == 0 {
		return
	}
	_ = s.inNS(func() error {
		for i := len(ms) - 1; i >= 0; i-- {
			_ = unix.Unmount(ms[i].Mountpoint, unix.MNT_DETACH)
		}
		return nil
	})
}

// holdsAny reports whether a mount at mountpoint contains any of paths (the root mount
// holds everything).
func holdsAny(mountpoint string, paths []string) bool {
	if mountpoint == "/" {
		return true
	}
	for _, p := range paths {
		if p == mountpoint || strings.HasPrefix(p, mountpoint+"/") {
			return true
		}
	}
	return false
}

// inNS runs fn on a thread of its own in the service's mount namespace; the thread is
// thrown away afterwards.
func (s *Service) inNS(fn func() error) error {
	if !s.ownNS || !s.Alive() {
		return nil
	}
	return nsthread.RunInRoot(s.cmd.Process.Pid, fn)
}

// Close stops the service and removes its socket. Restores in flight fail.
func (s *Service) Close() error {
	s.closeOnce.Do(func() {
		s.kill()
		s.out.Close()
		os.RemoveAll(s.dir)
	})
	return nil
}

func (s *Service) kill() {
	select {
	case <-s.exited:
	default:
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// Alive reports whether the service process still runs.
func (s *Service) Alive() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// ServiceCgroups is what a service worker joins for a restore (cgroup.procs files) and
// whether criu's own cgroup restore is then skipped (see RestoreOptions.JoinCgroupAll).
type ServiceCgroups struct {
	Join   []string
	Ignore bool
	// After, when not nil, holds the move back until it is closed: a worker prepared
	// during a dump moves once the source is thawed (a move holds the cgroup locks for
	// an RCU grace period, which a dump running beside it would wait for).
	After <-chan struct{}
}

// ServiceCgroupsFor decides ServiceCgroups for a restore of checkpointDir with
// RestoreOptions' JoinCgroup (join) and JoinCgroupAll (all): every group of the tree when
// the checkpoint's cgroups are flat (CheckpointCgroupsFlat), else join.
func ServiceCgroupsFor(checkpointDir string, join, all []string) ServiceCgroups {
	if len(all) > 0 && CheckpointCgroupsFlat(checkpointDir) {
		return ServiceCgroups{Join: all, Ignore: true}
	}
	return ServiceCgroups{Join: join}
}

func (a ServiceCgroups) equal(b ServiceCgroups) bool {
	return a.Ignore == b.Ignore && slices.Equal(a.Join, b.Join)
}

// Worker is a service worker made ready ahead of its request (PrepareWorker).
type Worker struct {
	cgroups ServiceCgroups
	c       *net.UnixConn
	ready   chan struct{} // closed once hello and the cgroup move are done (or failed)
	err     error         // theirs, read after ready
	stop    chan struct{} // closed by end: a move waiting for cgroups.After gives up
	stopped sync.Once

	mu    sync.Mutex
	pidfd int // the worker's, -1 until known and after end
	ended bool
}

// PrepareWorker connects a new worker and, in the background, learns its pid and moves it
// into cg's groups (ServiceCgroupsFor). Moving another process waits for an
// RCU grace period (8-15 ms on these hosts, see lib/cgroup's ThreadJoinFiles): started
// early, that wait overlaps what the caller does before the request (mounting the fork's
// root, its network namespace). Hand it to the request (RestoreOptions.Worker) and Close it
// in any case: a worker that served no request is killed.
func (s *Service) PrepareWorker(ctx context.Context, cg ServiceCgroups) *Worker {
	w := &Worker{cgroups: cg, ready: make(chan struct{}), stop: make(chan struct{}), pidfd: -1}
	if !s.Alive() {
		w.err = errors.New("criu service has exited: " + readCapped(s.out, 1024))
		close(w.ready)
		return w
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.sock, Net: "unixpacket"})
	if err != nil {
		w.err = fmt.Errorf("connect to criu service: %w", err)
		close(w.ready)
		return w
	}
	w.c = c
	go func() {
		defer close(w.ready)
		w.err = w.prepare(ctx, cg.Join)
	}()
	return w
}

func (w *Worker) prepare(ctx context.Context, joinProcs []string) error {
	if err := setPassCred(w.c); err != nil {
		return err
	}
	endHello := trace.Step(ctx, "criu service: new worker (connect, hello)")
	pid, err := hello(w.c)
	endHello()
	if err != nil {
		return err
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("criu service worker %d: %w", pid, err)
	}
	w.mu.Lock()
	if w.ended { // closed meanwhile
		w.mu.Unlock()
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		unix.Close(fd)
		return errors.New("criu service worker closed")
	}
	w.pidfd = fd
	w.mu.Unlock()
	if w.cgroups.After != nil {
		select {
		case <-w.cgroups.After:
		case <-w.stop:
			return errors.New("criu service worker closed")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	endJoin := trace.Step(ctx, "criu service: move the worker into the fork's cgroups")
	defer endJoin()
	for _, f := range joinProcs {
		if err := os.WriteFile(f, []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("move criu worker into %s: %w", filepath.Dir(f), err)
		}
	}
	return nil
}

// kill sends the worker SIGKILL if its pid is known.
func (w *Worker) kill() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pidfd >= 0 {
		_ = unix.PidfdSendSignal(w.pidfd, unix.SIGKILL, nil, 0)
	}
}

// end closes the connection (the worker exits right after it answered; until then a
// restored root is its child, not ours), kills the worker first when asked, and waits
// until it is gone. It reports a worker that would not exit.
func (w *Worker) end(kill bool) error {
	if w.c != nil {
		_ = w.c.SetDeadline(time.Now()) // ends a hello in flight
	}
	if w.stop != nil {
		w.stopped.Do(func() { close(w.stop) })
	}
	<-w.ready
	w.mu.Lock()
	if w.ended {
		w.mu.Unlock()
		return nil
	}
	w.ended = true
	fd := w.pidfd
	w.pidfd = -1
	w.mu.Unlock()
	if w.c != nil {
		defer w.c.Close()
	}
	if fd < 0 {
		return nil
	}
	defer unix.Close(fd)
	if kill {
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	}
	if !waitPidfd(fd, 10*time.Second) {
		return errors.New("criu service worker did not exit after answering")
	}
	return nil
}

// Wait returns once the worker is connected and in its groups, or has failed to be (the
// request then reports why).
func (w *Worker) Wait() {
	if w != nil {
		<-w.ready
	}
}

// closed reports whether the worker was closed or has served its request: it serves none.
func (w *Worker) closed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ended
}

// Close kills a worker that has not served a request and waits until it is gone; after a
// request it does nothing.
func (w *Worker) Close() {
	if w != nil {
		_ = w.end(true)
	}
}

// call runs one request on a worker, w (PrepareWorker's) or a new one moved into cg's
// groups (so the tree it clones is charged there, as with swrk), then converses like swrk. The worker is SIGKILLed on deadline or cancel,
// and gone (its restored tree reparented to us) when call returns.
func (s *Service) call(ctx context.Context, req *rpc.CriuReq, w *Worker, cg ServiceCgroups, notify NotifyFunc) (res result, retErr error) {
	// Whatever failed after a cancel or the deadline (ESRCH, EOF, i/o timeout) is a
	// consequence of killing the worker.
	defer func() {
		if err := ctx.Err(); err != nil && !(retErr == nil && res.resp.GetSuccess()) {
			retErr = err
		}
	}()
	res.kdat = s.kdat
	if s.kdat {
		req.Opts.Unprivileged = proto.Bool(true) // load the cache from $XDG_RUNTIME_DIR
	}
	if err := ctx.Err(); err != nil {
		w.Close()
		return res, err
	}
	if w == nil {
		w = s.PrepareWorker(ctx, cg)
	}
	defer func() {
		if err := w.end(retErr != nil || !res.resp.GetSuccess()); err != nil && retErr == nil {
			retErr = err
		}
	}()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-ctx.Done():
			w.kill()
			if w.c != nil {
				_ = w.c.SetDeadline(time.Now())
			}
		case <-stop:
		}
	}()
	<-w.ready
	if w.err != nil {
		return res, w.err
	}
	w.mu.Lock()
	closed := w.ended
	w.mu.Unlock()
	if closed {
		return res, errors.New("criu service worker closed before its request")
	}
	if ctx.Err() != nil {
		w.kill()
		return res, ctx.Err()
	}
	var err error
	res.resp, res.rootPid, err = converse(ctx, w.c, req, notify)
	return res, err
}

// hello asks the new worker for criu's version, keeping the connection open for the real
// request, and returns the worker's pid from the answer's credentials.
func hello(c *net.UnixConn) (int, error) {
	t := rpc.CriuReqType_VERSION
	if err := send(c, &rpc.CriuReq{Type: &t, KeepOpen: proto.Bool(true)}); err != nil {
		return 0, err
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred)+unix.CmsgSpace(16*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, fmt.Errorf("read from criu service: %w", err)
	}
	pid := credPid(oob[:oobn])
	closeRights(oob[:oobn])
	resp := &rpc.CriuResp{}
	if n == 0 || resp.UnmarshalVT(buf[:n]) != nil || resp.GetType() != rpc.CriuReqType_VERSION || !resp.GetSuccess() {
		return 0, errors.New("criu service worker did not answer its version request")
	}
	if pid <= 0 {
		return 0, errors.New("criu service worker sent no credentials")
	}
	return pid, nil
}

func setPassCred(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("criu service socket: SO_PASSCRED: %w", serr)
	}
	return nil
}

func credPid(oob []byte) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for i := range msgs {
		if cred, err := unix.ParseUnixCredentials(&msgs[i]); err == nil {
			return int(cred.Pid)
		}
	}
	return 0
}

// waitPidfd waits until the process behind fd exited (it need not be our child).
func waitPidfd(fd int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		ms := int(time.Until(deadline) / time.Millisecond)
		if ms <= 0 {
			return false
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, ms)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0
	}
}

// removeDeadServiceDirs removes socket directories whose owner is gone (SIGKILLed before
// Close; its service died with it).
func removeDeadServiceDirs(base string) {
	names, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, n := range names {
		rest, ok := strings.CutPrefix(n.Name(), serviceDirPrefix)
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if unix.Kill(pid, 0) == unix.ESRCH {
			_ = os.RemoveAll(filepath.Join(base, n.Name()))
		}
	}
}
