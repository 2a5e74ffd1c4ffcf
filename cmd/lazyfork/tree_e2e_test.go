package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/testutil"
)

// The snapshot tree through the porcelain: create, fork, nodes, the lineage view, a fork
// over budget (one line, nothing changed), suspend/resume with the count going on, the
// lf-tree stage's document, prune of the root, bad input.
func TestTreeCLI(t *testing.T) {
	e := newEnv(t)
	id := e.must("lazyfork tree create lazyfork/debian:bookworm --name t1 --max-live 3 --root-name r1 -- " + counter)
	t.Cleanup(func() {
		if out, _, _ := e.sh("lazyfork tree ls --json"); strings.Contains(out, id) {
			if _, errOut, code := e.sh("lazyfork tree prune t1 r1"); code != 0 {
				t.Errorf("cleanup prune: %s", errOut)
			}
		}
	})
	testutil.Eventually(t, 10*time.Second, "r1 to count", func() bool {
		out, _, _ := e.sh("lazyfork attach --no-follow r1")
		return testutil.LastInt(out) >= 2
	})
	var forks []struct {
		ID, Parent, State string
	}
	for _, l := range strings.Split(e.must("lazyfork tree fork t1 -n 2 --json"), "\n") {
		var f struct{ ID, Parent, State string }
		if err := json.Unmarshal([]byte(l), &f); err != nil {
			t.Fatalf("fork line %q: %v", l, err)
		}
		forks = append(forks, f)
	}
	if len(forks) != 2 {
		t.Fatalf("forks: %+v", forks)
	}
	var doc struct {
		Kind  string
		Root  string
		Usage struct{ Live int }
		Nodes map[string]struct {
			State    string
			Children []string
		}
	}
	if err := json.Unmarshal([]byte(e.must("lazyfork tree nodes t1 --json")), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Kind != "lazyfork.tree" || doc.Usage.Live != 3 || len(doc.Nodes[doc.Root].Children) != 2 {
		t.Fatalf("tree document: %+v", doc)
	}
	// The lineage view is still `lazyfork tree`.
	if out := e.must("lazyfork tree"); !strings.Contains(out, forks[0].ID) || !strings.Contains(out, "r1") {
		t.Fatalf("lineage view: %s", out)
	}
	e.must("lazyfork tree --json")

	// Over max_live even after eviction: one line naming the budget, nothing changed.
	_, errOut, code := e.sh("lazyfork tree fork t1 -n 5")
	if code != 1 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "max_live") {
		t.Fatalf("fork over budget: exit %d: %q", code, errOut)
	}
	if n := strings.Count(e.must("lazyfork tree nodes t1"), "\n"); n != 3 {
		t.Fatalf("a refused fork changed the tree: %d rows", n)
	}

	// Suspend and resume a fork: it comes back counting where it stopped.
	f := forks[0].ID
	e.must("lazyfork tree suspend t1 " + f)
	at := testutil.LastInt(e.must("lazyfork attach --no-follow " + f))
	if !strings.Contains(e.must("lazyfork tree nodes t1 | grep "+f), "suspended") {
		t.Fatal("not shown suspended")
	}
	e.must("lazyfork tree resume t1 " + f)
	testutil.Eventually(t, 10*time.Second, "the resumed fork to count on", func() bool {
		out, _, _ := e.sh("lazyfork attach --no-follow " + f)
		return testutil.LastInt(out) > at+2
	})
	out := e.must("lazyfork attach --no-follow " + f)
	for i, l := range strings.Fields(out) {
		if l != itoa(i) {
			t.Fatalf("the resumed fork's count has a gap or restart at line %d: %s", i, l)
		}
	}

	// The stage prints the tree document.
	var st struct{ Kind, ID string }
	if err := json.Unmarshal([]byte(e.must("lf-tree tree t1")), &st); err != nil || st.Kind != "lazyfork.tree" || st.ID != id {
		t.Fatalf("lf-tree tree: %+v %v", st, err)
	}

	// Bad input: one line, the exit status of its kind.
	for cmd, want := range map[string]int{
		"lazyfork tree nodes nosuch":                                        3,
		"lazyfork tree fork t1 nosuch":                                      3,
		"lazyfork tree create lazyfork/debian:bookworm --max-ram 0 -- true": 2,
		"lazyfork tree fork t1 -n 0":                                        2,
	} {
		_, errOut, code := e.sh(cmd)
		if code != want || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%s: exit %d (want %d): %q", cmd, code, want, errOut)
		}
	}

	// Prune the root: every node goes, and the tree.
	if got := strings.Fields(e.must("lazyfork tree prune t1 r1")); len(got) != 3 {
		t.Fatalf("prune printed %v", got)
	}
	if out := e.must("lazyfork tree ls --json"); out != "[]" {
		t.Fatalf("trees left: %s", out)
	}
	if out := e.must("lazyfork list -q"); out != "" {
		t.Fatalf("containers left: %s", out)
	}
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}
