package snaptree_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/budget"
	"github.com/lazyfork/lazyfork/lib/snaptree"
)

// Lowering a budget below what the tree uses suspends the least-recently-active
// unprotected live nodes until it fits, and says so; a budget the protected nodes alone
// exceed is refused with one line naming them, and nothing changes.
func TestLowerBudgetEvicts(t *testing.T) {
	rt, m, tr := newTree(t, nil)
	var evs []snaptree.Event
	m.OnEvent = func(e snaptree.Event) { evs = append(evs, e) }
	forks, tr, err := m.Fork(ctx, tr.ID, tr.Root, snaptree.ForkOptions{N: 2})
	if err != nil {
		t.Fatal(err)
	}
	a, b := forks[0].ID, forks[1].ID
	if _, _, err := m.Protect(ctx, tr.ID, tr.Root, true); err != nil {
		t.Fatal(err)
	}
	// a works, then b: a is the least recently active unprotected node.
	query(t, rt, a)
	if _, err = m.Get(ctx, tr.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	query(t, rt, b)
	if tr, err = m.Get(ctx, tr.ID); err != nil {
		t.Fatal(err)
	}
	if !nodeOf(t, tr, a).LastActive.Before(nodeOf(t, tr, b).LastActive) {
		t.Fatalf("last active a %v, b %v: want a first", nodeOf(t, tr, a).LastActive, nodeOf(t, tr, b).LastActive)
	}
	states := func(tr *snaptree.Tree) []string {
		return []string{nodeOf(t, tr, tr.Root).State, nodeOf(t, tr, a).State, nodeOf(t, tr, b).State}
	}
	live3 := []string{snaptree.StateLive, snaptree.StateLive, snaptree.StateLive}

	// max_live 1 with the root and b protected: eviction can take a only, 2 stay live.
	if _, _, err := m.Protect(ctx, tr.ID, b, true); err != nil {
		t.Fatal(err)
	}
	low := tr.Budget
	low.MaxLive = 1
	evs = nil
	_, err = m.SetBudget(ctx, tr.ID, low)
	var ce *budget.ChangeError
	if !errors.As(err, &ce) || !errors.Is(err, budget.ErrOverBudget) || ce.Budget != "max_live" {
		t.Fatalf("max_live 1 with two protected live nodes: %v, want a ChangeError on max_live", err)
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, tr.Root) || !strings.Contains(msg, b) || strings.Contains(msg, a) {
		t.Fatalf("refusal %q: want one line naming the protected %s and %s, not %s", msg, tr.Root, b, a)
	}
	t.Logf("refused: %v", err)
	if tr, err = m.Get(ctx, tr.ID); err != nil {
		t.Fatal(err)
	}
	if got := states(tr); !slices.Equal(got, live3) || tr.Budget.MaxLive != snaptree.DefaultBudget().MaxLive {
		t.Fatalf("a refused budget changed the tree: states %v, max_live %d", got, tr.Budget.MaxLive)
	}
	for _, e := range evs {
		if e.Kind == "evict" || e.Kind == "budget" {
			t.Fatalf("a refused budget emitted %+v", e)
		}
	}

	// max_live 2 with b protected: a (the only unprotected live node) is evicted.
	if _, _, err := m.Protect(ctx, tr.ID, b, false); err != nil {
		t.Fatal(err)
	}
	low.MaxLive = 2
	evs = nil
	if tr, err = m.SetBudget(ctx, tr.ID, low); err != nil {
		t.Fatalf("max_live 2: %v", err)
	}
	want := []string{snaptree.StateLive, snaptree.StateSuspended, snaptree.StateLive}
	if got := states(tr); !slices.Equal(got, want) || tr.Usage.Live != 2 || tr.Budget.MaxLive != 2 {
		t.Fatalf("after max_live 2: states %v (want %v), live %d, max_live %d", got, want, tr.Usage.Live, tr.Budget.MaxLive)
	}
	var evicted []string
	for _, e := range evs {
		if e.Kind == "evict" {
			evicted = append(evicted, e.Nodes...)
		}
	}
	if !slices.Equal(evicted, []string{a}) {
		t.Fatalf("evict events name %v, want [%s] (events %+v)", evicted, a, evs)
	}

	// A RAM budget below the protected root's own charge: b can go, the root cannot.
	low.MaxRAMBytes = 1 << 20
	_, err = m.SetBudget(ctx, tr.ID, low)
	if !errors.As(err, &ce) || ce.Budget != "max_ram_bytes" || !strings.Contains(err.Error(), tr.Root) {
		t.Fatalf("max_ram 1 MiB under a protected root: %v, want a ChangeError on max_ram_bytes naming the root", err)
	}
	if tr, err = m.Get(ctx, tr.ID); err != nil {
		t.Fatal(err)
	}
	if got := states(tr); !slices.Equal(got, want) || tr.Budget.MaxRAMBytes == low.MaxRAMBytes {
		t.Fatalf("a refused RAM budget changed the tree: states %v, max_ram %d", got, tr.Budget.MaxRAMBytes)
	}
}
