package fork_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// lazyforkBin is the porcelain `make build` put in $LAZYFORK_BIN (the Makefile's test
// target sets it). Without it the kill tests cannot run: a failure where privileged tests
// are required.
func lazyforkBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(os.Getenv("LAZYFORK_BIN"), "lazyfork")
	if os.Getenv("LAZYFORK_BIN") != "" {
		if _, err := os.Stat(bin); err == nil {
			return bin
		}
	}
	if os.Getenv("CI") == "true" || os.Getenv("LF_REQUIRE_PRIV") == "1" {
		t.Fatalf("no lazyfork binary in $LAZYFORK_BIN (%q): run `make build` and set LAZYFORK_BIN=$PWD/bin", os.Getenv("LAZYFORK_BIN"))
	}
	t.Skip("needs the built porcelain: set LAZYFORK_BIN (make build)")
	return ""
}

// killPoint is a moment of a running swap, recognised from outside: the process running
// it is stopped (SIGSTOP) the moment it is seen, then SIGKILLed.
type killPoint struct {
	name string
	seen func(rt *container.Runtime, src *store.Container) bool
}

// swapSnapshot is the snapshot of a swap in progress of src, if any.
func swapSnapshot(src *store.Container) *stage.Snapshot {
	ents, _ := os.ReadDir(paths.Snapshots())
	for _, e := range ents {
		s, err := fork.LoadSnapshot(filepath.Join(paths.Snapshots(), e.Name()))
		if err == nil && s.Swap && s.Source.ID == src.ID {
			return s
		}
	}
	return nil
}

// groupsOf lists the freezer groups named after src (its own, and a new source's
// "<id>-<snapshot>") beside the group its record names (a tree member's are inside the
// tree's cgroup).
func groupsOf(t *testing.T, rt *container.Runtime, src *store.Container) []string {
	t.Helper()
	r, err := cgroup.Resolve(src.ID, cgroup.ParentOf(src.Cgroup))
	if err != nil {
		t.Fatal(err)
	}
	parent := filepath.Dir(r.FreezerDir())
	ents, _ := os.ReadDir(parent)
	var out []string
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), src.ID) {
			out = append(out, filepath.Join(parent, e.Name()))
		}
	}
	return out
}

func frozen(src *store.Container) bool {
	cg, err := cgroup.Load(src.Cgroup)
	if err != nil {
		return false
	}
	b, _ := os.ReadFile(filepath.Join(cg.FreezerDir(), "freezer.state"))
	return strings.TrimSpace(string(b)) == "FROZEN"
}

var swapKillPoints = []killPoint{
	{"frozen", func(_ *container.Runtime, src *store.Container) bool { return frozen(src) }},
	{"dumped", func(_ *container.Runtime, src *store.Container) bool {
		s := swapSnapshot(src)
		return s != nil && s.State == stage.SnapDumped
	}},
	{"memfiled", func(_ *container.Runtime, src *store.Container) bool {
		s := swapSnapshot(src)
		return s != nil && s.State == stage.SnapMemfiled
	}},
	{"restoring", func(rt *container.Runtime, src *store.Container) bool {
		r, err := cgroup.Resolve(src.ID, cgroup.ParentOf(src.Cgroup))
		if err != nil {
			return false
		}
		ents, _ := os.ReadDir(filepath.Dir(r.FreezerDir()))
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), src.ID+"-s") {
				return true
			}
		}
		return false
	}},
	{"committed", func(rt *container.Runtime, src *store.Container) bool {
		c, err := rt.Containers.Get(src.ID)
		return err == nil && c.Pid != src.Pid
	}},
	{"forking", func(rt *container.Runtime, src *store.Container) bool {
		all, _ := rt.Containers.List()
		return len(all) > 1
	}},
}

// procState is the state letter of /proc/pid/stat ("" when the pid is gone).
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return ""
	}
	return string(b[i+2])
}

func living(pid int) bool { s := procState(pid); return s != "" && s != "Z" && s != "X" }

