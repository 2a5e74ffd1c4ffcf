package budget

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// source draws the machine's choices: rapid in the property test, the fuzzer's bytes in
// the fuzz test.
type source interface {
	// intn returns a value in [lo, hi].
	intn(label string, lo, hi int) int
}

// machine drives a Tree through random operations the way a caller must (plan, apply the
// suspensions, apply the operation) and checks the package's invariants after each.
type machine struct {
	t      *Tree
	src    source
	fatalf func(format string, args ...any)
	clock  int64
	next   int
	// overBy is set once a Measure pushed the tree over budget: from then on only the
	// weak form of the budget invariant holds (no op grows an over-budget dimension).
	overBy bool
}

func newMachine(src source, fatalf func(string, ...any)) *machine {
	b := Budget{
		MaxLive:       src.intn("max_live", 1, 8),
		MaxRAMBytes:   int64(src.intn("max_ram", 1, 1000)),
		MaxDiskBytes:  int64(src.intn("max_disk", 1, 2000)),
		MaxChainDepth: src.intn("max_chain", 0, 3),
	}
	if src.intn("huge_budget", 0, 4) == 0 {
		b.MaxRAMBytes, b.MaxDiskBytes = MaxBytes, MaxBytes
	}
	t, err := New(b)
	if err != nil {
		fatalf("New(%+v): %v", b, err)
	}
	return &machine{t: t, src: src, fatalf: fatalf}
}

// size is a node charge: mostly small (so budgets bind), sometimes 0, sometimes huge (to
// test overflow).
func (m *machine) size(label string) int64 {
	switch m.src.intn(label+"_kind", 0, 9) {
	case 0:
		return 0
	case 1:
		return MaxBytes - int64(m.src.intn(label+"_huge", 0, 3))
	}
	return int64(m.src.intn(label, 1, 300))
}

func (m *machine) pick(label string, ids []string) (string, bool) {
	if len(ids) == 0 {
		return "", false
	}
	return ids[m.src.intn(label, 0, len(ids)-1)], true
}

func (m *machine) byState(s State) []string {
	var ids []string
	for _, id := range m.t.ids() {
		if m.t.Nodes[id].State == s {
			ids = append(ids, id)
		}
	}
	return ids
}

func (m *machine) tick() int64 {
	m.clock += int64(m.src.intn("dt", 0, 3)) // 0: ties, which must break by ID
	return m.clock
}

func (m *machine) run(steps int) {
	for i := 0; i < steps; i++ {
		m.step()
		m.checkTree()
	}
}

func (m *machine) step() {
	if len(m.t.Nodes) == 0 {
		m.addOp("")
		return
	}
	switch m.src.intn("op", 0, 12) {
	case 0, 1, 2:
		p, _ := m.pick("parent", m.t.ids())
		m.addOp(p)
	case 3, 4:
		if id, ok := m.pick("resume", m.byState(Suspended)); ok {
			m.resumeOp(id)
		}
	case 5:
		id, _ := m.pick("keyframe", m.t.ids())
		m.keyframeOp(id)
	case 6:
		if id, ok := m.pick("suspend", m.byState(Live)); ok {
			m.suspendOp(id)
		}
	case 7:
		m.evictOp()
	case 8:
		id, _ := m.pick("protect", m.t.ids())
		if err := m.t.SetProtected(id, m.src.intn("on", 0, 1) == 1); err != nil {
			m.fatalf("SetProtected(%q): %v", id, err)
		}
	case 9:
		id, _ := m.pick("touch", m.t.ids())
		if err := m.t.Touch(id, m.tick()); err != nil {
			m.fatalf("Touch(%q): %v", id, err)
		}
	case 10:
		id, _ := m.pick("measure", m.t.ids())
		ms := Measurement{RAMBytes: Keep, SharedRAMBytes: Keep, DiskBytes: Keep, SuspendBytes: m.size("suspend_bytes")}
		if m.src.intn("measure_ram", 0, 3) == 0 {
			ms.RAMBytes = m.size("ram")
		}
		if err := m.t.Measure(id, ms); err != nil {
			m.fatalf("Measure(%q, %+v): %v", id, ms, err)
		}
		if !m.t.Budget.Within(m.t.Usage()) {
			m.overBy = true
		}
	case 11:
		m.pruneOp()
	case 12:
		m.budgetOp()
	}
}

