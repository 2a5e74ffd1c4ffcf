package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/testutil/timescale"

	"github.com/lazyfork/lazyfork/lib/testutil/priv"
	"golang.org/x/sys/unix"
)

// requirePriv skips a test that needs root and criu, unless CI=true or LF_REQUIRE_PRIV=1
// make a missing requirement a failure.
func requirePriv(t *testing.T) {
	t.Helper()
	priv.Root(t, "CRIU dumps and restores")
	if _, err := FindBinary(""); err != nil {
		priv.Miss(t, err.Error())
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		priv.Miss(t, "/usr/bin/python3 not installed")
	}
}

// Each counter appends one number per line to a file it opens per write, so no file is open
// across a dump (CRIU checks open files' sizes on restore).
const bareCounter = `
import itertools, os, sys, time
os.closerange(3, 1 << 16)  # fds leaked into the test binary would end up in the image
for i in itertools.count():
    # Named by host PID (/proc is the host's), looked up each time: a restored copy differs.
    path = os.path.join(sys.argv[1], os.readlink("/proc/self") + ".log")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, b"%d\n" % i)
    os.close(fd)
    time.sleep(0.05)
`

const rootCounter = `
import itertools, os, time
os.closerange(3, 1 << 16)
for i in itertools.count():
    fd = os.open("/cnt.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, b"%d\n" % i)
    os.close(fd)
    time.sleep(0.05)
`

// startBare starts a counter as the init of a new pid namespace (a session leader, in the
// host's mount namespace) and returns its host PID and the file it counts into.
func startBare(t *testing.T) (int, string) {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("/usr/bin/python3", "-c", bareCounter, dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: syscall.CLONE_NEWPID}
	startWorkload(t, cmd)
	log := filepath.Join(dir, strconv.Itoa(cmd.Process.Pid)+".log")
	waitCount(t, log, 3)
	return cmd.Process.Pid, log
}

// makeRoot builds a minimal root: the host's /usr is bind-mounted in (an external mount for
// CRIU), the merged-/usr symlinks point into it, and the container mounts its own /proc.
func makeRoot(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{"usr", "proc"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"bin", "lib", "lib64", "sbin"} {
		if err := os.Symlink("usr/"+l, filepath.Join(dir, l)); err != nil {
			t.Fatal(err)
		}
	}
}

// startContained starts a counter in new pid and mount namespaces whose root is root:
// a tiny container. It returns the init's host PID.
func startContained(t *testing.T, root string) int {
	t.Helper()
	makeRoot(t, root)
	const script = `set -e
mount --make-rprivate /
mount --bind "$1" "$1"
mount --bind /usr "$1/usr"
cd "$1"
mkdir .old
pivot_root . .old
mount -t proc proc /proc
umount -l /.old
rmdir /.old
exec <&- >&- 2>&-  # fds opened in the host's namespace would name mounts CRIU cannot see
exec /usr/bin/python3 -c "$2"
`
	cmd := exec.Command("/bin/sh", "-c", script, "sh", root, rootCounter)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	startWorkload(t, cmd)
	waitCount(t, filepath.Join(root, "cnt.log"), 3)
	return cmd.Process.Pid
}

func startWorkload(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
}

// bindSelf makes dir a private mount point, as CRIU wants of a restore root.
func bindSelf(t *testing.T, dir string) {
	t.Helper()
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		t.Fatal(err)
	}
}

