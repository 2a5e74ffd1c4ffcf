package budget

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

const mib = 1 << 20

// tree builds root "r" (a keyframe) with live children a, b, c active at 1, 2, 3.
func tree(t *testing.T, b Budget) *Tree {
	t.Helper()
	tr, err := New(b)
	if err != nil {
		t.Fatal(err)
	}
	must(t, tr.ApplyAdd("", Node{ID: "r", RAMBytes: 100 * mib, LastActive: 0}))
	must(t, tr.ApplyKeyframe("r", 100*mib, 0))
	for i, id := range []string{"a", "b", "c"} {
		must(t, tr.ApplyAdd("r", Node{ID: id, RAMBytes: 100 * mib, SuspendBytes: 10 * mib, LastActive: int64(i + 1)}))
	}
	return tr
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestDefaultValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, b := range []Budget{{}, {MaxLive: 1, MaxRAMBytes: 1, MaxDiskBytes: 1, MaxChainDepth: -1}, {MaxLive: 1, MaxRAMBytes: MaxBytes + 1, MaxDiskBytes: 1}} {
		if err := b.Validate(); err == nil {
			t.Errorf("Validate(%+v) passed", b)
		}
	}
}

// The fork needs 100 MiB more in a 400 MiB budget holding 400: the least recently active
// unprotected node goes first, and the root counts as a candidate like any other.
func TestPlanAddSuspendsLRU(t *testing.T) {
	tr := tree(t, Budget{MaxLive: 10, MaxRAMBytes: 400 * mib, MaxDiskBytes: 1 << 30, MaxChainDepth: 1})
	p, err := tr.PlanAdd("c", 1, 100*mib, 0)
	must(t, err)
	if !reflect.DeepEqual(p.Suspend, []string{"r"}) {
		t.Fatalf("plan %v, want the root (least recently active) first", p.Suspend)
	}
	must(t, tr.SetProtected("r", true))
	must(t, tr.SetProtected("a", true))
	p, err = tr.PlanAdd("c", 1, 100*mib, 0)
	must(t, err)
	if !reflect.DeepEqual(p.Suspend, []string{"b"}) {
		t.Fatalf("plan %v, want [b]: r and a are protected and c is the parent", p.Suspend)
	}
	if p.After != (Usage{Live: 4, RAMBytes: 400 * mib, DiskBytes: 110 * mib}) {
		t.Fatalf("after %+v", p.After)
	}
}

func TestTiesBreakByID(t *testing.T) {
	tr := tree(t, Budget{MaxLive: 4, MaxRAMBytes: 1 << 30, MaxDiskBytes: 1 << 30, MaxChainDepth: 1})
	for _, id := range []string{"a", "b", "c", "r"} {
		must(t, tr.Touch(id, 7))
	}
	p, err := tr.PlanAdd("r", 2, 0, 0)
	must(t, err)
	if !reflect.DeepEqual(p.Suspend, []string{"a", "b"}) {
		t.Fatalf("plan %v, want [a b]", p.Suspend)
	}
}