// follow applies a plan's suspensions as a caller would (writing each node's planned
// delta), then the operation, and checks what must hold. op applies the operation with the
// planned figures.
func (m *machine) follow(what string, p Plan, except string, op func() error) {
	before := m.t.Clone()
	ub := before.Usage()
	ids := slices.Sorted(maps.Keys(before.Nodes))
	m.checkPlanShape(what, p, except)
	m.checkMinimal(what, p)
	for _, id := range p.Suspend {
		if err := m.t.ApplySuspend(id, m.t.Nodes[id].SuspendBytes); err != nil {
			m.fatalf("%s: plan %v: ApplySuspend(%q): %v", what, p.Suspend, id, err)
		}
	}
	if err := op(); err != nil {
		m.fatalf("%s: the operation failed after its plan %+v: %v", what, p, err)
	}
	ua := m.t.Usage()
	if ua != p.After {
		m.fatalf("%s: usage after %+v, plan said %+v", what, ua, p.After)
	}
	m.checkBudget(what, ub, ua)
	// Eviction never deletes.
	for _, id := range ids {
		if m.t.Nodes[id] == nil {
			m.fatalf("%s: node %q disappeared (only prune removes nodes)", what, id)
		}
	}
}

// checkBudget: after an operation the tree is within budget if it was before; and an
// operation never grows a dimension that is over budget.
func (m *machine) checkBudget(what string, ub, ua Usage) {
	b := m.t.Budget
	if !m.overBy && !b.Within(ua) {
		m.fatalf("%s: usage %+v is over the budget %+v", what, ua, b)
	}
	if ua.Live > b.MaxLive && ua.Live > ub.Live || ua.RAMBytes > b.MaxRAMBytes && ua.RAMBytes > ub.RAMBytes ||
		ua.DiskBytes > b.MaxDiskBytes && ua.DiskBytes > ub.DiskBytes {
		m.fatalf("%s: usage went from %+v to %+v, growing past the budget %+v", what, ub, ua, b)
	}
}

// checkMinimal: a plan suspends no more than it must: without its last suspension the
// operation would not fit (PlanEvict: RAM would still be at or over the threshold).
func (m *machine) checkMinimal(what string, p Plan) {
	if len(p.Suspend) == 0 {
		return
	}
	last := m.t.Nodes[p.Suspend[len(p.Suspend)-1]]
	var ram wide
	ram = ram.add(p.After.RAMBytes).add(last.RAMBytes)
	b := m.t.Budget
	if what == "PlanEvict" {
		if ram.lt(b.EvictThreshold()) {
			m.fatalf("%s: plan %v suspends %q though RAM was already below the threshold", what, p.Suspend, last.ID)
		}
		return
	}
	if p.After.Live+1 <= b.MaxLive && !ram.gt(b.MaxRAMBytes) {
		m.fatalf("%s: plan %v suspends %q, which the operation did not need", what, p.Suspend, last.ID)
	}
}

