package criu

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/testutil/timescale"
)

// startService starts a service on a fresh cache dir and closes it after the test.
func startService(t *testing.T) (*Service, string) {
	t.Helper()
	kdat := kdatTempDir(t)
	s, err := StartService(context.Background(), kdat, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, kdat
}

// dumpContained dumps a tiny container and returns its image, a restore root (a private
// mount point) holding the counter file as it was at the dump, and the last count dumped.
func dumpContained(t *testing.T, kdat string) (d *DumpResult, img, root2 string, dumped int) {
	t.Helper()
	base := t.TempDir()
	root1 := filepath.Join(base, "root1")
	root2 = filepath.Join(base, "root2")
	pid := startContained(t, root1)
	makeRoot(t, root2)
	img = t.TempDir()
	d, err := Dump(context.Background(), DumpOptions{
		Pid: pid, CheckpointDir: img, LeaveRunning: true, KdatDir: kdat,
		ExternalMounts: map[string]string{"/usr": "usr"},
		Notify: func(script string, _ int) error {
			if script != "post-dump" {
				return nil
			}
			b, err := os.ReadFile(filepath.Join(root1, "cnt.log"))
			if err != nil {
				return err
			}
			dumped = last(counts(t, filepath.Join(root1, "cnt.log")))
			return os.WriteFile(filepath.Join(root2, "cnt.log"), b, 0o644)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	bindSelf(t, root2)
	return d, img, root2, dumped
}

func TestServiceRestoresContainer(t *testing.T) {
	requirePriv(t)
	s, kdat := startService(t)
	if !s.kdat {
		t.Error("service started without a probe cache")
	}
	// criu < 4.2 probes (or loads the cache) before it opens a request's log, so only
	// 4.2 and later say in the restore log where the cache came from.
	major, minor, _, err := Version(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	logsKdat := major > 4 || major == 4 && minor >= 2
	_, img, root2, dumped := dumpContained(t, kdat)
	snapshot, err := os.ReadFile(filepath.Join(root2, "cnt.log"))
	if err != nil {
		t.Fatal(err)
	}
	// Twice through the same service: each restore is its own worker.
	for i := range 2 {
		if err := os.WriteFile(filepath.Join(root2, "cnt.log"), snapshot, 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := Restore(context.Background(), RestoreOptions{
			CheckpointDir: img, WorkDir: filepath.Join(t.TempDir(), "w"), Root: root2,
			ExternalMounts: map[string]string{"usr": "/usr"}, Service: s,
		})
		if err != nil {
			t.Fatal(err)
		}
		// The worker is gone when Restore returns, so the root is already ours.
		if p := parentOf(r.Pid); p != os.Getpid() {
			t.Errorf("restore %d: root %d has parent %d, want us (%d)", i, r.Pid, p, os.Getpid())
		}
		b, _ := os.ReadFile(r.LogPath)
		if logsKdat && !strings.Contains(string(b), "Loaded kdat cache from "+s.dir) {
			t.Errorf("restore %d did not load the service's probe cache", i)
		}
		assertNoBreakpoints(t, r.LogPath)
		c := waitCount(t, filepath.Join(root2, "cnt.log"), dumped+4)
		contiguous(t, "copy", c)
		_ = r.Process.Kill()
		_, _ = r.Process.Wait()
	}
	if !s.Alive() {
		t.Fatal("service died")
	}
	// The root is detached from the service's namespace after each restore has answered
	// (forgetLater); the second restore at the same path first finished the first's
	// detach (settle), or it would have lost its root.
	if s.ownNS {
		deadline := time.Now().Add(5 * time.Second)
		for mountedIn(t, s.cmd.Process.Pid, root2) {
			if time.Now().After(deadline) {
				t.Fatalf("%s still mounted in the service's namespace 5 s after the restores", root2)
			}
			time.Sleep(10 * time.Millisecond)
		}
		s.fmu.Lock()
		left := len(s.pending)
		s.fmu.Unlock()
		if left != 0 {
			t.Errorf("%d roots still queued for detaching", left)
		}
	} else {
		t.Error("service runs in our mount namespace (no helper?)")
	}
	pid, dir := s.cmd.Process.Pid, s.dir
	s.Close()
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		t.Errorf("service %d still exists after Close", pid)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("service dir %s still exists after Close", dir)
	}
	if c := criuChildren(t); len(c) != 0 {
		t.Errorf("criu children left: %v", c)
	}
	if _, err := Restore(context.Background(), RestoreOptions{CheckpointDir: img, WorkDir: t.TempDir(), Root: root2, Service: s}); err == nil || !strings.Contains(err.Error(), "criu service has exited") {
		t.Errorf("restore through a closed service: err = %v", err)
	}
}

// A restore through the service that times out or is refused leaves no worker and no
// restored task, and the service goes on serving.
func TestServiceFailureLeavesNothing(t *testing.T) {
	requirePriv(t)
	s, _ := startService(t)
	img := dumpedBare(t)
	root := restoreTimedOutAfterRoot(t, img, s)
	testEventually(t, func() bool { return gone(root) },
		"restored root %d still exists", root)
	testEventually(t, func() bool { return len(serviceWorkers(t, s)) == 0 }, "workers left: %v", serviceWorkers(t, s))

	refuseEachScript(t, RestoreOptions{CheckpointDir: img, Service: s}, func(script string) {
		if w := serviceWorkers(t, s); len(w) != 0 {
			t.Errorf("%s: workers left: %v", script, w)
		}
	})
	if !s.Alive() {
		t.Fatal("service died")
	}
	r, err := Restore(context.Background(), RestoreOptions{CheckpointDir: img, WorkDir: t.TempDir(), Service: s})
	if err != nil {
		t.Fatalf("restore after failures: %v", err)
	}
	_ = r.Process.Kill()
	_, _ = r.Process.Wait()
}

// The service dies with the process that started it, and the next StartService removes the
// socket directory that process left.
func TestServiceDiesWithOwner(t *testing.T) {
	requirePriv(t)
	kdat := kdatTempDir(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serviceOwnerEnv+"="+kdat)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, _ := bufio.NewReader(out).ReadString('\n')
	svcPid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("owner said %q", line)
	}
	dirs, _ := filepath.Glob(filepath.Join(kdat, serviceDirPrefix+strconv.Itoa(cmd.Process.Pid)+"-*"))
	if len(dirs) != 1 {
		t.Fatalf("service dirs of the owner: %v", dirs)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	testEventually(t, func() bool { return gone(svcPid) }, "service %d outlived its owner", svcPid)

	s, err := StartService(context.Background(), kdat, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Stat(dirs[0]); err == nil {
		t.Errorf("dead owner's service dir %s was not removed", dirs[0])
	}
}

func TestServiceSocketPathTooLong(t *testing.T) {
	requirePriv(t)
	long := filepath.Join(kdatTempDir(t), strings.Repeat("d", 100))
	_, err := StartService(context.Background(), long, "")
	if err == nil || !strings.Contains(err.Error(), "too long") {
		t.Fatalf("err = %v", err)
	}
	if names, _ := os.ReadDir(long); len(names) != 0 {
		t.Errorf("left in %s: %v", long, names)
	}
}

// serviceWorkers lists the service's children (its workers).
func serviceWorkers(t *testing.T, s *Service) []int {
	t.Helper()
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", s.cmd.Process.Pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, p := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(p)
			out = append(out, pid)
		}
	}
	return out
}

func testEventually(t *testing.T, ok func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timescale.Scale(10 * time.Second))
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf(format, args...)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gone reports whether pid has exited. An orphan of a killed descendant is reparented to
// us (a subreaper since the first StartService): reap it, then it is gone.
func gone(pid int) bool {
	if parentOf(pid) == os.Getpid() {
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
	return unix.Kill(pid, 0) == unix.ESRCH
}

// A worker prepared ahead of a request (PrepareWorker) and closed without one is killed and
// gone, and a request on it fails; one prepared for a restore serves it.
func TestPreparedWorker(t *testing.T) {
	requirePriv(t)
	s, kdat := startService(t)
	w := s.PrepareWorker(context.Background(), ServiceCgroups{})
	<-w.ready
	if w.err != nil {
		t.Fatal(w.err)
	}
	if n := len(serviceWorkers(t, s)); n != 1 {
		t.Fatalf("%d workers after PrepareWorker, want 1", n)
	}
	w.Close()
	w.Close() // twice: nothing more
	// Gone once the service reaps it.
	testEventually(t, func() bool { return len(serviceWorkers(t, s)) == 0 }, "workers left after Close: %v", serviceWorkers(t, s))
	_, img, root2, dumped := dumpContained(t, kdat)
	opts := RestoreOptions{CheckpointDir: img, WorkDir: filepath.Join(t.TempDir(), "w"), Root: root2,
		ExternalMounts: map[string]string{"usr": "/usr"}, Service: s, Worker: w}
	if r, err := Restore(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "worker closed") {
		t.Errorf("restore on a closed worker: err = %v", err)
		if err == nil { // a second tree would write the same counter
			_ = r.Process.Kill()
			_, _ = r.Process.Wait()
		}
	}
	opts.Worker = s.PrepareWorker(context.Background(), ServiceCgroups{})
	r, err := Restore(context.Background(), opts)
	if err != nil {
		t.Fatalf("restore on a prepared worker: %v", err)
	}
	if p := parentOf(r.Pid); p != os.Getpid() {
		t.Errorf("root %d has parent %d, want us (%d)", r.Pid, p, os.Getpid())
	}
	c := waitCount(t, filepath.Join(root2, "cnt.log"), dumped+4)
	contiguous(t, "copy", c)
	_ = r.Process.Kill()
	_, _ = r.Process.Wait()
	opts.Worker.Close() // after the request: nothing
	testEventually(t, func() bool { return len(serviceWorkers(t, s)) == 0 }, "workers left: %v", serviceWorkers(t, s))
}

// A worker prepared with ServiceCgroups.After joins its groups only once After is closed
// (here a plain file stands for a cgroup.procs file: the pid is written to it), and one
// closed while it waits is gone without ever joining.
func TestPreparedWorkerWaitsForAfter(t *testing.T) {
	requirePriv(t)
	s, _ := startService(t)
	procs := filepath.Join(t.TempDir(), "cgroup.procs")
	if err := os.WriteFile(procs, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	after := make(chan struct{})
	w := s.PrepareWorker(context.Background(), ServiceCgroups{Join: []string{procs}, After: after})
	testEventually(t, func() bool { return len(serviceWorkers(t, s)) == 1 }, "no worker after PrepareWorker: %v", serviceWorkers(t, s))
	time.Sleep(100 * time.Millisecond)
	if b, _ := os.ReadFile(procs); len(b) != 0 {
		t.Fatalf("worker joined %q before After was closed", b)
	}
	select {
	case <-w.ready:
		t.Fatal("worker ready before After was closed")
	default:
	}
	close(after)
	<-w.ready
	if w.err != nil {
		t.Fatal(w.err)
	}
	if b, _ := os.ReadFile(procs); string(b) != strconv.Itoa(serviceWorkers(t, s)[0]) {
		t.Errorf("joined %q, worker %v", b, serviceWorkers(t, s))
	}
	w.Close()
	testEventually(t, func() bool { return len(serviceWorkers(t, s)) == 0 }, "workers left after Close: %v", serviceWorkers(t, s))

	if err := os.WriteFile(procs, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	w = s.PrepareWorker(context.Background(), ServiceCgroups{Join: []string{procs}, After: make(chan struct{})})
	testEventually(t, func() bool { return len(serviceWorkers(t, s)) == 1 }, "no worker after PrepareWorker: %v", serviceWorkers(t, s))
	closed := make(chan struct{})
	go func() { w.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close of a worker waiting for After did not return")
	}
	if w.err == nil {
		t.Error("a worker closed while it waited reports no error")
	}
	if b, _ := os.ReadFile(procs); len(b) != 0 {
		t.Errorf("a worker closed while it waited joined %q", b)
	}
	testEventually(t, func() bool { return len(serviceWorkers(t, s)) == 0 }, "workers left after Close: %v", serviceWorkers(t, s))
}

// mountedIn reports whether path is a mount point in pid's mount namespace.
func mountedIn(t *testing.T, pid int, path string) bool {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ms, err := mountinfo.GetMountsFromReader(f, mountinfo.SingleEntryFilter(path))
	if err != nil {
		t.Fatal(err)
	}
	return len(ms) > 0
}

// A detach still queued or running for a path (forgetLater) is finished before the path
// is given to the service again (adopt, a swapped source's new root at its old path):
// else it would detach the new root before criu used it.
func TestServiceSettlesQueuedDetach(t *testing.T) {
	requirePriv(t)
	s, _ := startService(t)
	if !s.ownNS {
		t.Fatal("service runs in our mount namespace (no helper?)")
	}
	pid := s.cmd.Process.Pid
	root := t.TempDir()
	bindSelf(t, root) // private: adopt attaches a clone there
	idle := func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			s.fmu.Lock()
			done := len(s.pending) == 0 && s.busy == ""
			s.fmu.Unlock()
			if done {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("detaches still queued after 5 s")
			}
			time.Sleep(time.Millisecond)
		}
	}
	if err := s.adopt(root); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		s.forgetLater(root)
		if err := s.adopt(root); err != nil {
			t.Fatal(err)
		}
		idle()
		if !mountedIn(t, pid, root) {
			t.Fatalf("round %d: the detach queued before adopt took the new root", i)
		}
	}
	s.forgetLater(root)
	idle()
	if mountedIn(t, pid, root) {
		t.Fatalf("%s still mounted in the service's namespace after its detach", root)
	}
}

// overlayRootEnv marks the run of TestServiceSettlesQueuedDetach inside
// TestServiceOnOverlayRoot's pivoted mount namespace.
const overlayRootEnv = "LF_TEST_OVERLAY_ROOT"

// On a host whose root is an overlay (a live image, a container, the v2 test guest) the
// service keeps its root: it detached every overlay of its namespace at start, "/" too,
// and could reach no path after that. The host is made here: a mount namespace pivoted
// into an overlay of our root, where TestServiceSettlesQueuedDetach runs again.
func TestServiceOnOverlayRoot(t *testing.T) {
	requirePriv(t)
	if os.Getenv(overlayRootEnv) != "" {
		t.Skip("already on the overlay root")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	w := t.TempDir()
	// Everything mounted below exists only in the child's private namespace and goes with
	// it; the test binary is copied onto the overlay (its own mount may not be in the lower).
	script := `set -e
mount --make-rprivate /
mount -t tmpfs tmpfs "$W"
mkdir "$W/upper" "$W/work" "$W/root"
mount -t overlay overlay -o lowerdir=/,upperdir="$W/upper",workdir="$W/work" "$W/root"
cp "$BIN" "$W/root/.lf-overlay-root.test"
mkdir "$W/root/.oldroot"
cd "$W/root"
pivot_root . .oldroot
for m in /dev /proc /sys; do mount --move /.oldroot$m $m; done
umount -l /.oldroot
cd /
exec /.lf-overlay-root.test -test.run '^TestServiceSettlesQueuedDetach$' -test.count=1 -test.v
`
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = append(os.Environ(), "W="+w, "BIN="+self, overlayRootEnv+"=1")
	cmd.SysProcAttr = &unix.SysProcAttr{Cloneflags: unix.CLONE_NEWNS, Pdeathsig: unix.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestServiceSettlesQueuedDetach") {
		t.Fatalf("on an overlay root: %v\n%s", err, out)
	}
}

// The overlays a service keeps: "/" always, one at or above a path it uses, never one
// that only shares a name prefix with it.
func TestHoldsAny(t *testing.T) {
	needed := []string{"/run/lazyfork/service-1", "/opt/criu/bin/criu"}
	for mp, want := range map[string]bool{
		"/": true, "/run": true, "/run/lazyfork/service-1": true, "/opt/criu": true,
		"/run/lazyfork/service-10": false, "/run/lazy": false, "/opt/criu/bin/criu-old": false,
		"/var/lib/lazyfork/containers/abc/rootfs": false,
	} {
		if got := holdsAny(mp, needed); got != want {
			t.Errorf("holdsAny(%q) = %v, want %v", mp, got, want)
		}
	}
}
