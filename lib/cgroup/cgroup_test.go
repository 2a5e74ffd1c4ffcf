package cgroup

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	cgroups "github.com/containerd/cgroups/v3"
	"github.com/lazyfork/lazyfork/lib/testutil/priv"
)

func requireRoot(t *testing.T) {
	t.Helper()
	priv.Root(t, "to create cgroups")
}

func testName(t *testing.T) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "lazyfork-test-" + hex.EncodeToString(b)
}

// cleanupGroup kills and removes c when the test ends, whatever happened.
// newGroup creates group name under the default parent; it is killed and removed when
// the test ends.
func newGroup(t *testing.T, name string) *Cgroup {
	t.Helper()
	c, err := Create(name, "")
	if err != nil {
		t.Fatal(err)
	}
	cleanupGroup(t, c)
	return c
}

func cleanupGroup(t *testing.T, c *Cgroup) {
	t.Cleanup(func() {
		if err := c.Kill(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if err := c.Remove(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}

// startIn starts `sh -c script` and moves it into c before it execs anything, so the
// script's memory is charged to c.
func startIn(t *testing.T, c *Cgroup, script string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", "read _; "+script)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := c.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(in, "\n"); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// waitComm waits until pid runs the program comm (i.e. has exec'd it).
func waitComm(t *testing.T, pid int, comm string) {
	t.Helper()
	for i := 0; i < 500; i++ {
		b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		if strings.TrimSpace(string(b)) == comm {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("pid %d never ran %s", pid, comm)
}

// procState is the state letter of /proc/PID/stat.
func procState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[0]
}

// ownPaths parses /proc/self/cgroup independently of the package.
func ownPaths(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		for _, ctrl := range strings.Split(parts[1], ",") {
			if ctrl == "" {
				ctrl = unified
			}
			out[ctrl] = parts[2]
		}
	}
	return out
}

func dirsOf(t *testing.T, c *Cgroup) []string {
	t.Helper()
	var dirs []string
	for _, k := range c.keys() {
		d, err := c.dir(k)
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d)
	}
	return dirs
}

func TestLifecycle(t *testing.T) {
	requireRoot(t)
	name := testName(t)
	c := newGroup(t, name)
	if Mode() == "hybrid" && c.V2 {
		t.Fatalf("hybrid host with v1 memory should use v1, got v2")
	}
	for _, d := range dirsOf(t, c) {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("group dir missing: %v", err)
		}
	}

	cmd := startIn(t, c, "exec sleep 100")
	pid := cmd.Process.Pid
	waitComm(t, pid, "sleep")

	procs, err := c.Procs()
	if err != nil || !slices.Equal(procs, []int{pid}) {
		t.Fatalf("Procs = %v, %v; want [%d]", procs, err, pid)
	}
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats: %+v", st)
	if st.Pids != 1 || st.MemoryBytes == 0 || st.Frozen {
		t.Fatalf("stats %+v: want 1 pid, memory > 0, not frozen", st)
	}
	if !c.V2 && st.Tasks != 1 {
		t.Fatalf("pids.current = %d, want 1", st.Tasks)
	}

	// Load from the JSON-able paths sees the same group.
	c2, err := Load(c.Paths)
	if err != nil {
		t.Fatal(err)
	}
	if c2.Name != name || c2.V2 != c.V2 {
		t.Fatalf("Load = %+v", c2)
	}

	before := procState(t, pid)
	if err := c2.Freeze(); err != nil {
		t.Fatal(err)
	}
	if st, err = c.Stats(); err != nil || !st.Frozen {
		t.Fatalf("after Freeze: %+v, %v", st, err)
	}
	frozen := procState(t, pid)
	if err := c2.Thaw(); err != nil {
		t.Fatal(err)
	}
	if st, err = c.Stats(); err != nil || st.Frozen {
		t.Fatalf("after Thaw: %+v, %v", st, err)
	}
	thawed := procState(t, pid)
	t.Logf("/proc/%d/stat state: before %s, frozen %s, thawed %s", pid, before, frozen, thawed)
	// A v1-frozen task sleeps uninterruptibly in the freezer; v2 shows it stopped.
	if !c.V2 && (frozen != "D" || thawed != "S") {
		t.Fatalf("state frozen %q thawed %q, want D then S", frozen, thawed)
	}

	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	if procs, err := c.Procs(); err != nil || len(procs) != 0 {
		t.Fatalf("after Kill: %v, %v", procs, err)
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("child exit: %v, want killed", err)
	}

	if err := c.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirsOf(t, c) {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s still there after Remove: %v", d, err)
		}
	}
	if err := c.Remove(); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
}

func TestKillProcessTree(t *testing.T) {
	requireRoot(t)
	c, err := Create(testName(t), "")
	if err != nil {
		t.Fatal(err)
	}
	cleanupGroup(t, c)
	cmd := startIn(t, c, "sleep 100 & sleep 100 & echo ready; wait")
	var procs []int
	for i := 0; i < 500 && len(procs) < 3; i++ {
		time.Sleep(10 * time.Millisecond)
		if procs, err = c.Procs(); err != nil {
			t.Fatal(err)
		}
	}
	if len(procs) != 3 {
		t.Fatalf("want sh + 2 sleeps, got %v", procs)
	}
	if err := c.Remove(); err == nil || !strings.Contains(err.Error(), "still holds processes") {
		t.Fatalf("Remove of a busy group: %v, want a clear error", err)
	}
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if err := c.Remove(); err != nil {
		t.Fatal(err)
	}
}

func TestCreateExistingFails(t *testing.T) {
	requireRoot(t)
	name := testName(t)
	c := newGroup(t, name)
	if _, err := Create(name, ""); !errors.Is(err, ErrExists) {
		t.Fatalf("second Create: %v, want ErrExists", err)
	}
	// The failed Create must not have undone the first one.
	for _, d := range dirsOf(t, c) {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("first group damaged: %v", err)
		}
	}
}

// wantDefaultParent is the default parent the docs promise for hierarchy k: `lazyfork`
// in the caller's own group on v1; on v2 `/lazyfork`, or `<g>/lazyfork` for a caller in
// `<g>/lazyfork-self`.
func wantDefaultParent(t *testing.T, k string) string {
	own := ownPaths(t)[k]
	if k != unified {
		return filepath.Join(own, "lazyfork")
	}
	if filepath.Base(own) == "lazyfork-self" {
		return filepath.Join(filepath.Dir(own), "lazyfork")
	}
	return "/lazyfork"
}

func TestDefaultParentIsOwnCgroup(t *testing.T) {
	requireRoot(t)
	setParent(t, "") // the product's default, whatever the test run sets
	name := testName(t)
	c := newGroup(t, name)
	f, err := HostFacts()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range c.keys() {
		want := filepath.Join(wantDefaultParent(t, k), name)
		if c.Paths[k] != want {
			t.Errorf("%s path %s, want %s", k, c.Paths[k], want)
		}
		if f.DefaultParent[k] != filepath.Dir(want) {
			t.Errorf("HostFacts default_parent %s = %q, want %s", k, f.DefaultParent[k], filepath.Dir(want))
		}
	}
	if !c.V2 {
		want := []string{"memory:" + c.Paths["memory"], "pids:" + c.Paths["pids"], "freezer:" + c.Paths["freezer"]}
		if p, ok := c.Paths["devices"]; ok {
			want = append(want, "devices:"+p)
		}
		if got := c.CriuRootArgs(); !slices.Equal(got, want) {
			t.Errorf("CriuRootArgs = %v, want %v", got, want)
		}
		if got, want := c.FreezerDir(), filepath.Join("/sys/fs/cgroup/freezer", c.Paths["freezer"]); got != want {
			t.Errorf("FreezerDir = %s, want %s", got, want)
		}
		if _, err := os.Stat(filepath.Join(c.FreezerDir(), "freezer.state")); err != nil {
			t.Error(err)
		}
	}
}

func TestParentOverride(t *testing.T) {
	requireRoot(t)
	top := "/" + testName(t)
	parent := top + "/lazyfork"
	setParent(t, parent)
	c, err := Create(testName(t), "")
	if err != nil {
		t.Fatal(err)
	}
	cleanupGroup(t, c)
	t.Cleanup(func() {
		for _, k := range c.keys() {
			_ = os.Remove(filepath.Join(c.mounts[k].dir, top))
		}
	})
	for _, k := range c.keys() {
		if want := filepath.Join(parent, c.Name); c.Paths[k] != want {
			t.Errorf("%s path %s, want %s", k, c.Paths[k], want)
		}
	}
	if err := c.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, k := range c.keys() {
		// The empty lazyfork parent goes with the last group; the override's top stays.
		if _, err := os.Stat(filepath.Join(c.mounts[k].dir, parent)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("empty %s parent left behind: %v", k, err)
		}
		if _, err := os.Stat(filepath.Join(c.mounts[k].dir, top)); err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}
}

// v2Group resolves (without creating it) a group of the test's own on the host's cgroup2
// mount, which a host without one cannot give.
func v2Group(t *testing.T) (host, *Cgroup) {
	t.Helper()
	h, err := detectHost()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := h.mounts[unified]; !ok {
		priv.Miss(t, "no cgroup2 mount")
	}
	c, err := resolve(h, true, testName(t), "")
	if err != nil {
		t.Fatal(err)
	}
	return h, c
}

// TestV2Hierarchy runs the v2 code on whatever cgroup2 mount the host has (on a hybrid
// host the controller-less /sys/fs/cgroup/unified): freezer, kill and procs are core v2.
func TestV2Hierarchy(t *testing.T) {
	requireRoot(t)
	setParent(t, "")
	h, c := v2Group(t)
	var need []string
	if containsAll(h.v2Controllers, v2Required) {
		need = v2Required
	}
	if err := c.create(need); err != nil {
		t.Fatal(err)
	}
	cleanupGroup(t, c)
	if want := filepath.Join(wantDefaultParent(t, unified), c.Name); c.Paths[unified] != want {
		t.Fatalf("path %s, want %s", c.Paths[unified], want)
	}
	wantRoot := ":" + c.Paths[unified]
	if cgroups.Mode() == cgroups.Unified {
		wantRoot = c.Paths[unified]
	}
	if got := c.CriuRootArgs(); !slices.Equal(got, []string{wantRoot}) {
		t.Fatalf("CriuRootArgs = %v, want [%s]", got, wantRoot)
	}

	cmd := startIn(t, c, "exec sleep 100")
	pid := cmd.Process.Pid
	waitComm(t, pid, "sleep")
	if procs, err := c.Procs(); err != nil || !slices.Equal(procs, []int{pid}) {
		t.Fatalf("Procs = %v, %v", procs, err)
	}
	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	st, err := c.Stats()
	if err != nil || !st.Frozen || st.Pids != 1 {
		t.Fatalf("frozen stats %+v, %v", st, err)
	}
	if err := c.Thaw(); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if err := c.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.FreezerDir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("v2 dir left: %v", err)
	}
}

func TestLoadRejectsForeignPaths(t *testing.T) {
	for _, p := range []Paths{
		{"memory": "/", "pids": "/", "freezer": "/"},
		{"memory": "/a/x", "pids": "/a/y", "freezer": "/a/x"},
		{"memory": "/a/x"},
		{"memory": "/a/../x", "pids": "/x", "freezer": "/x"},
		{"unified": "/a/x", "memory": "/a/x"},
		{"cpu": "/a/x", "pids": "/a/x", "freezer": "/a/x"},
		{},
	} {
		if _, err := Load(p); err == nil {
			t.Errorf("Load(%v) accepted", p)
		}
	}
	for _, n := range []string{"", "..", "a/b", ".hidden", strings.Repeat("x", 200)} {
		if _, err := resolve(host{}, false, n, "/p"); err == nil {
			t.Errorf("name %q accepted", n)
		}
	}
	if _, err := resolve(host{}, false, "ok", "/p/../q"); err == nil {
		t.Error("parent with .. accepted")
	}
}
