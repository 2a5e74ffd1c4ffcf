package fork_test

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/snaptree"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// A SIGKILL of `lazyfork --local tree fork` in the middle of the swap of a tree member
// (its first fork writes its keyframe, moving it onto its snapshot) leaves one source
// running in the tree's cgroup, and `lazyfork gc` finds what the killed command left
// there (the member's groups are inside the tree's cgroup, not under the default parent).
func TestKilledTreeForkMidSwap(t *testing.T) {
	rt := testutil.NewRuntime(t)
	bin := lazyforkBin(t)
	m := &snaptree.Manager{RT: rt}
	tr, err := m.Create(ctx, snaptree.CreateOptions{Container: container.CreateOptions{Image: testutil.DefaultImage, Command: []string{"python3", "-c", counterPy}}})
	if err != nil {
		t.Fatalf("create tree: %v", err)
	}
	testutil.PruneAtEnd(t, m, tr)
	treeCg, err := cgroup.LoadOwned(tr.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	members := cgroup.ParentFor(treeCg)
	// member forks the root into a new counting member; killFork runs `tree fork` of it
	// and kills the command at p (false: the fork ended first).
	member := func(t *testing.T) *store.Container {
		t.Helper()
		nodes, _, err := m.Fork(ctx, tr.ID, tr.Root, snaptree.ForkOptions{N: 1})
		if err != nil {
			t.Fatal(err)
		}
		src, err := rt.Containers.Get(nodes[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src) >= 2 })
		return src
	}
	killFork := func(t *testing.T, src *store.Container, p killPoint) bool {
		t.Helper()
		cmd := exec.Command(bin, "tree", "fork", tr.ID, src.ID)
		cmd.Env = append(os.Environ(), "LAZYFORK_LOCAL=1")
		return killMidSwap(t, rt, src, p, cmd, func() *os.Process { return cmd.Process })
	}
	seen := 0
	// Not "forking": a tree holds other containers from the start.
	for _, p := range swapKillPoints[:5] {
		t.Run(p.name, func(t *testing.T) {
			src := member(t)
			if got := cgroup.ParentOf(src.Cgroup); got != members {
				t.Fatalf("member %s's group is under %s, not the tree's %s", src.ID, got, members)
			}
			if killFork(t, src, p) {
				seen++
				checkOneSource(t, rt, bin, src, nil)
			}
			// (A fork that ended first keeps its swap snapshot: it is the member's keyframe.)
			if cur, err := rt.Containers.Get(src.ID); err != nil || cgroup.ParentOf(cur.Cgroup) != members {
				t.Fatalf("after gc the source's group is not in the tree's cgroup: %v %v", cur, err)
			}
			// The member and whatever the killed command forked go; the tree stays.
			if _, _, err := m.Prune(ctx, tr.ID, src.ID); err != nil {
				t.Fatal(err)
			}
			all, _ := rt.Containers.List()
			for _, c := range all {
				if c.ID != tr.Root {
					if err := rt.Delete(c); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := fork.GC(rt); err != nil {
				t.Fatal(err)
			}
			if g := groupsOf(t, rt, src); len(g) != 0 {
				t.Errorf("groups of the pruned member left in the tree's cgroup: %v", g)
			}
		})
	}
	if seen < 3 {
		t.Errorf("only %d of 5 kill points were caught before the fork ended", seen)
	}

	// Killed while the new source restores, then pruned before any gc: the prune's gc
	// finds the new source's group in the tree's cgroup though no record names it.
	t.Run("restoring, pruned", func(t *testing.T) {
		src := member(t)
		if !killFork(t, src, swapKillPoints[3]) {
			t.Skip("the fork ended before its restore was seen") // counted by the loop above
		}
		if _, _, err := m.Prune(ctx, tr.ID, src.ID); err != nil {
			t.Fatalf("prune after the kill: %v", err)
		}
		if g := groupsOf(t, rt, src); len(g) != 0 {
			t.Errorf("groups of the pruned member left in the tree's cgroup: %v", g)
		}
		if s := swapSnapshot(src); s != nil {
			t.Errorf("the swap snapshot %s is left", s.ID)
		}
	})
}
