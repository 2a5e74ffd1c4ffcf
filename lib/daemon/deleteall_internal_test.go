package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/guard"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// Deleting several containers freezes the running ones first; one whose delete then
// fails (its lock taken meanwhile, until the caller gives up) is thawed again, and one
// busy from the start is neither frozen nor waited for before its own turn.
func TestDeleteAllFreezesFirstAndThawsARefusedOne(t *testing.T) {
	rt := testutil.NewRuntime(t)
	s := NewService(rt)
	t.Cleanup(s.Close)
	for _, name := range []string{"alpha", "bravo", "charlie"} {
		if _, err := s.Create(context.Background(), client.CreateRequest{Image: testutil.DefaultImage, Name: name, Command: []string{"sleep", "1000"}}, nil); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	// Names, not letters: "a" would also be a unique prefix of some id.
	state := func(ref string) string {
		c, err := rt.Containers.Resolve(ref)
		if err != nil {
			return "gone"
		}
		return rt.State(c)
	}
	_, unlockB, err := guard.Lock(context.Background(), rt.Containers, "bravo", 0) // busy throughout
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	seen := map[string]string{}
	afterFreezeAll = func() {
		for _, ref := range []string{"alpha", "bravo", "charlie"} {
			seen[ref] = state(ref)
		}
		// charlie's delete, the first, waits for its lock until ctx ends; the lock comes back
		// while the thaw waits for it.
		_, unlockC, err := guard.Lock(context.Background(), rt.Containers, "charlie", 0)
		if err != nil {
			t.Error(err)
			return
		}
		go func() { <-ctx.Done(); time.Sleep(100 * time.Millisecond); unlockC() }()
	}
	t.Cleanup(func() { afterFreezeAll = nil })
	start := time.Now()
	errs := map[string]error{}
	if err := s.DeleteAll(ctx, []string{"charlie", "bravo", "alpha"}, func(ref string, err error) { errs[ref] = err }); err != nil {
		t.Fatal(err)
	}
	unlockB()
	if seen["alpha"] != store.StateFrozen || seen["charlie"] != store.StateFrozen || seen["bravo"] != store.StateRunning {
		t.Errorf("states before the deletes: %v, want a and c frozen, b running (busy: not frozen)", seen)
	}
	if errs["alpha"] != nil || errs["bravo"] == nil || errs["charlie"] == nil || strings.Contains(errs["charlie"].Error(), "thaw") {
		t.Errorf("delete results %v: want a deleted, b and c refused, c thawed", errs)
	}
	for ref, want := range map[string]string{"alpha": "gone", "bravo": store.StateRunning, "charlie": store.StateRunning} {
		if got := state(ref); got != want {
			t.Errorf("%s after the deletes: %s, want %s", ref, got, want)
		}
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("DeleteAll took %v: it waited for a busy container's lock past its context", d)
	}
	afterFreezeAll = nil
	if err := s.DeleteAll(context.Background(), []string{"bravo", "charlie"}, func(ref string, err error) {
		if err != nil {
			t.Errorf("delete %s: %v", ref, err)
		}
	}); err != nil {
		t.Fatal(err)
	}
}
