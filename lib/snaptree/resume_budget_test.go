package snaptree_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/lazyfork/lazyfork/lib/budget"
	"github.com/lazyfork/lazyfork/lib/snaptree"
)

// A suspended node keeps the RAM it had at suspend, and a resume is checked against the
// RAM budget with it: with nothing evictable (the root protected) and too little room,
// the resume fails naming max_ram_bytes and the node stays suspended.
func TestResumeChecksRAMBudget(t *testing.T) {
	rt, m, tr := newTree(t, nil)
	if _, _, err := m.Protect(ctx, tr.ID, tr.Root, true); err != nil {
		t.Fatal(err)
	}
	forks, _, err := m.Fork(ctx, tr.ID, tr.Root, snaptree.ForkOptions{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	a := forks[0].ID
	dirty(t, rt, a) // 8 MiB of its own
	n, tr, err := m.Suspend(ctx, tr.ID, a)
	if err != nil {
		t.Fatal(err)
	}
	if tr, err = m.Get(ctx, tr.ID); err != nil {
		t.Fatal(err)
	}
	need := nodeOf(t, tr, a).RAMBytes
	if n.State != snaptree.StateSuspended || need < 4<<20 {
		t.Fatalf("suspended node %s: state %s, RAM at suspend %d (want its 8 MiB kept)", a, n.State, need)
	}
	// Room for what is live now plus half of the node.
	b := tr.Budget
	b.MaxRAMBytes = liveRAM(tr) + need/2
	if _, err := m.SetBudget(ctx, tr.ID, b); err != nil {
		t.Fatal(err)
	}
	_, tr, err = m.Resume(ctx, tr.ID, a)
	var ob *budget.OverBudgetError
	if !errors.As(err, &ob) || ob.Budget != "max_ram_bytes" || !strings.Contains(err.Error(), "max_ram_bytes") {
		t.Fatalf("resume past the RAM budget: %v, want an OverBudgetError on max_ram_bytes", err)
	}
	if tr, err = m.Get(ctx, tr.ID); err != nil || nodeOf(t, tr, a).State != snaptree.StateSuspended {
		t.Fatalf("after the refused resume: %v", err)
	}
	// With room again it resumes.
	b.MaxRAMBytes = snaptree.DefaultBudget().MaxRAMBytes
	if _, err := m.SetBudget(ctx, tr.ID, b); err != nil {
		t.Fatal(err)
	}
	if n, _, err = m.Resume(ctx, tr.ID, a); err != nil || n.State != snaptree.StateLive {
		t.Fatalf("resume within budget: %v", err)
	}
}