func counts(t *testing.T, path string) []int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []int
	for _, l := range strings.Split(string(b), "\n") {
		if n, err := strconv.Atoi(l); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func waitCount(t *testing.T, path string, n int) []int {
	t.Helper()
	wait := timescale.Scale(10 * time.Second)
	deadline := time.Now().Add(wait)
	for {
		c := counts(t, path)
		if len(c) >= n {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d lines after %s, want %d", path, len(c), wait, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func last(c []int) int {
	if len(c) == 0 {
		return -1
	}
	return c[len(c)-1]
}

// contiguous checks that c counts up by one from its first value.
func contiguous(t *testing.T, what string, c []int) {
	t.Helper()
	for i := 1; i < len(c); i++ {
		if c[i] != c[i-1]+1 {
			t.Fatalf("%s: not contiguous at line %d: %v", what, i+1, c)
		}
	}
}

// ourChildren lists the PIDs of our children, sorted.
func ourChildren(t *testing.T) []int {
	t.Helper()
	var out []int
	tasks, _ := filepath.Glob("/proc/self/task/*/children")
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, p := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(p)
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

// criuChildren lists our children named criu: there must be none between calls.
func criuChildren(t *testing.T) []int {
	t.Helper()
	var out []int
	for _, pid := range ourChildren(t) {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if strings.TrimSpace(string(comm)) == "criu" {
			out = append(out, pid)
		}
	}
	return out
}

// assertNoBreakpoints checks a criu log for the line CRIU_FAULT=130 produces: compel stopped
// the tasks without hardware breakpoints (which hang criu in some VMs).
func assertNoBreakpoints(t *testing.T, log string) {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil || !strings.Contains(string(b), "Force no-breakpoints restore") {
		t.Errorf("%s: criu did not run with CRIU_FAULT=130 (%v)", log, err)
	}
}

func killRestored(t *testing.T, r *RestoreResult) {
	t.Cleanup(func() {
		_ = r.Process.Kill()
		_, _ = r.Process.Wait()
	})
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		fi, _ := e.Info()
		names = append(names, fmt.Sprintf("%s:%d", e.Name(), fi.Size()))
	}
	return names
}

func TestVersionAndCheck(t *testing.T) {
	requirePriv(t)
	ctx := context.Background()
	major, minor, patch, err := Version(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("criu %d.%d.%d", major, minor, patch)
	if major < 4 || (major == 4 && minor < 1) {
		t.Errorf("criu %d.%d.%d is older than 4.1", major, minor, patch)
	}
	if err := Check(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if c := criuChildren(t); len(c) != 0 {
		t.Errorf("criu children left: %v", c)
	}
}

// A bare process (own pid namespace, host mount namespace): dump it while it keeps running,
// restore a copy next to it and see the copy continue the count from the dumped value.
func TestDumpRestoreBare(t *testing.T) {
	requirePriv(t)
	ctx := context.Background()
	pid, origLog := startBare(t)
	img, work := t.TempDir(), t.TempDir()

	var mu sync.Mutex
	var scripts []string
	dumped := -1
	d, err := Dump(ctx, DumpOptions{
		Pid: pid, CheckpointDir: img, WorkDir: work, LeaveRunning: true,
		KdatDir: t.TempDir(), // must be ignored: the tree shares our mount namespace
		Notify: func(script string, _ int) error {
			mu.Lock()
			defer mu.Unlock()
			scripts = append(scripts, script)
			if script == "post-dump" { // frozen: the file holds exactly what the image saw
				dumped = last(counts(t, origLog))
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dump: %+v", d)
	if !slices.Contains(scripts, "post-dump") || dumped < 0 {
		t.Fatalf("no post-dump notification: %v", scripts)
	}
	if d.KdatCache {
		t.Error("dump of a tree in our mount namespace ran in the kdat namespace")
	}
	if d.PagesWritten == 0 || d.Frozen == 0 || d.LogPath != filepath.Join(work, "dump.log") {
		t.Errorf("dump result incomplete: %+v", d)
	}
	if _, err := os.Stat(filepath.Join(img, "dump.log")); err == nil {
		t.Error("dump log written into the checkpoint dir despite WorkDir")
	}
	assertNoBreakpoints(t, d.LogPath)

	before := listDir(t, img)
	// Two copies of one image at once, next to the original.
	restored := make([]*RestoreResult, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range restored {
		work := filepath.Join(t.TempDir(), "w")
		wg.Go(func() {
			restored[i], errs[i] = Restore(ctx, RestoreOptions{CheckpointDir: img, WorkDir: work})
		})
	}
	wg.Wait()
	for i, r := range restored {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		killRestored(t, r)
		t.Logf("restore %d: %+v", i, r)
		assertNoBreakpoints(t, r.LogPath)
		if r.Pid == pid || parentOf(r.Pid) != os.Getpid() {
			t.Fatalf("restored pid %d: parent %d, want us (%d)", r.Pid, parentOf(r.Pid), os.Getpid())
		}
	}
	if after := listDir(t, img); !slices.Equal(before, after) {
		t.Errorf("restore changed the checkpoint dir:\n%v\n%v", before, after)
	}
	for _, r := range restored {
		c := waitCount(t, filepath.Join(filepath.Dir(origLog), strconv.Itoa(r.Pid)+".log"), 3)
		if c[0] != dumped+1 {
			t.Errorf("copy %d started at %d, want %d (dumped at %d)", r.Pid, c[0], dumped+1, dumped)
		}
		contiguous(t, "copy", c)
	}
	orig := waitCount(t, origLog, len(counts(t, origLog))+2)
	contiguous(t, "original", orig)

	// The copy is our child: killing and waiting collects its status.
	r := restored[0]
	if err := r.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	st, err := r.Process.Wait()
	if err != nil || st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("wait restored: %v %v", st, err)
	}
	if c := criuChildren(t); len(c) != 0 {
		t.Errorf("criu children left: %v", c)
	}
}

// A tiny container (own mount namespace, pivot_root'ed, /usr bind-mounted in as an external
// mount): dump, copy its files while frozen, restore into the copy with the kdat cache.
func TestDumpRestoreContainerKdat(t *testing.T) {
	requirePriv(t)
	ctx := context.Background()
	kdat := kdatTempDir(t)
	d, img, root2, dumped := dumpContained(t, kdat)
	t.Logf("dump: %+v", d)
	// Where /run is a tmpfs (systemd hosts, the test-v2 guest) criu caches its probes there
	// itself and LazyFork starts no kdat namespace (kdat.go): those checks do not apply.
	var fs unix.Statfs_t
	runTmpfs := unix.Statfs("/run", &fs) == nil && fs.Type == unix.TMPFS_MAGIC
	if runTmpfs {
		t.Log("/run is a tmpfs: criu keeps its own cache there; the kdat namespace checks are skipped")
	}
	if !runTmpfs && !d.KdatCache {
		t.Error("dump of a container did not use the kdat namespace")
	}
	caches, _ := filepath.Glob(filepath.Join(kdat, "kdat-*", "criu.kdat"))
	if !runTmpfs && len(caches) != 1 {
		t.Errorf("kdat cache files after dump: %v", caches)
	}

	assertNoBreakpoints(t, d.LogPath)

	// Without the external mount's mapping the restore fails; no restored task may be left
	// behind, not even a zombie child.
	before := ourChildren(t)
	_, err := Restore(ctx, RestoreOptions{CheckpointDir: img, WorkDir: filepath.Join(t.TempDir(), "w"), Root: root2, KdatDir: kdat})
	var ce *Error
	if !errors.As(err, &ce) || ce.Excerpt == "" {
		t.Fatalf("restore without mapping: err = %v", err)
	}
	t.Logf("restore without mapping:\n%v", err)
	if after := ourChildren(t); !slices.Equal(before, after) {
		t.Errorf("children before failed restore %v, after %v", before, after)
	}

	r, err := Restore(ctx, RestoreOptions{
		CheckpointDir: img, WorkDir: filepath.Join(t.TempDir(), "w"), Root: root2,
		ExternalMounts: map[string]string{"usr": "/usr"},
		KdatDir:        kdat,
	})
	if err != nil {
		t.Fatal(err)
	}
	killRestored(t, r)
	t.Logf("restore: %+v", r)
	if !runTmpfs && !r.KdatCache {
		t.Error("restore of a container did not use the kdat namespace")
	}
	assertNoBreakpoints(t, r.LogPath)
	if b, _ := os.ReadFile(r.LogPath); !strings.Contains(string(b), "Loaded kdat cache") {
		t.Error("restore did not load the kdat cache")
	}
	c := waitCount(t, filepath.Join(root2, "cnt.log"), dumped+4)
	contiguous(t, "copy", c)
	if c[0] != 0 || len(c) < dumped+4 {
		t.Errorf("copy counts %v, dumped at %d", c, dumped)
	}
	// The /run bind lived in criu's namespace only, and the threads that started criu in
	// it (kdat.go's start) are gone: every thread left is in our mount namespace.
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), kdat) {
		t.Error("kdat dir is mounted in our namespace")
	}
	ours, _ := os.Readlink("/proc/self/ns/mnt")
	foreign := func() (out []string) {
		tasks, _ := filepath.Glob("/proc/self/task/*/ns/mnt")
		for _, f := range tasks {
			if ns, err := os.Readlink(f); err == nil && ns != ours {
				out = append(out, f+" -> "+ns)
			}
		}
		return out
	}
	deadline := time.Now().Add(timescale.Scale(5 * time.Second))
	for len(foreign()) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if f := foreign(); len(f) > 0 {
		t.Errorf("threads left in another mount namespace than ours (%s): %v", ours, f)
	}
}

// kdatTempDir is a cache dir on tmpfs (/dev/shm), removed after the test.
func kdatTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "lf-criu-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func TestDumpDeadlineKillsCriu(t *testing.T) {
	requirePriv(t)
	pid, log := startBare(t)
	for _, timeout := range []time.Duration{time.Nanosecond, 30 * time.Millisecond} {
		start := time.Now()
		_, err := Dump(context.Background(), DumpOptions{Pid: pid, CheckpointDir: t.TempDir(), LeaveRunning: true, Timeout: timeout})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("timeout %v: err = %v, want deadline exceeded", timeout, err)
		}
		t.Logf("timeout %v: returned after %v: %v", timeout, time.Since(start), err)
		if c := criuChildren(t); len(c) != 0 {
			t.Fatalf("criu children left: %v", c)
		}
	}
	// The workload was not left stopped or frozen.
	n := len(counts(t, log))
	waitCount(t, log, n+3)
}

// A restore that fails or times out after criu created the root task leaves nothing behind.
func TestRestoreFailureReapsRoot(t *testing.T) {
	requirePriv(t)
	img := dumpedBare(t)
	root := restoreTimedOutAfterRoot(t, img, nil)
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", root)); err == nil {
		t.Errorf("restored root %d still exists (parent %d)", root, parentOf(root))
	}
	if c := criuChildren(t); len(c) != 0 {
		t.Errorf("criu children left: %v", c)
	}

	// A restore that criu rolls back after creating the root (our child) leaves no zombie.
	refuseEachScript(t, RestoreOptions{CheckpointDir: img}, nil)
}

// dumpedBare is a checkpoint of a bare workload, left running.
func dumpedBare(t *testing.T) string {
	t.Helper()
	pid, _ := startBare(t)
	img := t.TempDir()
	if _, err := Dump(context.Background(), DumpOptions{Pid: pid, CheckpointDir: img, LeaveRunning: true}); err != nil {
		t.Fatal(err)
	}
	return img
}

// restoreTimedOutAfterRoot restores img (through s, if any) with a deadline that runs out
// while post-restore waits: the restore must fail with the deadline, after creating the
// root task whose pid it returns.
func restoreTimedOutAfterRoot(t *testing.T, img string, s *Service) int {
	t.Helper()
	root := 0
	_, err := Restore(context.Background(), RestoreOptions{
		CheckpointDir: img, WorkDir: t.TempDir(), Timeout: timescale.Scale(time.Second), Service: s,
		Notify: func(script string, p int) error {
			if script == "post-restore" {
				root = p
				time.Sleep(timescale.Scale(1500 * time.Millisecond)) // criu (or the worker) is killed meanwhile
			}
			return nil
		},
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	if root == 0 {
		t.Fatal("no post-restore notification")
	}
	return root
}

// refuseEachScript restores o with the setup-namespaces, then the post-restore
// notification refused: each must fail with that cause and leave no child of ours (no
// zombie either); after runs after each for further checks.
func refuseEachScript(t *testing.T, o RestoreOptions, after func(script string)) {
	t.Helper()
	for _, script := range []string{"setup-namespaces", "post-restore"} {
		before := ourChildren(t)
		o.WorkDir = t.TempDir()
		o.Notify = func(s string, _ int) error {
			if s == script {
				return errors.New("refused")
			}
			return nil
		}
		_, err := Restore(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), "notify "+script+": refused") {
			t.Fatalf("err = %v", err)
		}
		if now := ourChildren(t); !slices.Equal(before, now) {
			t.Errorf("%s: children before failed restore %v, after %v", script, before, now)
		}
		if after != nil {
			after(script)
		}
	}
}

func TestNotifyErrorAbortsDump(t *testing.T) {
	requirePriv(t)
	pid, log := startBare(t)
	_, err := Dump(context.Background(), DumpOptions{
		Pid: pid, CheckpointDir: t.TempDir(), LeaveRunning: true,
		Notify: func(script string, _ int) error {
			if script == "post-dump" {
				return errors.New("snapshot failed")
			}
			return nil
		},
	})
	var ce *Error
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "notify post-dump: snapshot failed") {
		t.Fatalf("err = %v", err)
	}
	t.Logf("error:\n%v", err)
	n := len(counts(t, log))
	waitCount(t, log, n+3)
}

func TestDumpMissingPidQuotesLog(t *testing.T) {
	requirePriv(t)
	pid := freePid(t)
	img := t.TempDir()
	_, err := Dump(context.Background(), DumpOptions{Pid: pid, CheckpointDir: img})
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *Error", err)
	}
	t.Logf("error:\n%v", err)
	if ce.LogPath != filepath.Join(img, "dump.log") || !strings.Contains(ce.Excerpt, "Error") {
		t.Errorf("error lacks log: %+v", ce)
	}
	if !strings.Contains(err.Error(), ce.LogPath) || !strings.Contains(err.Error(), strconv.Itoa(pid)) {
		t.Errorf("message lacks log path or pid: %v", err)
	}
}

// freePid returns a PID nobody has: one of a child we started and reaped.
func freePid(t *testing.T) int {
	cmd := exec.Command("/bin/true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// TestRestoreLatency measures restores of a tiny container with and without the kdat cache.
// It asserts nothing about time; run with LF_CRIU_BENCH=1 (and -v) to see the numbers.
func TestRestoreLatency(t *testing.T) {
	if os.Getenv("LF_CRIU_BENCH") != "1" {
		t.Skip("set LF_CRIU_BENCH=1 to measure")
	}
	requirePriv(t)
	n := 15
	if s := os.Getenv("LF_CRIU_BENCH_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	ctx := context.Background()
	base := t.TempDir()
	root1, root2 := filepath.Join(base, "root1"), filepath.Join(base, "root2")
	pid := startContained(t, root1)
	makeRoot(t, root2)
	kdat := kdatTempDir(t)
	img := t.TempDir()
	var snapshot []byte
	dump := func(kd string) time.Duration {
		d, err := Dump(ctx, DumpOptions{
			Pid: pid, CheckpointDir: img, LeaveRunning: true, KdatDir: kd,
			ExternalMounts: map[string]string{"/usr": "usr"},
			Notify: func(script string, _ int) error {
				if script == "post-dump" {
					var err error
					snapshot, err = os.ReadFile(filepath.Join(root1, "cnt.log"))
					return err
				}
				return nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		return d.Wall
	}
	bindSelf(t, root2)
	restore := func(kd string) (time.Duration, time.Duration) {
		if err := os.WriteFile(filepath.Join(root2, "cnt.log"), snapshot, 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := Restore(ctx, RestoreOptions{
			CheckpointDir: img, WorkDir: filepath.Join(t.TempDir(), "w"), Root: root2, KdatDir: kd,
			ExternalMounts: map[string]string{"usr": "/usr"},
		})
		if err != nil {
			t.Fatal(err)
		}
		_ = r.Process.Kill()
		_, _ = r.Process.Wait()
		return r.Wall, r.Restore
	}
	version := func() time.Duration {
		s := time.Now()
		if _, _, _, err := Version(ctx, ""); err != nil {
			t.Fatal(err)
		}
		return time.Since(s)
	}
	dump(kdat) // warms the cache
	var dumpPlain, dumpKdat, wallPlain, wallKdat, innerPlain, innerKdat, vers []time.Duration
	for range n { // interleaved, so load drifts hit both alike
		dumpPlain = append(dumpPlain, dump(""))
		dumpKdat = append(dumpKdat, dump(kdat))
		w, in := restore("")
		wallPlain, innerPlain = append(wallPlain, w), append(innerPlain, in)
		w, in = restore(kdat)
		wallKdat, innerKdat = append(wallKdat, w), append(innerKdat, in)
		vers = append(vers, version())
	}
	med := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	t.Logf("n=%d medians: restore wall plain %v, kdat %v (ratio %.2f); criu restore_time plain %v, kdat %v",
		n, med(wallPlain), med(wallKdat), float64(med(wallKdat))/float64(med(wallPlain)), med(innerPlain), med(innerKdat))
	t.Logf("dump wall plain %v, kdat %v (ratio %.2f); version rpc %v",
		med(dumpPlain), med(dumpKdat), float64(med(dumpKdat))/float64(med(dumpPlain)), med(vers))
}

// The page server is used with the criu this host runs only if its header is the one
// memfile.PageServer reads; the answer matches the version criu gives.
func TestSpeaksWidePageServer(t *testing.T) {
	requirePriv(t)
	major, minor, _, err := Version(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	want := major > 4 || major == 4 && minor >= 2
	for range 2 { // the second answer is the remembered one
		if got := SpeaksWidePageServer(context.Background(), ""); got != want {
			t.Errorf("criu %d.%d: wide page server %v, want %v", major, minor, got, want)
		}
	}
	if SpeaksWidePageServer(context.Background(), "/nonexistent/criu") {
		t.Error("a missing binary speaks the wide page server")
	}
}