// checkPlanShape: a plan only suspends live, unprotected, resumable nodes, never the node
// operated on, in LRU order (ties by ID), each once.
func (m *machine) checkPlanShape(what string, p Plan, except string) {
	var prev *Node
	for _, id := range p.Suspend {
		n := m.t.Nodes[id]
		switch {
		case n == nil:
			m.fatalf("%s: plan suspends unknown node %q", what, id)
		case n.Protected:
			m.fatalf("%s: plan %v suspends protected node %q", what, p.Suspend, id)
		case n.State != Live:
			m.fatalf("%s: plan %v suspends %s node %q", what, p.Suspend, n.State, id)
		case id == except:
			m.fatalf("%s: plan %v suspends the node it operates on", what, p.Suspend)
		case m.t.ChainDepth(id) < 0 || m.t.ChainDepth(id) > m.t.Budget.MaxChainDepth:
			m.fatalf("%s: plan suspends %q, whose chain depth %d could not be resumed", what, id, m.t.ChainDepth(id))
		case prev != nil && (prev.LastActive > n.LastActive || prev.LastActive == n.LastActive && prev.ID >= n.ID):
			m.fatalf("%s: plan %v is not in LRU order at %q", what, p.Suspend, id)
		}
		prev = n
	}
}

// plan calls f on the tree, on a clone and on a JSON round trip of it, and checks that
// it did not mutate the tree and answered the same each time.
func (m *machine) plan(what string, f func(*Tree) (Plan, error)) (Plan, error) {
	before := m.t.Clone()
	p, err := f(m.t)
	if !reflect.DeepEqual(before, m.t) {
		m.fatalf("%s: the plan mutated the tree", what)
	}
	b, jerr := json.Marshal(m.t)
	var rt Tree
	if jerr == nil {
		jerr = json.Unmarshal(b, &rt)
	}
	if jerr != nil {
		m.fatalf("%s: JSON round trip: %v", what, jerr)
	}
	for _, other := range []*Tree{m.t.Clone(), &rt} {
		p2, err2 := f(other)
		if !reflect.DeepEqual(p, p2) || fmt.Sprint(err) != fmt.Sprint(err2) {
			m.fatalf("%s: plans differ on equal trees: %+v %v vs %+v %v", what, p, err, p2, err2)
		}
	}
	if err != nil {
		var ob *OverBudgetError
		if errors.As(err, &ob) {
			if !errors.Is(err, ErrOverBudget) {
				m.fatalf("%s: OverBudgetError does not match ErrOverBudget", what)
			}
			m.checkRefusal(what, ob)
		}
	}
	return p, err
}

// checkRefusal: an over-budget refusal is true: the figures add up past the limit, and
// suspending every evictable node would not have helped for live and RAM.
func (m *machine) checkRefusal(what string, e *OverBudgetError) {
	if e.Error() == "" || e.Op == "" || e.Budget == "" {
		m.fatalf("%s: empty refusal %+v", what, e)
	}
	switch e.Budget {
	case "max_chain_depth":
		if e.Need >= 0 && e.Need <= e.Limit {
			m.fatalf("%s: chain refusal %+v within its limit", what, e)
		}
	default:
		var sum wide
		if sum = sum.add(e.Need).add(e.Have); !sum.gt(e.Limit) {
			m.fatalf("%s: refusal %+v: need + have fit the limit", what, e)
		}
	}
}

// stillRefused checks a live or RAM refusal independently of the planner: with every
// node eviction may take suspended (writing nothing), apply must still be refused for
// the same budget.
func (m *machine) stillRefused(what string, err error, except string, apply func(*Tree) error) {
	var ob *OverBudgetError
	if !errors.As(err, &ob) || ob.Budget != "max_live" && ob.Budget != "max_ram_bytes" {
		return
	}
	c := m.t.Clone()
	for _, id := range c.Evictable(except) {
		if err := c.ApplySuspend(id, 0); err != nil {
			m.fatalf("%s: suspending %q with no delta: %v", what, id, err)
		}
	}
	var ob2 *OverBudgetError
	if err2 := apply(c); !errors.As(err2, &ob2) || ob2.Budget != ob.Budget {
		m.fatalf("%s refused (%v), but after evicting everything it may the operation gives %v", what, err, err2)
	}
}

