package daemon

import (
	"slices"
	"strings"
	"testing"

	"github.com/lazyfork/lazyfork/lib/snaptree"
)

// diffShapes names every kind of mutation another process can make from the two
// documents alone, in an operation's order.
func TestDiffShapes(t *testing.T) {
	live, susp := snaptree.StateLive, snaptree.StateSuspended
	old := &treeShape{root: "r", budget: snaptree.DefaultBudget(), nodes: map[string]nodeShape{
		"r": {state: live, generation: 1},
		"a": {parent: "r", state: live},
		"b": {parent: "r", state: susp, protected: true},
		"c": {parent: "a", state: live},
		"d": {parent: "c", state: live},
	}}
	now := &treeShape{root: "r", budget: old.budget, nodes: map[string]nodeShape{
		"r":  {state: live, generation: 2},                // refreshed
		"a":  {parent: "r", state: susp, protected: true}, // suspended, protected
		"b":  {parent: "r", state: live},                  // resumed, unprotected
		"f1": {parent: "a", state: live},                  // a fork batch of a
		"f2": {parent: "a", state: live},
		"rb": {parent: "r", state: live, from: "s1"}, // a rollback branch of r
	}}
	now.budget.MaxLive = 3
	var got []string
	for _, e := range diffShapes("t1", old, now) {
		if e.Tree != "t1" {
			t.Fatalf("event of tree %q", e.Tree)
		}
		got = append(got, e.Kind+":"+e.Node+":"+strings.Join(e.Nodes, ","))
	}
	want := []string{"budget::", "prepare:r:", "rollback:r:rb", "fork:a:f1,f2", "suspend:a:", "protect:a:",
		"resume:b:", "unprotect:b:", "prune:c:c,d"}
	if !slices.Equal(got, want) {
		t.Fatalf("diff:\n got %v\nwant %v", got, want)
	}

	// A drop reports the nodes it suspended in its own event, not as suspends.
	dropped := &treeShape{root: "r", budget: old.budget, dropped: true, nodes: map[string]nodeShape{
		"r": {state: susp, generation: 1}, "a": {parent: "r", state: susp}, "b": old.nodes["b"], "c": {parent: "a", state: susp}, "d": {parent: "c", state: susp},
	}}
	got = nil
	for _, e := range diffShapes("t1", old, dropped) {
		got = append(got, e.Kind+":"+e.Node+":"+strings.Join(e.Nodes, ","))
	}
	if !slices.Equal(got, []string{"drop::a,c,d,r"}) {
		t.Fatalf("drop: %v", got)
	}
	// Nothing changed: nothing to say.
	if evs := diffShapes("t1", old, old); len(evs) != 0 {
		t.Fatalf("no change gave %+v", evs)
	}
	// The directory removed: the root's prune, naming every node.
	if e := removedEvent("t1", old); e.Kind != "prune" || e.Node != "r" || !slices.Equal(e.Nodes, []string{"a", "b", "c", "d", "r"}) {
		t.Fatalf("removed: %+v", e)
	}
}