func TestOverBudgetMessage(t *testing.T) {
	tr := tree(t, Budget{MaxLive: 10, MaxRAMBytes: 400 * mib, MaxDiskBytes: 1 << 30, MaxChainDepth: 1})
	for _, id := range []string{"r", "a", "b"} {
		must(t, tr.SetProtected(id, true))
	}
	before := tr.Clone()
	_, err := tr.PlanAdd("c", 2, 100*mib, 0)
	var ob *OverBudgetError
	if !errors.As(err, &ob) || !errors.Is(err, ErrOverBudget) || ob.Budget != "max_ram_bytes" || ob.Need != 200*mib || ob.Have != 400*mib || ob.Limit != 400*mib {
		t.Fatalf("err %#v", err)
	}
	msg := err.Error()
	for _, want := range []string{"fork", `"c"`, "200 MiB", "400 MiB stays", "max_ram_bytes 400 MiB", "raise max_ram_bytes"} {
		if !strings.Contains(msg, want) || strings.Contains(msg, "\n") {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if !reflect.DeepEqual(before, tr) {
		t.Fatal("a refused plan changed the tree")
	}
}

// A suspension writes its delta: a plan whose suspensions overflow the disk budget is
// refused even though RAM would fit.
func TestSuspensionsChargeDisk(t *testing.T) {
	tr := tree(t, Budget{MaxLive: 10, MaxRAMBytes: 400 * mib, MaxDiskBytes: 105 * mib, MaxChainDepth: 1})
	must(t, tr.Measure("r", Measurement{RAMBytes: Keep, SharedRAMBytes: Keep, DiskBytes: Keep, SuspendBytes: 10 * mib}))
	_, err := tr.PlanAdd("c", 1, 100*mib, 0)
	var ob *OverBudgetError
	if !errors.As(err, &ob) || ob.Budget != "max_disk_bytes" {
		t.Fatalf("err %v, want max_disk_bytes", err)
	}
	// With no delta to write (SuspendBytes 0), the root's suspension fits.
	must(t, tr.Measure("r", Measurement{RAMBytes: Keep, SharedRAMBytes: Keep, DiskBytes: Keep, SuspendBytes: 0}))
	p, err := tr.PlanAdd("c", 1, 100*mib, 0)
	must(t, err)
	if !reflect.DeepEqual(p.Suspend, []string{"r"}) {
		t.Fatalf("plan %v", p.Suspend)
	}
}

func TestResumeChainDepth(t *testing.T) {
	tr := tree(t, Budget{MaxLive: 10, MaxRAMBytes: 1 << 30, MaxDiskBytes: 1 << 30, MaxChainDepth: 1})
	must(t, tr.ApplyAdd("a", Node{ID: "a1", RAMBytes: mib, LastActive: 9})) // a is not a keyframe
	if d := tr.ChainDepth("a1"); d != 2 {
		t.Fatalf("chain depth of a1 %d, want 2", d)
	}
	if ev := tr.Evictable(); strings.Contains(strings.Join(ev, ","), "a1") {
		t.Fatalf("evictable %v includes a1, which could not be resumed", ev)
	}
	must(t, tr.ApplySuspend("a1", mib)) // an explicit suspend still works
	_, err := tr.PlanResume("a1", mib)
	var ob *OverBudgetError
	if !errors.As(err, &ob) || ob.Budget != "max_chain_depth" || ob.Need != 2 || ob.Limit != 1 {
		t.Fatalf("PlanResume: %v", err)
	}
	if tr.ApplyResume("a1", mib, 10) == nil {
		t.Fatal("ApplyResume passed the chain bound")
	}
	must(t, tr.ApplyKeyframe("a", 5*mib, 0))
	if _, err := tr.PlanResume("a1", mib); err != nil {
		t.Fatalf("after keyframing a: %v", err)
	}
	must(t, tr.ApplyResume("a1", mib, 10))
}

func TestPlanEvict85(t *testing.T) {
	tr := tree(t, Budget{MaxLive: 10, MaxRAMBytes: 400 * mib, MaxDiskBytes: 1 << 30, MaxChainDepth: 1})
	// 400 MiB of 400: down to below 340 MiB takes one 100 MiB node.
	p := tr.PlanEvict()
	if !reflect.DeepEqual(p.Suspend, []string{"r"}) || p.After.RAMBytes != 300*mib {
		t.Fatalf("plan %+v", p)
	}
	must(t, tr.Measure("r", Measurement{RAMBytes: 39 * mib, SharedRAMBytes: Keep, DiskBytes: Keep, SuspendBytes: Keep}))
	if p := tr.PlanEvict(); len(p.Suspend) != 0 {
		t.Fatalf("339 MiB of 400 (below 85%%) evicts %v", p.Suspend)
	}
	must(t, tr.Measure("r", Measurement{RAMBytes: 40 * mib, SharedRAMBytes: Keep, DiskBytes: Keep, SuspendBytes: Keep}))
	if p := tr.PlanEvict(); !reflect.DeepEqual(p.Suspend, []string{"r"}) {
		t.Fatalf("exactly 85%% evicts %v, want [r]", p.Suspend)
	}
	if got := (Budget{MaxRAMBytes: 1}).EvictThreshold(); got != 1 {
		t.Fatalf("threshold of 1 byte %d, want 1 (0 bytes is below 85%%)", got)
	}
}

// Shared tmpfs memory files stay charged when their node is suspended.
func TestSharedRAMNotFreedByEviction(t *testing.T) {
	tr := tree(t, Budget{MaxLive: 10, MaxRAMBytes: 500 * mib, MaxDiskBytes: 1 << 30, MaxChainDepth: 1})
	must(t, tr.ApplyKeyframe("r", 0, 100*mib))
	must(t, tr.ApplySuspend("r", 0))
	if u := tr.Usage(); u.RAMBytes != 400*mib || u.Live != 3 {
		t.Fatalf("usage %+v, want 400 MiB (3 live + r's files) and 3 live", u)
	}
}

func TestPrune(t *testing.T) {
	tr := tree(t, Default())
	must(t, tr.ApplyAdd("a", Node{ID: "a1"}, Node{ID: "a2"}))
	must(t, tr.ApplyAdd("a1", Node{ID: "a11"}))
	if got := tr.Subtree("a"); !reflect.DeepEqual(got, []string{"a11", "a1", "a2", "a"}) {
		t.Fatalf("subtree %v", got)
	}
	got, err := tr.ApplyPrune("a")
	must(t, err)
	if len(got) != 4 || len(tr.Nodes) != 3 || tr.Check() != nil {
		t.Fatalf("pruned %v, left %d", got, len(tr.Nodes))
	}
	if _, err := tr.ApplyPrune("a"); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("second prune: %v", err)
	}
}

func TestApplyRefusals(t *testing.T) {
	tr := tree(t, Budget{MaxLive: 4, MaxRAMBytes: 1 << 30, MaxDiskBytes: 1 << 30, MaxChainDepth: 1})
	before := tr.Clone()
	for name, err := range map[string]error{
		"second root":       tr.ApplyAdd("", Node{ID: "x"}),
		"duplicate":         tr.ApplyAdd("r", Node{ID: "a"}),
		"duplicate batch":   tr.ApplyAdd("r", Node{ID: "x"}, Node{ID: "x"}),
		"over live":         tr.ApplyAdd("r", Node{ID: "x"}),
		"unknown parent":    tr.ApplyAdd("zz", Node{ID: "x"}),
		"negative":          tr.ApplyAdd("r", Node{ID: "x", RAMBytes: -1}),
		"resume live":       tr.ApplyResume("a", 0, 0),
		"suspend unknown":   tr.ApplySuspend("zz", 0),
		"disk over":         tr.ApplyKeyframe("a", 1<<30, 0),
		"empty id":          tr.ApplyAdd("r", Node{}),
		"zero-node batch":   tr.ApplyAdd("r"),
		"measure negative?": tr.Measure("a", Measurement{RAMBytes: MaxBytes + 1, SharedRAMBytes: Keep, DiskBytes: Keep, SuspendBytes: Keep}),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: multi-line error %q", name, err)
		}
	}
	if !reflect.DeepEqual(before, tr) {
		t.Fatal("refused operations changed the tree")
	}
}