// unchanged checks that a failed Apply left the tree as it was.
func (m *machine) unchanged(what string, before *Tree, err error) {
	if err != nil && !reflect.DeepEqual(before, m.t) {
		m.fatalf("%s failed (%v) and changed the tree", what, err)
	}
}

func (m *machine) addOp(parent string) {
	n := m.src.intn("n", 1, 4)
	if parent == "" {
		n = 1
	}
	ram, disk := m.size("ram_each"), m.size("disk_each")
	what := fmt.Sprintf("PlanAdd(%q, %d, %d, %d)", parent, n, ram, disk)
	p, err := m.plan(what, func(t *Tree) (Plan, error) { return t.PlanAdd(parent, n, ram, disk) })
	if err != nil {
		if !errors.Is(err, ErrOverBudget) {
			m.fatalf("%s: %v", what, err)
		}
		// The refused batch applied anyway must be refused by ApplyAdd too, tree unchanged.
		nodes := m.newNodes(n, ram, disk)
		m.stillRefused(what, err, parent, func(c *Tree) error { return c.ApplyAdd(parent, slices.Clone(nodes)...) })
		before := m.t.Clone()
		m.unchanged("ApplyAdd of a refused batch", before, m.t.ApplyAdd(parent, nodes...))
		return
	}
	nodes := m.newNodes(n, ram, disk)
	m.follow(what, p, parent, func() error { return m.t.ApplyAdd(parent, nodes...) })
	if parent != "" {
		for _, c := range nodes {
			want := m.t.ChainDepth(parent) + 1
			if m.t.ChainDepth(parent) < 0 {
				want = NoKeyframe
			}
			if got := m.t.ChainDepth(c.ID); got != want {
				m.fatalf("child %q of %q: chain depth %d, want %d", c.ID, parent, got, want)
			}
		}
	}
}

func (m *machine) newNodes(n int, ram, disk int64) []Node {
	nodes := make([]Node, n)
	at := m.tick()
	for i := range nodes {
		m.next++
		nodes[i] = Node{ID: fmt.Sprintf("n%03d", m.next), RAMBytes: ram, DiskBytes: disk, SuspendBytes: m.size("suspend_bytes"), LastActive: at}
	}
	return nodes
}

func (m *machine) resumeOp(id string) {
	ram := m.size("resume_ram")
	what := fmt.Sprintf("PlanResume(%q, %d)", id, ram)
	p, err := m.plan(what, func(t *Tree) (Plan, error) { return t.PlanResume(id, ram) })
	if err != nil {
		if !errors.Is(err, ErrOverBudget) {
			m.fatalf("%s: %v", what, err)
		}
		m.stillRefused(what, err, id, func(c *Tree) error { return c.ApplyResume(id, ram, m.clock) })
		before := m.t.Clone()
		m.unchanged("ApplyResume of a refused resume", before, m.t.ApplyResume(id, ram, m.clock))
		if d := m.t.ChainDepth(id); (d < 0 || d > m.t.Budget.MaxChainDepth) && m.t.ApplyResume(id, ram, m.clock) == nil {
			m.fatalf("ApplyResume(%q) at chain depth %d passed the bound %d", id, d, m.t.Budget.MaxChainDepth)
		}
		return
	}
	if d := m.t.ChainDepth(id); d < 0 || d > m.t.Budget.MaxChainDepth {
		m.fatalf("%s: planned a resume at chain depth %d, bound %d", what, d, m.t.Budget.MaxChainDepth)
	}
	m.follow(what, p, id, func() error { return m.t.ApplyResume(id, ram, m.tick()) })
}