// killMidSwap runs `run` (a command that forks src; with the daemon, the daemon is the
// victim) until the point is seen, stops and kills victim, and returns whether the
// point was seen before the command ended.
func killMidSwap(t *testing.T, rt *container.Runtime, src *store.Container, p killPoint, run *exec.Cmd, victim func() *os.Process) bool {
	t.Helper()
	var out bytes.Buffer
	run.Stdout, run.Stderr = &out, &out
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = run.Wait(); close(done) }()
	t.Cleanup(func() { _ = run.Process.Kill(); <-done })
	hit := false
	deadline := time.Now().Add(2 * time.Minute)
loop:
	for time.Now().Before(deadline) {
		select {
		case <-done:
			break loop
		default:
		}
		if p.seen(rt, src) {
			v := victim()
			_ = v.Signal(syscall.SIGSTOP)
			hit = true
			_ = v.Kill()
			break
		}
		time.Sleep(200 * time.Microsecond)
	}
	_ = run.Process.Kill()
	<-done
	t.Logf("%s: seen=%v; the command said: %s", p.name, hit, strings.TrimSpace(out.String()))
	return hit
}

// checkOneSource runs `lazyfork gc` and checks that exactly one source runs, thawed and
// counting on, that the record names it, and that nothing else of the swap is left: no
// second group, no swap snapshot, one root mount.
func checkOneSource(t *testing.T, rt *container.Runtime, bin string, src *store.Container, env []string) {
	t.Helper()
	gc := exec.Command(bin, "gc")
	gc.Env = append(os.Environ(), append(env, "LAZYFORK_LOCAL=1")...)
	if out, err := gc.CombinedOutput(); err != nil {
		t.Fatalf("lazyfork gc after the kill: %v: %s", err, out)
	}
	cur, err := rt.Containers.Get(src.ID)
	if err != nil {
		t.Fatalf("the source's record is gone: %v", err)
	}
	oldAlive, newAlive := living(src.Pid), cur.Pid != src.Pid && living(cur.Pid)
	switch {
	case oldAlive && newAlive:
		t.Fatalf("both the old (%d) and the new (%d) source run", src.Pid, cur.Pid)
	case !oldAlive && !newAlive:
		t.Fatalf("neither the old (%d) nor the new (%d) source runs", src.Pid, cur.Pid)
	case oldAlive && cur.Pid != src.Pid:
		t.Fatalf("the old source %d runs but the record names %d", src.Pid, cur.Pid)
	}
	t.Logf("after gc the %s source runs (pid %d)", map[bool]string{true: "old", false: "new"}[oldAlive], cur.Pid)
	if st := rt.State(cur); st != store.StateRunning {
		t.Fatalf("the source is %s after gc, want running", st)
	}
	n := lastInt(cur)
	testutil.Eventually(t, 15*time.Second, "the source to count on", func() bool { return lastInt(cur) > n+2 })
	if g := groupsOf(t, rt, src); len(g) != 1 {
		t.Errorf("groups named after the source: %v, want one", g)
	} else if cg, err := cgroup.Load(cur.Cgroup); err != nil || cg.FreezerDir() != g[0] {
		t.Errorf("the record names group %v, the one left is %s", cur.Cgroup, g[0])
	}
	if s := swapSnapshot(src); s != nil {
		t.Errorf("gc left the swap snapshot %s (%s)", s.ID, s.State)
	}
	if m := fsutil.MountsUnder(rt.Containers.Path(src.ID)); len(m) != 1 {
		t.Errorf("mounts under the source's directory: %v, want its root only", m)
	}
	// No process kept the state lock (criu holds it while it runs; restored tasks must
	// not inherit it).
	unlock, err := fork.LockState(ctx, true, 5*time.Second)
	if err != nil {
		t.Errorf("the state lock is still held after gc: %v", err)
	} else {
		unlock()
	}
	// A fork whose restore the kill cut short is gone; one that ran is a container.
	all, _ := rt.Containers.List()
	for _, c := range all {
		if c.ID != src.ID && rt.State(c) != store.StateRunning {
			t.Errorf("after gc, fork %s is %s", c.ID, rt.State(c))
		}
	}
}

