package budget

import (
	"fmt"
	"testing"
)

// benchTree is a tree of n nodes as a long search leaves it: every node with children is
// a keyframe (a fork dumps its source), each has up to 4 children, half the nodes are
// live and the live RAM sits at the budget, so a fork or PlanEvict must choose among
// thousands of candidates. Activity times are a fixed pseudo-random permutation.
func benchTree(n int) *Tree {
	const ram = 64 << 20
	live := (n + 1) / 2
	t, _ := New(Budget{MaxLive: n, MaxRAMBytes: int64(live) * ram, MaxDiskBytes: MaxBytes, MaxChainDepth: 1})
	x := uint64(88172645463325252)
	for i := 0; i < n; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		nd := &Node{ID: fmt.Sprintf("n%06d", i), State: Suspended, Keyframe: 4*i+1 < n,
			RAMBytes: ram, DiskBytes: ram / 4, SuspendBytes: ram / 8, LastActive: int64(x >> 1)}
		if i > 0 {
			nd.Parent = fmt.Sprintf("n%06d", (i-1)/4)
		}
		if i%2 == 0 {
			nd.State = Live
		}
		t.Nodes[nd.ID] = nd
	}
	return t
}

// Planning cost on large trees: bench/bench.py runs these (`make bench`) and reports
// them in bench/results/budget.csv; tests never assert on them.
func BenchmarkPlan(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		t := benchTree(n)
		if err := t.Check(); err != nil {
			b.Fatal(err)
		}
		leaf := fmt.Sprintf("n%06d", n-1) // suspended when n is even
		if t.Nodes[leaf].State != Suspended {
			leaf = fmt.Sprintf("n%06d", n-2)
		}
		for _, c := range []struct {
			op string
			f  func() (Plan, error)
		}{
			{"evict", func() (Plan, error) { return t.PlanEvict(), nil }},
			{"fork8", func() (Plan, error) { return t.PlanAdd("n000000", 8, 64<<20, 0) }},
			{"resume", func() (Plan, error) { return t.PlanResume(leaf, 64<<20) }},
		} {
			b.Run(fmt.Sprintf("op=%s/nodes=%d", c.op, n), func(b *testing.B) {
				var p Plan
				for b.Loop() {
					var err error
					if p, err = c.f(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(p.Suspend)), "suspended")
			})
		}
	}
}
