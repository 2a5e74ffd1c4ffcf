package fork_test

import (
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// The copy of the upper layer runs while the source is frozen: past its deadline the
// dump fails, the source runs on, and no snapshot is left.
func TestLayerCopyDeadline(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src := create(t, rt, "src", "python3", "-c", counterPy)
	testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src) >= 1 })
	before := leftovers(t, rt.Containers)
	old := fork.LayerCopyTimeout
	fork.LayerCopyTimeout = time.Nanosecond
	t.Cleanup(func() { fork.LayerCopyTimeout = old })
	_, err := fork.Dump(ctx, rt, src, fork.DumpOptions{})
	if err == nil || !strings.Contains(err.Error(), "did not finish within") {
		t.Fatalf("dump with a layer copy past its deadline: %v", err)
	}
	if st := rt.State(src); st != store.StateRunning {
		t.Errorf("source is %s after the failed dump", st)
	}
	a := lastInt(src)
	testutil.Eventually(t, 10*time.Second, "the source to count on", func() bool { return lastInt(src) > a })
	if after := leftovers(t, rt.Containers); after != before {
		t.Errorf("the failed dump left things behind:\n before %s\n after  %s", before, after)
	}
}

// A set-up helper that does not exec the command within InitTimeout is killed and the
// create fails, leaving no record.
func TestInitDeadline(t *testing.T) {
	rt := testutil.NewRuntime(t)
	old := container.InitTimeout
	container.InitTimeout = time.Nanosecond
	t.Cleanup(func() { container.InitTimeout = old })
	_, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "slow", Command: []string{"true"}})
	if err == nil || !strings.Contains(err.Error(), "timeout") && !strings.Contains(err.Error(), "within") {
		t.Fatalf("create past the init deadline: %v", err)
	}
	if all, _ := rt.Containers.List(); len(all) != 0 {
		t.Errorf("%d records after a failed create", len(all))
	}
}