// A SIGKILL of a real `lazyfork fork` at each point of the first fork's swap leaves either
// the old or the new source running (never none, never both), and `lazyfork gc` cleans
// up what the killed command left.
func TestKilledPorcelainMidSwap(t *testing.T) {
	rt := testutil.NewRuntime(t)
	bin := lazyforkBin(t)
	seen := 0
	for _, p := range swapKillPoints {
		t.Run(p.name, func(t *testing.T) {
			groups := countCgroupDirs()
			src := create(t, rt, "", "python3", "-c", counterPy)
			testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src) >= 2 })
			cmd := exec.Command(bin, "fork", src.ID)
			cmd.Env = append(os.Environ(), "LAZYFORK_LOCAL=1")
			if killMidSwap(t, rt, src, p, cmd, func() *os.Process { return cmd.Process }) {
				seen++
			}
			checkOneSource(t, rt, bin, src, nil)
			deleteAll(t, rt)
			checkGroupsGone(t, groups)
		})
	}
	if seen < 4 {
		t.Errorf("only %d of %d kill points were caught before the fork ended", seen, len(swapKillPoints))
	}
}

// The same with the daemon doing the fork: the daemon is SIGKILLed mid-swap.
func TestKilledDaemonMidSwap(t *testing.T) {
	rt := testutil.NewRuntime(t)
	bin := lazyforkBin(t)
	dir, err := os.MkdirTemp("/tmp", "lfk-") // short: sun_path is 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := []string{"LAZYFORK_SOCKET=" + filepath.Join(dir, "d.sock")}
	seen := 0
	for _, p := range swapKillPoints {
		t.Run(p.name, func(t *testing.T) {
			groups := countCgroupDirs()
			d := exec.Command(bin, "daemon", "run")
			d.Env = append(os.Environ(), sock...)
			var dlog bytes.Buffer
			d.Stdout, d.Stderr = &dlog, &dlog
			if err := d.Start(); err != nil {
				t.Fatal(err)
			}
			dead := make(chan struct{})
			go func() { _ = d.Wait(); close(dead) }()
			t.Cleanup(func() { _ = d.Process.Kill(); <-dead })
			testutil.Eventually(t, 20*time.Second, "the daemon to answer", func() bool {
				st := exec.Command(bin, "daemon", "status")
				st.Env = append(os.Environ(), sock...)
				return st.Run() == nil
			})
			src := create(t, rt, "", "python3", "-c", counterPy)
			testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src) >= 2 })
			cmd := exec.Command(bin, "fork", src.ID)
			cmd.Env = append(os.Environ(), sock...)
			if killMidSwap(t, rt, src, p, cmd, func() *os.Process { return d.Process }) {
				seen++
			}
			_ = d.Process.Kill()
			<-dead
			checkOneSource(t, rt, bin, src, sock)
			deleteAll(t, rt)
			checkGroupsGone(t, groups)
		})
	}
	if seen < 4 {
		t.Errorf("only %d of %d kill points were caught before the fork ended", seen, len(swapKillPoints))
	}
}

// checkGroupsGone checks that no cgroup directory is left, in any hierarchy, of those the
// kill point's containers had: a kill inside cgroup.Create (between the memory and pids
// mkdirs) used to leave a bare memory group that delete and gc skipped.
func checkGroupsGone(t *testing.T, before int) {
	t.Helper()
	if after := countCgroupDirs(); after != before {
		t.Errorf("%d LazyFork cgroup directories before the fork, %d after the kill, gc and delete of everything", before, after)
	}
}

// deleteAll deletes every container and collects, as between two kill points.
func deleteAll(t *testing.T, rt *container.Runtime) {
	t.Helper()
	all, _ := rt.Containers.List()
	var errs []error
	for _, c := range all {
		errs = append(errs, rt.Delete(c))
	}
	errs = append(errs, fork.GC(rt))
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}
