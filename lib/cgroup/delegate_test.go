package cgroup

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// requireV2Controllers skips where LazyFork's groups are not v2 (this hybrid host keeps
// memory and pids on v1): the rules below are about v2's no-internal-processes rule.
func requireV2Controllers(t *testing.T) host {
	t.Helper()
	h, err := detectHost()
	if err != nil {
		t.Fatal(err)
	}
	if v2, err := h.backend(); err != nil || !v2 {
		t.Skipf("LazyFork's groups are not v2 on this host (backend v2=%v, %v): covered by make test-v2", v2, err)
	}
	return h
}

// leafHelperEnv makes the test binary a helper that runs Create(name, "") and prints the
// group's paths: how a process started in a delegated group's lazyfork-self leaf (the
// daemon under systemd with DelegateSubgroup=lazyfork-self) sees the default parent.
const leafHelperEnv = "LF_CGROUP_LEAF_HELPER"

// TestV2DelegatedLeaf: a caller in <g>/lazyfork-self gets its groups in <g>/lazyfork, with
// memory and pids enabled in <g>, and nothing is moved out of or into any group.
func TestV2DelegatedLeaf(t *testing.T) {
	if name := os.Getenv(leafHelperEnv); name != "" {
		c, err := Create(name, "")
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(3)
		}
		_ = json.NewEncoder(os.Stdout).Encode(c.Paths)
		os.Exit(0)
	}
	requireRoot(t)
	setParent(t, "")
	requireV2Controllers(t)
	// <g> is a group of the project's own (under the default /lazyfork), so the test
	// touches nothing it did not create.
	g, err := Create(testName(t), "")
	if err != nil {
		t.Fatal(err)
	}
	cleanupGroup(t, g) // kills the helper if it is left and removes the whole subtree
	gdir := g.FreezerDir()
	leaf := filepath.Join(gdir, SelfLeaf)
	if err := os.Mkdir(leaf, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Open(leaf, syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)

	name := testName(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestV2DelegatedLeaf$", "-test.count=1")
	cmd.Env = append(os.Environ(), leafHelperEnv+"="+name, ParentEnv+"=")   // the helper, a main, has no operator parent
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd} // born in the leaf
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper in %s: %v: %s", leaf, err, stderr.String())
	}
	var p Paths
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatalf("helper printed %q: %v", out, err)
	}
	want := filepath.Join(g.Paths[unified], "lazyfork", name)
	if !maps1(p, unified, want) {
		t.Fatalf("helper's group %v, want unified:%s", p, want)
	}
	c, err := LoadOwned(p)
	if err != nil {
		t.Fatal(err)
	}
	cleanupGroup(t, c)
	// The controllers reach the new group: <g> enables them for its children.
	b, err := os.ReadFile(filepath.Join(gdir, "cgroup.subtree_control"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range v2Required {
		if !slices.Contains(strings.Fields(string(b)), n) {
			t.Errorf("%s/cgroup.subtree_control = %q, lacks %s", gdir, b, n)
		}
	}
	if _, err := os.Stat(filepath.Join(c.FreezerDir(), "memory.max")); err != nil {
		t.Errorf("the group has no memory controller: %v", err)
	}
	if err := c.SetLimits(Limits{Memory: 64 << 20}); err != nil {
		t.Error(err)
	}
	if b, err := os.ReadFile(filepath.Join(c.FreezerDir(), "memory.max")); err != nil || strings.TrimSpace(string(b)) != "67108864" {
		t.Errorf("memory.max = %q, %v; want 67108864", b, err)
	}
}

func maps1(p Paths, k, v string) bool { return len(p) == 1 && p[k] == v }

// TestV2BusyParentError: a parent whose group holds a process cannot give controllers to
// children on v2. Create says so and how to fix it, and leaves no directory behind.
func TestV2BusyParentError(t *testing.T) {
	requireRoot(t)
	setParent(t, "")
	requireV2Controllers(t)
	busy, err := Create(testName(t), "")
	if err != nil {
		t.Fatal(err)
	}
	cleanupGroup(t, busy)
	cmd := startIn(t, busy, "exec sleep 100")
	waitComm(t, cmd.Process.Pid, "sleep")
	parent := filepath.Join(busy.Paths[unified], "lazyfork")
	_, err = Create(testName(t), parent)
	if err == nil {
		t.Fatal("Create under a group that holds a process succeeded")
	}
	if !errors.Is(err, syscall.EBUSY) || !strings.Contains(err.Error(), ParentEnv) || strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q: want one line naming EBUSY and %s", err, ParentEnv)
	}
	t.Log(err)
	if _, err := os.Stat(filepath.Join(busy.FreezerDir(), "lazyfork")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the failed Create left %s/lazyfork: %v", busy.FreezerDir(), err)
	}
}
