package fork_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
	"github.com/lazyfork/lazyfork/lib/trace"
)

const readyStep = "swap: make the new source's cgroup and criu worker"

// A running container's first fork through a criu service makes the new source's cgroup
// and criu worker, and the fork's record, group and worker, before the freeze, and the
// restores use them: nothing of the kind is made while the source is frozen. The new source runs in that group (named after the
// container and the snapshot), counts on from where it was frozen without a gap, the old
// processes and their group are gone once the fork returns, and the fork counts on from
// the fork instant. A swap dump that fails (a broken criu) ends the group made ahead, and
// GC ends one whose dump died before it recorded the swap.
func TestSwapReadiedBeforeTheFreeze(t *testing.T) {
	rt := testutil.NewRuntime(t)
	svc, err := criu.StartService(ctx, criu.DefaultKdatDir(), rt.CRIU)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	src := create(t, rt, "ready", "python3", "-c", counterPy)
	testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src) >= 3 })
	oldPid, oldCg := src.Pid, src.Cgroup
	o := fork.Options{RestoreOptions: fork.RestoreOptions{N: 1, Service: svc}}
	rec := trace.New()
	forks, s, err := fork.Fork(trace.With(ctx, rec), rt, src, o)
	if err != nil {
		t.Fatal(err)
	}
	spans := rec.Spans()
	find := func(name string) (trace.Span, bool) {
		i := slices.IndexFunc(spans, func(s trace.Span) bool { return s.Name == name })
		if i < 0 {
			return trace.Span{}, false
		}
		return spans[i], true
	}
	ready, ok1 := find(readyStep)
	freeze, ok2 := find("freeze the source")
	resumed, ok3 := find("read the restored init's start time") // the new source's, the first
	if !ok1 || !ok2 || !ok3 {
		t.Fatalf("steps missing from the first fork's trace (%q %v, freeze %v, restored %v)", readyStep, ok1, ok2, ok3)
	}
	if ready.StartMs+ready.Ms > freeze.StartMs {
		t.Errorf("the new source's group and worker were ready at %.1f ms, after the freeze at %.1f ms", ready.StartMs+ready.Ms, freeze.StartMs)
	}
	for _, sp := range spans {
		made := sp.Name == "make the cgroup, set its limits" || sp.Name == "criu service: new worker (connect, hello)" || sp.Name == "new network namespace"
		if made && sp.StartMs >= freeze.StartMs && sp.StartMs <= resumed.StartMs {
			t.Errorf("%q at %.1f ms, while the source was frozen (%.1f-%.1f ms)", sp.Name, sp.StartMs, freeze.StartMs, resumed.StartMs)
		}
		// The fork's record and group were made ready during the dump too, before the
		// freeze.
		if strings.HasPrefix(sp.Name, "early: ") && sp.StartMs+sp.Ms > freeze.StartMs {
			t.Errorf("%q ended at %.1f ms, after the freeze at %.1f ms", sp.Name, sp.StartMs+sp.Ms, freeze.StartMs)
		}
	}
	for _, want := range []string{"early: reserve the records", "early: make the cgroup, set its limits", "wait for the forks made ready during the dump"} {
		if _, ok := find(want); !ok {
			t.Errorf("no step %q in the first fork's trace", want)
		}
	}
	cur := testutil.MustGet(t, rt, src.ID)
	cg, err := cgroup.LoadOwned(cur.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range cur.Cgroup {
		if filepath.Base(p) != src.ID+"-"+s.ID {
			t.Errorf("the new source's group is %s, want %s", p, src.ID+"-"+s.ID)
		}
	}
	if pids, err := cg.Procs(); err != nil || !slices.Contains(pids, cur.Pid) || cur.Pid == oldPid {
		t.Errorf("new source %d (old %d) not in its group: %v %v", cur.Pid, oldPid, pids, err)
	}
	if _, err := os.Stat("/proc/" + itoa(oldPid)); err == nil {
		t.Errorf("the old source process %d is still there after the fork returned", oldPid)
	}
	// A confined --net none source gets a namespace of its own (made before the freeze),
	// never the host's.
	host, err1 := os.Readlink("/proc/self/ns/net")
	ns, err2 := os.Readlink("/proc/" + itoa(cur.Pid) + "/ns/net")
	if err1 != nil || err2 != nil || ns == host {
		t.Errorf("the new source's network namespace %q (host %q): %v %v", ns, host, err1, err2)
	}
	if _, ok := find("swap: new network namespace"); !ok && cur.Confine != nil && !cur.Confine.Privileged {
		t.Errorf("no step %q: the confined source's namespace was not made before the freeze", "swap: new network namespace")
	}
	if g, err := cgroup.LoadOwned(oldCg); err == nil {
		if _, err := os.Stat(g.FreezerDir()); err == nil {
			t.Errorf("the old source's group %s is still there after the fork returned", g.FreezerDir())
		}
	}
	f := testutil.MustGet(t, rt, forks[0].ID)
	at := lastInt(cur)
	testutil.Eventually(t, 10*time.Second, "source and fork to count on", func() bool {
		return lastInt(cur) > at+3 && lastInt(f) > at+3
	})
	prev := -1
	for _, line := range lines(cur) {
		if n := atoi(strings.TrimSpace(line)); n >= 0 {
			if prev >= 0 && n != prev+1 {
				t.Fatalf("the source's count jumped from %d to %d", prev, n)
			}
			prev = n
		}
	}

	// A swap dump that fails after the group was made ahead: the group goes with it.
	src2 := create(t, rt, "ready-fail", "python3", "-c", counterPy)
	testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src2) >= 3 })
	bad := *rt
	bad.CRIU = filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(bad.CRIU, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	before, _ := rt.Containers.List()
	rec2 := trace.New()
	if _, _, err := fork.Fork(trace.With(ctx, rec2), &bad, src2, o); err == nil {
		t.Fatal("a fork with a broken criu worked")
	}
	if !slices.ContainsFunc(rec2.Spans(), func(s trace.Span) bool { return s.Name == readyStep }) {
		t.Errorf("the failed fork made nothing ahead (no %q step): the test does not test it", readyStep)
	}
	if g := groupsNamed(t, src2, src2.ID+"-"); len(g) > 0 {
		t.Errorf("a failed swap dump left the group made ahead: %v", g)
	}
	if after, _ := rt.Containers.List(); len(after) != len(before) {
		t.Errorf("%d records after the failed fork, %d before", len(after), len(before))
	}
	if st := rt.State(testutil.MustGet(t, rt, src2.ID)); st != store.StateRunning {
		t.Errorf("source %s after the failed fork", st)
	}

	// A dump for a swap that died before it recorded the swap (the snapshot says copy):
	// GC ends the group made ahead.
	s3, err := fork.Dump(ctx, rt, src2, fork.DumpOptions{})
	if err != nil {
		t.Fatal(err)
	}
	left, err := cgroup.Create(src2.ID+"-"+s3.ID, rt.CgroupParent)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = left.Remove() })
	s3.Owner = 1 << 22 // as if its process had been killed
	if err := fork.Save(s3); err != nil {
		t.Fatal(err)
	}
	if err := fork.GC(rt); err != nil {
		t.Fatal(err)
	}
	if g := groupsNamed(t, src2, src2.ID+"-"); len(g) > 0 {
		t.Errorf("GC left the group of a dead swap dump: %v", g)
	}
	if st := rt.State(testutil.MustGet(t, rt, src2.ID)); st != store.StateRunning {
		t.Errorf("source %s after GC", st)
	}
}

// groupsNamed lists the groups beside c's (every hierarchy: v1's, or v2's one) whose name
// starts with prefix.
func groupsNamed(t *testing.T, c *store.Container, prefix string) []string {
	t.Helper()
	cg, err := cgroup.LoadOwned(c.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, procs := range cg.AllProcsFiles() {
		parent := filepath.Dir(filepath.Dir(procs))
		ents, _ := os.ReadDir(parent)
		for _, e := range ents {
			if e.IsDir() && strings.HasPrefix(e.Name(), prefix) {
				out = append(out, filepath.Join(parent, e.Name()))
			}
		}
	}
	return out
}