func (m *machine) keyframeOp(id string) {
	disk, shared := m.size("kf_disk"), int64(0)
	if m.src.intn("kf_shared", 0, 1) == 1 {
		shared = m.size("kf_shared_ram")
	}
	what := fmt.Sprintf("PlanKeyframeShared(%q, %d, %d)", id, disk, shared)
	p, err := m.plan(what, func(t *Tree) (Plan, error) { return t.PlanKeyframeShared(id, disk, shared) })
	if err != nil {
		if !errors.Is(err, ErrOverBudget) {
			m.fatalf("%s: %v", what, err)
		}
		m.stillRefused(what, err, id, func(c *Tree) error { return c.ApplyKeyframe(id, disk, shared) })
		before := m.t.Clone()
		m.unchanged("ApplyKeyframe of a refused keyframe", before, m.t.ApplyKeyframe(id, disk, shared))
		return
	}
	if shared == 0 && len(p.Suspend) > 0 {
		m.fatalf("%s: a disk-only keyframe planned suspensions %v (they cannot free disk)", what, p.Suspend)
	}
	m.follow(what, p, id, func() error { return m.t.ApplyKeyframe(id, disk, shared) })
}

func (m *machine) suspendOp(id string) {
	before := m.t.Clone()
	ub := before.Usage()
	delta := m.t.Nodes[id].SuspendBytes
	if m.src.intn("bigger_delta", 0, 3) == 0 {
		delta = m.size("delta")
	}
	err := m.t.ApplySuspend(id, delta)
	m.unchanged(fmt.Sprintf("ApplySuspend(%q, %d)", id, delta), before, err)
	if err != nil {
		if !errors.Is(err, ErrOverBudget) && !errors.Is(err, ErrInvalid) {
			m.fatalf("ApplySuspend(%q, %d): %v", id, delta, err)
		}
		return
	}
	if len(m.t.Nodes) != len(before.Nodes) || m.t.Nodes[id].State != Suspended {
		m.fatalf("ApplySuspend(%q) did not just suspend it", id)
	}
	m.checkBudget("ApplySuspend", ub, m.t.Usage())
}

func (m *machine) evictOp() {
	p, _ := m.plan("PlanEvict", func(t *Tree) (Plan, error) { return t.PlanEvict(), nil })
	m.follow("PlanEvict", p, "", func() error { return nil })
	thr := m.t.Budget.EvictThreshold()
	u := m.t.Usage()
	if u.RAMBytes < thr {
		return
	}
	// Still at or over 85%: every node eviction could still take must not fit on disk.
	for _, id := range m.t.Evictable() {
		var d wide
		if !d.add(u.DiskBytes).add(m.t.Nodes[id].SuspendBytes).gt(m.t.Budget.MaxDiskBytes) {
			m.fatalf("PlanEvict stopped at RAM %d >= %d with %q still evictable", u.RAMBytes, thr, id)
		}
	}
}

func (m *machine) pruneOp() {
	id, _ := m.pick("prune", m.t.ids())
	before := m.t.Clone()
	want := m.t.Subtree(id)
	got, err := m.t.ApplyPrune(id)
	if err != nil || !reflect.DeepEqual(got, want) || len(m.t.Nodes) != len(before.Nodes)-len(want) {
		m.fatalf("ApplyPrune(%q) = %v, %v; want %v and %d nodes left", id, got, err, want, len(before.Nodes)-len(want))
	}
	// Leaves first: a node comes after its children; none is left.
	pos := map[string]int{}
	for i, r := range got {
		pos[r] = i
	}
	for i, r := range got {
		if m.t.Nodes[r] != nil {
			m.fatalf("pruned %q still in the tree", r)
		}
		if p, ok := pos[before.Nodes[r].Parent]; ok && p < i {
			m.fatalf("ApplyPrune order %v: %q before its child %q", got, before.Nodes[r].Parent, r)
		}
	}
	if !m.t.Budget.Within(m.t.Usage()) && !m.overBy {
		m.fatalf("prune left the tree over budget")
	}
}

// checkTree: the tree stays well formed, and nothing eviction suspended is stranded.
func (m *machine) checkTree() {
	if err := m.t.Check(); err != nil {
		m.fatalf("Check: %v", err)
	}
}

