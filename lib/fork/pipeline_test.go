package fork_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/testutil"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// TestBatchMakesForksReadyAhead: a batch makes each fork's cgroup and criu worker while
// earlier forks restore (the worker's move into the group waits for an RCU grace period),
// one restore at a time here; every fork still runs in its own group. A batch interrupted
// while forks were made ready ahead leaves none of their groups.
func TestBatchMakesForksReadyAhead(t *testing.T) {
	rt := testutil.NewRuntime(t)
	_, s := countingSnapshot(t, rt, "ahead", true)
	rec := trace.New()
	forks, err := fork.Restore(trace.With(ctx, rec), rt, s, fork.RestoreOptions{N: 4, Parallel: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, f := range forks {
			_ = rt.Delete(testutil.MustGet(t, rt, f.ID))
		}
	})
	var ahead, restores, forkSpans []trace.Span
	for _, sp := range rec.Spans() {
		if strings.HasPrefix(sp.Name, "fork ") {
			forkSpans = append(forkSpans, sp)
		}
		switch sp.Name {
		case "ahead: make the cgroup, set its limits":
			ahead = append(ahead, sp)
		case "criu restore":
			restores = append(restores, sp)
		case "make the cgroup, set its limits":
			t.Errorf("a fork's cgroup was made in its restore's path (step %q)", sp.Name)
		}
	}
	byStart := func(a, b trace.Span) int { return int(a.StartMs*1000) - int(b.StartMs*1000) }
	slices.SortFunc(ahead, byStart)
	slices.SortFunc(restores, byStart)
	if len(ahead) != 4 || len(restores) != 4 {
		t.Fatalf("%d forks made ready ahead and %d restores, want 4 and 4", len(ahead), len(restores))
	}
	if first := restores[0]; ahead[1].StartMs >= first.StartMs+first.Ms {
		t.Errorf("the second fork was made ready at %.1f ms, after the first restore ended (%.1f ms): not ahead", ahead[1].StartMs, first.StartMs+first.Ms)
	}
	// The slot goes back when criu reports the tree resumed, before it answers: the next
	// fork starts while criu tears down what it used (one chance in three is plenty; with
	// the slot given back after the answer it never happens).
	slices.SortFunc(forkSpans, byStart)
	overlap := false
	for k := 0; k+1 < len(forkSpans) && k < len(restores); k++ {
		overlap = overlap || forkSpans[k+1].StartMs < restores[k].StartMs+restores[k].Ms
	}
	if len(forkSpans) != 4 || !overlap {
		t.Errorf("no fork started before the previous one's criu answered (%d fork spans): the slot was not given back at post-resume", len(forkSpans))
	}
	var parent string
	for _, f := range forks {
		c := testutil.MustGet(t, rt, f.ID)
		cg, err := cgroup.LoadOwned(c.Cgroup)
		if err != nil {
			t.Fatal(err)
		}
		if pids, err := cg.Procs(); err != nil || !slices.Contains(pids, c.Pid) {
			t.Errorf("fork %s: init %d not in its cgroup: %v %v", c.ID, c.Pid, pids, err)
		}
		// Where this process's forks' groups are: on v1 the memory hierarchy's is under
		// this process's own group, which other tests on the host do not share.
		p, ok := c.Cgroup["memory"]
		if !ok {
			p = c.Cgroup[slices.Sorted(maps.Keys(c.Cgroup))[0]]
		}
		parent = filepath.Dir(p)
	}
	groups := func() []string {
		es, _ := os.ReadDir(parent)
		var out []string
		for _, e := range es {
			if e.IsDir() {
				out = append(out, e.Name())
			}
		}
		sort.Strings(out)
		return out
	}

	before := groups()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := 0
	_, err = fork.Restore(cctx, rt, s, fork.RestoreOptions{N: 6, Parallel: 1, OnFork: func(stage.Fork) {
		if n++; n == 1 {
			cancel() // the next forks are made ready already
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted batch: %v", err)
	}
	if after := groups(); !slices.Equal(after, before) {
		t.Errorf("an interrupted batch left groups in %s:\n before %v\n after  %v", parent, before, after)
	}
}