// A tree read from a file is hostile: Check refuses the malformed ones, and planning on
// any tree Check accepts must not panic.
func FuzzCheck(f *testing.F) {
	good, _ := json.Marshal(func() *Tree {
		tr, _ := New(Default())
		_ = tr.ApplyAdd("", Node{ID: "r", RAMBytes: 5})
		_ = tr.ApplyKeyframe("r", 5, 5)
		_ = tr.ApplyAdd("r", Node{ID: "a", RAMBytes: 5}, Node{ID: "b"})
		return tr
	}())
	f.Add(good)
	f.Add([]byte(`{"budget":{"max_live":1,"max_ram_bytes":1,"max_disk_bytes":1,"max_chain_depth":0},"nodes":{"a":{"id":"a","parent":"b","state":"live"},"b":{"id":"b","parent":"a","state":"live"}}}`))
	f.Add([]byte(`{"budget":{"max_live":1,"max_ram_bytes":1,"max_disk_bytes":1},"nodes":{"a":{"id":"b","state":"live"}}}`))
	f.Add([]byte(`{"budget":{"max_live":3,"max_ram_bytes":9,"max_disk_bytes":9},"nodes":{"a":{"id":"a","state":"gone"},"b":null}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var tr Tree
		if json.Unmarshal(data, &tr) != nil || tr.Check() != nil {
			return
		}
		ids := tr.ids()
		for _, id := range append(ids, "", "missing") {
			before := tr.Clone()
			_, _ = tr.PlanAdd(id, 2, 1, 1)
			_, _ = tr.PlanResume(id, 1)
			_, _ = tr.PlanKeyframeShared(id, 1, 1)
			_ = tr.PlanEvict()
			_ = tr.ChainDepth(id)
			_ = tr.Subtree(id)
			if !reflect.DeepEqual(before, &tr) {
				t.Fatalf("a plan on %q changed the tree", id)
			}
		}
	})
}

// Lowering max_live below the live count suspends the least recently active unprotected
// nodes; a bound the protected nodes alone exceed is refused, naming them.
func TestPlanBudgetLowersLive(t *testing.T) {
	tr := tree(t, Budget{MaxLive: 10, MaxRAMBytes: 1 << 30, MaxDiskBytes: 1 << 30, MaxChainDepth: 1})
	must(t, tr.SetProtected("r", true))
	nb := tr.Budget
	nb.MaxLive = 2
	p, err := tr.PlanBudget(nb)
	must(t, err)
	if !reflect.DeepEqual(p.Suspend, []string{"a", "b"}) || p.After.Live != 2 {
		t.Fatalf("plan %+v, want a and b suspended (r is protected), 2 live", p)
	}
	old := tr.Budget
	tr.Budget = nb
	for _, id := range p.Suspend {
		must(t, tr.ApplySuspend(id, tr.Nodes[id].SuspendBytes))
	}
	tr.Budget = old
	must(t, tr.ApplyBudget(nb))
	must(t, tr.SetProtected("c", true))
	nb.MaxLive = 1
	_, err = tr.PlanBudget(nb)
	var ce *ChangeError
	if !errors.As(err, &ce) || !errors.Is(err, ErrOverBudget) || ce.Budget != "max_live" || !reflect.DeepEqual(ce.Protected, []string{"c", "r"}) {
		t.Fatalf("max_live 1 with r and c protected: %v (%+v)", err, ce)
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "protected c, r") {
		t.Fatalf("message %q", msg)
	}
	if tr.ApplyBudget(nb) == nil || tr.Budget.MaxLive != 2 {
		t.Fatalf("ApplyBudget took a budget the tree is over: %+v", tr.Budget)
	}
	// RAM: 200 MiB live on two protected nodes cannot fit 150 MiB.
	nb.MaxLive, nb.MaxRAMBytes = 10, 150*mib
	if _, err = tr.PlanBudget(nb); !errors.As(err, &ce) || ce.Budget != "max_ram_bytes" || ce.Have != 200*mib {
		t.Fatalf("max_ram 150 MiB: %v", err)
	}
	// Memory files on tmpfs alone over the bound: no node to name, the files are.
	must(t, tr.SetProtected("r", false))
	must(t, tr.SetProtected("c", false))
	must(t, tr.Measure("r", Measurement{RAMBytes: Keep, SharedRAMBytes: 300 * mib, DiskBytes: Keep, SuspendBytes: Keep}))
	if _, err = tr.PlanBudget(nb); !errors.As(err, &ce) || ce.Budget != "max_ram_bytes" || len(ce.Protected)+len(ce.Stuck) != 0 || !strings.Contains(err.Error(), "memory files") {
		t.Fatalf("max_ram 150 MiB under 300 MiB of memory files: %v", err)
	}
	// Disk: only prune frees it.
	nb.MaxRAMBytes, nb.MaxDiskBytes = 1<<30, 1
	if _, err = tr.PlanBudget(nb); !errors.As(err, &ce) || ce.Budget != "max_disk_bytes" {
		t.Fatalf("max_disk 1: %v", err)
	}
}
