package snaptree_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/ksm"
	"github.com/lazyfork/lazyfork/lib/snaptree"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// mergeable counts the VMAs of node id's processes whose VmFlags carry mg.
func mergeable(t *testing.T, rt *container.Runtime, id string) int {
	t.Helper()
	cg, err := cgroup.LoadOwned(cgroup.Paths(testutil.MustGet(t, rt, id).Cgroup))
	if err != nil {
		t.Fatal(err)
	}
	pids, _ := cg.Procs()
	return ksm.MergeableVMAs(pids)
}

// A ksm tree: its root's keyframe and its forks map their memory mergeable, and with
// ksmd running the pages two forks wrote alike are merged and reported per node.
func TestKSMTree(t *testing.T) {
	if err := ksm.Available(); err != nil {
		t.Fatal(err)
	}
	rt := testutil.NewRuntime(t)
	m := &snaptree.Manager{RT: rt}
	tr, err := m.Create(ctx, snaptree.CreateOptions{KSM: true,
		Container: container.CreateOptions{Image: testutil.DefaultImage, Command: []string{"python3", "-c", prog}}})
	if err != nil {
		t.Fatalf("create a ksm tree: %v", err)
	}
	testutil.PruneAtEnd(t, m, tr)
	c := testutil.MustGet(t, rt, tr.Root)
	testutil.Eventually(t, 20*time.Second, "root program ready", func() bool {
		res, err := rt.Exec(ctx, c, container.ExecOptions{Args: []string{"test", "-f", "/tmp/ready"}, Timeout: 10 * time.Second})
		return err == nil && res.ExitCode == 0
	})
	if !tr.KSM || mergeable(t, rt, tr.Root) == 0 {
		t.Fatalf("ksm tree %v: the root maps nothing mergeable after its keyframe", tr.KSM)
	}
	forks, _, err := m.Fork(ctx, tr.ID, tr.Root, snaptree.ForkOptions{N: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		if mergeable(t, rt, f.ID) == 0 {
			t.Fatalf("fork %s maps nothing mergeable", f.ID)
		}
		dirty(t, rt, f.ID) // the same bytes in both: 2048 pages to merge
	}
	testutil.SetKnob(t, filepath.Join(ksm.SysDir, "pages_to_scan"), "1000")
	testutil.SetKnob(t, filepath.Join(ksm.SysDir, "run"), "1")
	var got map[string]int64
	testutil.Eventually(t, 90*time.Second, "merged pages reported for both forks", func() bool {
		tr, err := m.Get(ctx, tr.ID)
		if err != nil {
			t.Fatal(err)
		}
		got = map[string]int64{}
		for _, f := range forks {
			got[f.ID] = tr.Nodes[f.ID].KSMMergingPages
		}
		return got[forks[0].ID] > 0 && got[forks[1].ID] > 0
	})
	t.Logf("merged pages per fork: %v", got)
}
