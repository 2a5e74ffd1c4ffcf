package fork_test

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// TestRepeatForkReadiedDuringDump: a repeat fork through a long-lived criu service (the
// daemon's way) reserves its record, makes its cgroup and readies the service's worker
// during the dump, and the new network namespace a confined --net none fork joins; the fork
// continues the count in its own cgroup and namespace. A fork whose dump fails leaves no
// record, no cgroup and no namespace-holding thread of what it made ready.
func TestRepeatForkReadiedDuringDump(t *testing.T) {
	rt := testutil.NewRuntime(t)
	svc, err := criu.StartService(ctx, criu.DefaultKdatDir(), rt.CRIU)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	src := create(t, rt, "counter", "python3", "-c", counterPy)
	testutil.Eventually(t, 10*time.Second, "counter to reach 5", func() bool { return lastInt(src) >= 5 })
	o := fork.Options{RestoreOptions: fork.RestoreOptions{N: 1, Service: svc}}
	doForkWith(t, rt, src, o) // the swap: the source maps its family from now on
	src = testutil.MustGet(t, rt, src.ID)

	rec := trace.New()
	forks, _, err := fork.Fork(trace.With(ctx, rec), rt, src, o)
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, s := range rec.Spans() {
		steps = append(steps, s.Name)
	}
	for _, want := range []string{"early: reserve the records", "early: make the cgroup, set its limits", "early: new network namespace", "wait for the forks made ready during the dump"} {
		if !slices.Contains(steps, want) {
			t.Errorf("no step %q in the repeat fork's trace: %q", want, steps)
		}
	}
	f := testutil.MustGet(t, rt, forks[0].ID)
	at := lastInt(src)
	testutil.Eventually(t, 10*time.Second, "fork to count on", func() bool { return lastInt(f) > at+2 })
	if f.State != store.StateRunning || f.Parent != src.ID || f.Family != src.Family || len(f.Lower) == 0 {
		t.Errorf("fork record: state %s parent %s family %s lower %v", f.State, f.Parent, f.Family, f.Lower)
	}
	cg, err := cgroup.LoadOwned(f.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	if pids, err := cg.Procs(); err != nil || !slices.Contains(pids, f.Pid) {
		t.Errorf("fork's init %d not in its cgroup: %v %v", f.Pid, pids, err)
	}
	netns := func(pid int) string { l, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); return l }
	if n := netns(f.Pid); n == "" || n == netns(src.Pid) || n == netns(os.Getpid()) {
		t.Errorf("fork's network namespace %q: the source's is %q, ours %q", n, netns(src.Pid), netns(os.Getpid()))
	}

	// A dump that fails (no such criu) after the fork was made ready.
	before, _ := rt.Containers.List()
	groups := func() []string {
		parent := filepath.Dir(cg.Paths[slices.Sorted(maps.Keys(cg.Paths))[0]])
		names, _ := os.ReadDir(parent)
		var out []string
		for _, n := range names {
			if n.IsDir() {
				out = append(out, n.Name())
			}
		}
		return out
	}
	groupsBefore := groups()
	bad := *rt
	bad.CRIU = filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(bad.CRIU, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := fork.Fork(ctx, &bad, src, o); err == nil {
		t.Fatal("fork with a broken criu worked")
	}
	after, _ := rt.Containers.List()
	if len(after) != len(before) {
		t.Errorf("%d records after the failed fork, %d before", len(after), len(before))
	}
	if g := groups(); !slices.Equal(g, groupsBefore) {
		t.Errorf("cgroups after the failed fork %v, before %v", g, groupsBefore)
	}
	if st := rt.State(testutil.MustGet(t, rt, src.ID)); st != store.StateRunning {
		t.Errorf("source %s after the failed fork", st)
	}
	// The namespace made ready is held by a thread of ours until a restore takes it.
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		if l, _ := os.Readlink("/proc/self/task/" + task.Name() + "/ns/net"); l != "" && l != netns(os.Getpid()) {
			t.Errorf("thread %s is still in network namespace %s after the failed fork", task.Name(), l)
		}
	}
}