// budgetOp changes the budget (lower or higher) the way a caller must: PlanBudget, the
// suspensions, ApplyBudget; a refusal names nodes that really stop it.
func (m *machine) budgetOp() {
	nb := Budget{
		MaxLive:       m.src.intn("nb_live", 1, 8),
		MaxRAMBytes:   int64(m.src.intn("nb_ram", 1, 1000)),
		MaxDiskBytes:  int64(m.src.intn("nb_disk", 1, 2000)),
		MaxChainDepth: m.src.intn("nb_chain", 0, 3),
	}
	what := fmt.Sprintf("PlanBudget(%+v)", nb)
	p, err := m.plan(what, func(t *Tree) (Plan, error) { return t.PlanBudget(nb) })
	if err != nil {
		var ce *ChangeError
		if !errors.As(err, &ce) || !errors.Is(err, ErrOverBudget) || strings.Contains(err.Error(), "\n") {
			m.fatalf("%s: %v, want a one-line *ChangeError", what, err)
		}
		// The nodes it names stop it: with every other live node suspended, still over.
		c := m.t.Clone()
		c.Budget = nb
		named := append(slices.Clone(ce.Protected), ce.Stuck...)
		for _, n := range c.Nodes {
			if n.State == Live && !slices.Contains(named, n.ID) {
				n.State = Suspended
			}
			if slices.Contains(ce.Protected, n.ID) && (!n.Protected || n.State != Live) {
				m.fatalf("%s: %v names %q protected and live; it is %s, protected %v", what, err, n.ID, n.State, n.Protected)
			}
		}
		u := c.Usage()
		switch ce.Budget {
		case "max_live":
			if u.Live <= nb.MaxLive {
				m.fatalf("%s: %v, yet suspending every unnamed node leaves %d live", what, err, u.Live)
			}
		case "max_ram_bytes":
			if u.RAMBytes <= nb.MaxRAMBytes {
				m.fatalf("%s: %v, yet suspending every unnamed node leaves %d RAM", what, err, u.RAMBytes)
			}
		case "max_disk_bytes":
			if u.DiskBytes <= nb.MaxDiskBytes {
				m.fatalf("%s: %v, yet the tree holds %d disk", what, err, u.DiskBytes)
			}
		}
		before := m.t.Clone()
		if m.t.ApplyBudget(nb) == nil {
			m.fatalf("%s refused (%v) but ApplyBudget took it", what, err)
		}
		m.unchanged("ApplyBudget of a refused budget", before, errors.New("refused"))
		return
	}
	old := m.t.Budget
	m.t.Budget = nb
	m.checkPlanShape(what, p, "")
	// The suspensions write their deltas under the new budget (PlanBudget fitted them to
	// its disk bound).
	for _, id := range p.Suspend {
		if err := m.t.ApplySuspend(id, m.t.Nodes[id].SuspendBytes); err != nil {
			m.fatalf("%s: plan %v: ApplySuspend(%q): %v", what, p.Suspend, id, err)
		}
	}
	m.t.Budget = old
	if err := m.t.ApplyBudget(nb); err != nil {
		m.fatalf("%s: ApplyBudget after the plan %v: %v", what, p.Suspend, err)
	}
	u := m.t.Usage()
	if u != p.After || !nb.Within(u) {
		m.fatalf("%s: usage after %+v, plan said %+v, budget %+v", what, u, p.After, nb)
	}
	if k := len(p.Suspend); k > 0 {
		last := m.t.Nodes[p.Suspend[k-1]]
		var ram wide
		if ram = ram.add(u.RAMBytes).add(last.RAMBytes); u.Live+1 <= nb.MaxLive && !ram.gt(nb.MaxRAMBytes) {
			m.fatalf("%s: plan %v suspends %q, which the budget did not need", what, p.Suspend, last.ID)
		}
	}
	m.overBy = false
}
