// Package budget is the snapshot tree's budget and eviction bookkeeping. It holds one
// tree's nodes with what each is charged and decides what an operation needs suspended
// first, or that it cannot fit. It does no I/O and reads no clock: callers pass sizes and
// times in, so every decision is a deterministic function of the tree and the arguments.
//
// A budgeted operation goes:
//
//  1. Plan* (never mutates): the nodes to suspend first, least recently active first, or
//     an *OverBudgetError when the operation cannot fit even after eviction.
//  2. For each node of Plan.Suspend, in order: write its delta, ApplySuspend with the
//     bytes written, then end its processes (ApplySuspend refuses a delta that would
//     overflow the disk budget, and the caller then discards it and thaws the node).
//  3. The operation itself, then its Apply* with the figures measured. Apply* check the
//     budget again and, on error, leave the tree exactly as it was, so the caller undoes
//     its work.
//
// Eviction suspends, never deletes: only ApplyPrune removes nodes. Suspension frees the
// node's RAM charge and writes its delta, so it costs disk (Node.SuspendBytes, which the
// caller keeps current, is what every plan charges for it); it never frees disk, so a
// keyframe or fork that does not fit the disk budget fails: only pruning makes disk room.
package budget

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/lazyfork/lazyfork/lib/exitcode"
)

// Budget bounds one tree. Every field must be positive except MaxChainDepth (0: only
// keyframes may be resumed).
type Budget struct {
	// MaxLive is the most nodes live (running) at once.
	MaxLive int `json:"max_live"`
	// MaxRAMBytes bounds the RAM the tree's cgroup is charged: every live node's charge
	// plus the memory files of its keyframes still on tmpfs (Node.SharedRAMBytes).
	MaxRAMBytes int64 `json:"max_ram_bytes"`
	// MaxDiskBytes bounds the physical bytes of keyframes and deltas on disk.
	MaxDiskBytes int64 `json:"max_disk_bytes"`
	// MaxChainDepth bounds a resume's restore chain: non-keyframe hops from the node to
	// its nearest keyframe (see Tree.ChainDepth). Not the depth in the tree.
	MaxChainDepth int `json:"max_chain_depth"`
}

// MaxBytes is the largest byte figure (budget or node charge) accepted: 1 EiB, so that
// no sum of a few of them is near overflow in messages.
const MaxBytes int64 = 1 << 60

// EvictPercent is the share of the RAM budget at which proactive eviction (PlanEvict)
// starts suspending: well below the cgroup's hard limit, where the kernel would reclaim
// (stall) and then OOM-kill inside the tree.
const EvictPercent = 85

// Default is the budget of a tree created without one. It is sized for a handful of
// small containers (tens to a few hundred MiB each) on a modest host: 16 live containers
// (more only time-share the cores), 4 GiB of live RAM (the tree cgroup's memory limit
// derives from it), 16 GiB of disk (4× the RAM, so every live node can be suspended and
// the keyframes still fit), and chain depth 1: a resume applies one delta on top of one
// keyframe. A LazyFork fork dumps its source, which makes the source a keyframe, so the
// forks of a live node are one hop from it and stay resumable under this default.
func Default() Budget {
	return Budget{MaxLive: 16, MaxRAMBytes: 4 << 30, MaxDiskBytes: 16 << 30, MaxChainDepth: 1}
}

// Validate returns an error naming the first field out of range and the fix.
func (b Budget) Validate() error {
	switch {
	case b.MaxLive < 1:
		return invalidf("budget max_live is %d: it must be at least 1", b.MaxLive)
	case b.MaxRAMBytes < 1 || b.MaxRAMBytes > MaxBytes:
		return invalidf("budget max_ram_bytes is %d: it must be between 1 and %d", b.MaxRAMBytes, MaxBytes)
	case b.MaxDiskBytes < 1 || b.MaxDiskBytes > MaxBytes:
		return invalidf("budget max_disk_bytes is %d: it must be between 1 and %d", b.MaxDiskBytes, MaxBytes)
	case b.MaxChainDepth < 0:
		return invalidf("budget max_chain_depth is %d: it must be 0 or more", b.MaxChainDepth)
	}
	return nil
}

// EvictThreshold is EvictPercent of MaxRAMBytes, rounded up: PlanEvict suspends until
// the RAM charge is below it, which for whole bytes is below EvictPercent exactly.
func (b Budget) EvictThreshold() int64 {
	return b.MaxRAMBytes/100*EvictPercent + (b.MaxRAMBytes%100*EvictPercent+99)/100
}

// State is a node's state. Pruned nodes are removed from the tree, not marked.
type State string

const (
	Live      State = "live"
	Suspended State = "suspended"
)

// Node is one node's bookkeeping. Sizes are bytes, times unix nanoseconds, both supplied
// by the caller.
type Node struct {
	ID     string `json:"id"`
	Parent string `json:"parent,omitempty"` // "" for the root
	State  State  `json:"state"`
	// Protected nodes are never chosen by eviction (an explicit suspend still works).
	Protected bool `json:"protected,omitempty"`
	// Keyframe: the node owns memory files a restore can start from.
	Keyframe bool `json:"keyframe,omitempty"`
	// RAMBytes is the node's own charge, counted while it is live.
	RAMBytes int64 `json:"ram_bytes"`
	// SharedRAMBytes is the node's keyframe memory files still on tmpfs: charged to the
	// tree whether the node is live or suspended (its forks map them), so eviction of the
	// node does not free it. 0 once the files moved to disk.
	SharedRAMBytes int64 `json:"shared_ram_bytes,omitempty"`
	// DiskBytes is what the node owns on disk (keyframe + delta), physical bytes.
	DiskBytes int64 `json:"disk_bytes"`
	// SuspendBytes is what suspending the node would write (its dirty pages): an
	// estimate the caller keeps current with Measure; plans charge it to disk.
	SuspendBytes int64 `json:"suspend_bytes"`
	// LastActive is when the node last used CPU or was operated on; LRU ranks on it.
	LastActive int64 `json:"last_active"`
}

// Tree is one snapshot tree's bookkeeping: its budget and its nodes by ID. A tree has
// at most one root (the node with no parent).
type Tree struct {
	Budget Budget           `json:"budget"`
	Nodes  map[string]*Node `json:"nodes"`
}

// Usage is what a tree is charged now.
type Usage struct {
	Live      int   `json:"live"`
	RAMBytes  int64 `json:"ram_bytes"`
	DiskBytes int64 `json:"disk_bytes"`
}

// Plan is what an operation needs done first.
type Plan struct {
	// Suspend lists the nodes to suspend before the operation, least recently active
	// first. Empty when the operation fits as it is.
	Suspend []string `json:"suspend"`
	// After is the usage once the suspensions and the operation are applied with the
	// figures planned.
	After Usage `json:"after"`
}

// Errors a caller can test with errors.Is. All but ErrOverBudget carry the exit status a
// command gives them (lib/exitcode); a refusal by the budget is status 1.
var (
	ErrOverBudget  = errors.New("over budget")
	ErrUnknownNode = exitcode.NewNotFound("no such node in the tree")
	ErrState       = exitcode.Kind{Msg: "node in the wrong state", Code: exitcode.InvalidState}
	ErrInvalid     = exitcode.Kind{Msg: "invalid tree operation", Code: exitcode.Usage}
)

// invalid is an ErrInvalid with a message of its own (a budget field out of range).
type invalid string

func invalidf(format string, args ...any) error { return invalid(fmt.Sprintf(format, args...)) }

func (e invalid) Error() string        { return string(e) }
func (e invalid) Is(target error) bool { return target == ErrInvalid }
func (e invalid) ExitCode() int        { return exitcode.Usage }

// OverBudgetError is an operation that cannot fit even after eviction. Need is what the
// operation adds (for disk: plus the deltas its suspensions write), Have what stays
// charged however much is evicted, Limit the budget. For max_chain_depth, Need is the
// node's chain depth (-1: no keyframe on its path) and Have is unused.
type OverBudgetError struct {
	Op     string `json:"op"`     // fork, create, resume, keyframe, suspend
	Node   string `json:"node"`   // the node operated on (the parent for a fork)
	Budget string `json:"budget"` // max_live, max_ram_bytes, max_disk_bytes, max_chain_depth
	Need   int64  `json:"need"`
	Have   int64  `json:"have"`
	Limit  int64  `json:"limit"`
}

func (e *OverBudgetError) Is(target error) bool { return target == ErrOverBudget }

func (e *OverBudgetError) Error() string {
	switch e.Budget {
	case "max_live":
		return fmt.Sprintf("%s of %q needs %d more live nodes but %d stay live after suspending every node eviction may take, over the tree's max_live %d: unprotect, suspend or prune nodes, or raise max_live",
			e.Op, e.Node, e.Need, e.Have, e.Limit)
	case "max_ram_bytes":
		return fmt.Sprintf("%s of %q needs %s of RAM but %s stays charged after suspending every node eviction may take, over the tree's max_ram_bytes %s: unprotect or prune nodes, or raise max_ram_bytes",
			e.Op, e.Node, Bytes(e.Need), Bytes(e.Have), Bytes(e.Limit))
	case "max_disk_bytes":
		return fmt.Sprintf("%s of %q needs %s of disk (with the deltas of the suspensions it needs) but the tree holds %s, over its max_disk_bytes %s: prune nodes (eviction writes disk, only prune frees it), or raise max_disk_bytes",
			e.Op, e.Node, Bytes(e.Need), Bytes(e.Have), Bytes(e.Limit))
	case "max_chain_depth":
		if e.Need < 0 {
			return fmt.Sprintf("%s of %q: no ancestor of it is a keyframe, so it has nothing to restore from: prepare (keyframe) an ancestor first",
				e.Op, e.Node)
		}
		return fmt.Sprintf("%s of %q needs a restore chain of %d non-keyframe hops, over the tree's max_chain_depth %d: prepare (keyframe) a nearer ancestor, or raise max_chain_depth",
			e.Op, e.Node, e.Need, e.Limit)
	}
	return fmt.Sprintf("%s of %q over budget %s: need %d, have %d, limit %d", e.Op, e.Node, e.Budget, e.Need, e.Have, e.Limit)
}

// Bytes formats n for a human: "512 MiB", "1.5 GiB".
func Bytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n), 0
	for ; (f >= unit || f <= -unit) && i < 6; i++ {
		f /= unit
	}
	s := fmt.Sprintf("%.1f", f)
	if len(s) > 2 && s[len(s)-2:] == ".0" {
		s = s[:len(s)-2]
	}
	return s + " " + [...]string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}[i]
}

// New returns an empty tree with budget b.
func New(b Budget) (*Tree, error) {
	if err := b.Validate(); err != nil {
		return nil, err
	}
	return &Tree{Budget: b, Nodes: map[string]*Node{}}, nil
}

// Clone returns a deep copy.
func (t *Tree) Clone() *Tree {
	c := &Tree{Budget: t.Budget}
	if t.Nodes == nil {
		return c
	}
	c.Nodes = make(map[string]*Node, len(t.Nodes))
	for id, n := range t.Nodes {
		nn := *n
		c.Nodes[id] = &nn
	}
	return c
}

// Check verifies a tree read from outside (a file, a request): the budget, every node's
// fields, one root, parents that exist and no cycle.
func (t *Tree) Check() error {
	if err := t.Budget.Validate(); err != nil {
		return err
	}
	roots := 0
	for _, id := range t.ids() {
		n := t.Nodes[id]
		if n == nil || n.ID != id {
			return fmt.Errorf("%w: node entry %q does not carry its own id", ErrInvalid, id)
		}
		if err := checkNode(n); err != nil {
			return err
		}
		if n.Parent == "" {
			roots++
		} else if t.Nodes[n.Parent] == nil {
			return fmt.Errorf("%w: node %q has parent %q, which is not in the tree", ErrInvalid, id, n.Parent)
		}
	}
	if roots > 1 {
		return fmt.Errorf("%w: the tree has %d roots: a tree has one", ErrInvalid, roots)
	}
	// With one root and every parent present, a cycle shows as a walk longer than the tree.
	for id := range t.Nodes {
		if t.depth(id) < 0 {
			return fmt.Errorf("%w: node %q is on a parent cycle", ErrInvalid, id)
		}
	}
	return nil
}

func checkNode(n *Node) error {
	if n.ID == "" || len(n.ID) > 255 {
		return fmt.Errorf("%w: node id %q must be 1 to 255 bytes", ErrInvalid, n.ID)
	}
	if n.State != Live && n.State != Suspended {
		return fmt.Errorf("%w: node %q has state %q: want live or suspended", ErrInvalid, n.ID, n.State)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"ram_bytes", n.RAMBytes}, {"shared_ram_bytes", n.SharedRAMBytes}, {"disk_bytes", n.DiskBytes}, {"suspend_bytes", n.SuspendBytes}} {
		if f.v < 0 || f.v > MaxBytes {
			return fmt.Errorf("%w: node %q has %s %d: it must be between 0 and %d", ErrInvalid, n.ID, f.name, f.v, MaxBytes)
		}
	}
	return nil
}

func checkSize(what string, v int64) error {
	if v < 0 || v > MaxBytes {
		return fmt.Errorf("%w: %s is %d bytes: it must be between 0 and %d", ErrInvalid, what, v, MaxBytes)
	}
	return nil
}

// ids returns the node IDs sorted, so every walk is deterministic.
func (t *Tree) ids() []string {
	ids := make([]string, 0, len(t.Nodes))
	for id := range t.Nodes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// depth is the number of parent hops to the root, -1 on a cycle.
func (t *Tree) depth(id string) int {
	d := 0
	for n := t.Nodes[id]; n != nil && n.Parent != ""; n = t.Nodes[n.Parent] {
		if d++; d > len(t.Nodes) {
			return -1
		}
	}
	return d
}

func (t *Tree) node(id string) (*Node, error) {
	n := t.Nodes[id]
	if n == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownNode, id)
	}
	return n, nil
}

// Root returns the root's ID, "" for an empty tree.
func (t *Tree) Root() string {
	for _, id := range t.ids() {
		if t.Nodes[id].Parent == "" {
			return id
		}
	}
	return ""
}

// Children returns id's children, sorted.
func (t *Tree) Children(id string) []string {
	var c []string
	for _, cid := range t.ids() {
		if t.Nodes[cid].Parent == id && id != "" {
			c = append(c, cid)
		}
	}
	return c
}

// Subtree returns id and all its descendants, leaves first (the order to tear them down),
// nil for an unknown id.
func (t *Tree) Subtree(id string) []string {
	if t.Nodes[id] == nil {
		return nil
	}
	kids := map[string][]string{}
	for _, cid := range t.ids() {
		if p := t.Nodes[cid].Parent; p != "" {
			kids[p] = append(kids[p], cid)
		}
	}
	var out []string
	seen := map[string]bool{}
	var walk func(string)
	walk = func(n string) {
		if seen[n] {
			return
		}
		seen[n] = true
		for _, c := range kids[n] {
			walk(c)
		}
		out = append(out, n)
	}
	walk(id)
	return out
}

// Usage sums the tree's charges: live nodes, RAM of live nodes plus every node's tmpfs
// memory files, and every node's disk. Sums saturate at MaxInt64.
func (t *Tree) Usage() Usage {
	live, ram, disk := t.usage()
	return Usage{Live: live, RAMBytes: ram.int64(), DiskBytes: disk.int64()}
}

// usage is Usage with exact sums.
func (t *Tree) usage() (live int, ram, disk wide) {
	for _, n := range t.Nodes {
		if n.State == Live {
			live++
			ram = ram.add(n.RAMBytes)
		}
		ram = ram.add(n.SharedRAMBytes)
		disk = disk.add(n.DiskBytes)
	}
	return live, ram, disk
}

// Within reports whether u fits b.
func (b Budget) Within(u Usage) bool {
	return u.Live <= b.MaxLive && u.RAMBytes <= b.MaxRAMBytes && u.DiskBytes <= b.MaxDiskBytes
}

// NoKeyframe is ChainDepth's answer for a node with no keyframe on its path to the root.
const NoKeyframe = -1

// ChainDepth is the number of non-keyframe nodes from id up to its nearest keyframe
// ancestor, id included: 0 for a keyframe, 1 for a non-keyframe child of one. NoKeyframe
// when no node on the path is a keyframe (or id is unknown).
func (t *Tree) ChainDepth(id string) int {
	d := 0
	for n := t.Nodes[id]; n != nil; n = t.Nodes[n.Parent] {
		if n.Keyframe {
			return d
		}
		if d++; d > len(t.Nodes) || n.Parent == "" {
			break
		}
	}
	return NoKeyframe
}

// Evictable returns the nodes eviction may suspend, least recently active first (ties by
// ID): live, unprotected, not in except, and resumable afterwards (chain depth within
// the budget), so eviction never strands a node.
func (t *Tree) Evictable(except ...string) []string {
	var c []*Node
	for _, n := range t.Nodes {
		if n.State != Live || n.Protected || slices.Contains(except, n.ID) {
			continue
		}
		if d := t.ChainDepth(n.ID); d < 0 || d > t.Budget.MaxChainDepth {
			continue
		}
		c = append(c, n)
	}
	slices.SortFunc(c, func(a, b *Node) int {
		return cmp.Or(cmp.Compare(a.LastActive, b.LastActive), cmp.Compare(a.ID, b.ID))
	})
	ids := make([]string, len(c))
	for i, n := range c {
		ids[i] = n.ID
	}
	return ids
}

// demand is what an operation adds to the tree's usage.
type demand struct {
	op, node string
	live     int
	ram      int64
	disk     int64
	except   []string // nodes the operation works on: never evicted for it
}

// fit plans the fewest LRU suspensions after which the tree plus d is within the live
// and RAM budgets, then checks the disk: the operation's plus the suspensions' deltas.
// A dimension the operation and its suspensions do not grow is not checked, so a tree
// that measured over budget can still shrink.
func (t *Tree) fit(d demand) (Plan, error) {
	b := t.Budget
	cand := t.Evictable(d.except...)
	// RAM and live that no eviction frees: non-candidates plus the demand. Candidates'
	// charges are summed from the end so that "suspend the first k" is one lookup.
	var fixedRAM wide
	fixedLive := d.live
	fixedRAM = fixedRAM.add(d.ram)
	inCand := make(map[string]bool, len(cand))
	for _, id := range cand {
		inCand[id] = true
	}
	u := t.Usage()
	for _, n := range t.Nodes {
		fixedRAM = fixedRAM.add(n.SharedRAMBytes)
		if n.State == Live && !inCand[n.ID] {
			fixedLive++
			fixedRAM = fixedRAM.add(n.RAMBytes)
		}
	}
	suffix := make([]wide, len(cand)+1)
	for i := len(cand) - 1; i >= 0; i-- {
		suffix[i] = suffix[i+1].addWide(wide{lo: uint64(t.Nodes[cand[i]].RAMBytes)})
	}
	k := 0
	liveAfter := func(k int) int { return fixedLive + len(cand) - k }
	ramAfter := func(k int) wide { return fixedRAM.addWide(suffix[k]) }
	growsLive, growsRAM := d.live > 0, d.ram > 0
	for k < len(cand) && (growsLive && liveAfter(k) > b.MaxLive || growsRAM && ramAfter(k).gt(b.MaxRAMBytes)) {
		k++
	}
	if growsLive && liveAfter(k) > b.MaxLive {
		return Plan{}, &OverBudgetError{Op: d.op, Node: d.node, Budget: "max_live", Need: int64(d.live), Have: int64(liveAfter(k) - d.live), Limit: int64(b.MaxLive)}
	}
	if growsRAM && ramAfter(k).gt(b.MaxRAMBytes) {
		return Plan{}, &OverBudgetError{Op: d.op, Node: d.node, Budget: "max_ram_bytes", Need: d.ram, Have: ramAfter(k).sub(d.ram).int64(), Limit: b.MaxRAMBytes}
	}
	var diskNeed wide
	diskNeed = diskNeed.add(d.disk)
	for _, id := range cand[:k] {
		diskNeed = diskNeed.add(t.Nodes[id].SuspendBytes)
	}
	var diskAfter wide
	diskAfter = diskAfter.add(u.DiskBytes).addWide(diskNeed)
	if !diskNeed.zero() && diskAfter.gt(b.MaxDiskBytes) {
		return Plan{}, &OverBudgetError{Op: d.op, Node: d.node, Budget: "max_disk_bytes", Need: diskNeed.int64(), Have: u.DiskBytes, Limit: b.MaxDiskBytes}
	}
	return Plan{
		Suspend: slices.Clone(cand[:k]),
		After:   Usage{Live: liveAfter(k), RAMBytes: ramAfter(k).int64(), DiskBytes: diskAfter.int64()},
	}, nil
}

// PlanAdd plans n new live nodes under parent (a fork batch; "" for the root of an empty
// tree, n = 1), each charged ramEach RAM and diskEach disk. The parent is never evicted
// for its own fork. A fork of a node that is not a keyframe has chain depth one more than
// its parent's: keyframe the parent first (a LazyFork fork dumps it, which does) or its
// forks may be refused on resume and are never evicted.
func (t *Tree) PlanAdd(parent string, n int, ramEach, diskEach int64) (Plan, error) {
	if err := t.checkAdd(parent, n); err != nil {
		return Plan{}, err
	}
	if err := errors.Join(checkSize("ram per node", ramEach), checkSize("disk per node", diskEach)); err != nil {
		return Plan{}, err
	}
	op := "fork"
	if parent == "" {
		op = "create"
	}
	return t.fit(demand{op: op, node: parent, live: n, ram: mulSat(n, ramEach), disk: mulSat(n, diskEach), except: []string{parent}})
}

func (t *Tree) checkAdd(parent string, n int) error {
	if n < 1 {
		return fmt.Errorf("%w: adding %d nodes: add at least 1", ErrInvalid, n)
	}
	if parent == "" {
		if len(t.Nodes) > 0 {
			return fmt.Errorf("%w: the tree already has root %q: fork from a node instead", ErrInvalid, t.Root())
		}
		if n != 1 {
			return fmt.Errorf("%w: a tree has one root, not %d", ErrInvalid, n)
		}
		return nil
	}
	_, err := t.node(parent)
	return err
}

// PlanResume plans bringing suspended node id back live with ram RAM. It refuses a node
// whose chain depth exceeds MaxChainDepth (or that has no keyframe ancestor).
func (t *Tree) PlanResume(id string, ram int64) (Plan, error) {
	if err := t.checkResume(id, ram); err != nil {
		return Plan{}, err
	}
	return t.fit(demand{op: "resume", node: id, live: 1, ram: ram, except: []string{id}})
}

func (t *Tree) checkResume(id string, ram int64) error {
	n, err := t.node(id)
	if err != nil {
		return err
	}
	if n.State != Suspended {
		return fmt.Errorf("%w: resume of %q: it is %s, not suspended", ErrState, id, n.State)
	}
	if err := checkSize("ram", ram); err != nil {
		return err
	}
	if d := t.ChainDepth(id); d < 0 || d > t.Budget.MaxChainDepth {
		return &OverBudgetError{Op: "resume", Node: id, Budget: "max_chain_depth", Need: int64(d), Limit: int64(t.Budget.MaxChainDepth)}
	}
	return nil
}

// PlanKeyframe plans writing disk bytes of keyframe for node id (a first keyframe or a
// refresh). Suspensions cannot make disk room, so it only ever fails or fits.
func (t *Tree) PlanKeyframe(id string, disk int64) (Plan, error) {
	return t.PlanKeyframeShared(id, disk, 0)
}

// PlanKeyframeShared is PlanKeyframe for a keyframe whose memory files also stay on
// tmpfs: sharedRAM bytes charged to the tree's RAM, made room for by eviction (node id
// itself is not evicted).
func (t *Tree) PlanKeyframeShared(id string, disk, sharedRAM int64) (Plan, error) {
	if _, err := t.node(id); err != nil {
		return Plan{}, err
	}
	if err := errors.Join(checkSize("keyframe disk", disk), checkSize("keyframe shared ram", sharedRAM)); err != nil {
		return Plan{}, err
	}
	return t.fit(demand{op: "keyframe", node: id, ram: sharedRAM, disk: disk, except: []string{id}})
}

// PlanEvict is proactive eviction: while the RAM charge is at or above EvictPercent of
// the budget, suspend the next least-recently-active evictable node, skipping one whose
// delta would overflow the disk budget. It never fails; a plan that cannot reach the
// threshold suspends every node it may.
func (t *Tree) PlanEvict() Plan {
	live, ram, disk := t.usage()
	thr := t.Budget.EvictThreshold()
	p := Plan{Suspend: []string{}}
	for _, id := range t.Evictable() {
		if ram.lt(thr) {
			break
		}
		n := t.Nodes[id]
		if disk.add(n.SuspendBytes).gt(t.Budget.MaxDiskBytes) {
			continue
		}
		p.Suspend = append(p.Suspend, id)
		ram, disk = ram.sub(n.RAMBytes), disk.add(n.SuspendBytes)
		live--
	}
	p.After = Usage{Live: live, RAMBytes: ram.int64(), DiskBytes: disk.int64()}
	return p
}

// ApplyAdd records new live nodes under parent ("" for the root of an empty tree) once
// the caller made them. Each node's ID, sizes and LastActive are taken; Parent and State
// are set. It refuses (tree unchanged) a duplicate or invalid node, or a batch over the
// live, RAM or disk budget.
func (t *Tree) ApplyAdd(parent string, nodes ...Node) error {
	if err := t.checkAdd(parent, len(nodes)); err != nil {
		return err
	}
	seen := map[string]bool{}
	var ram, disk wide
	for i := range nodes {
		n := &nodes[i]
		n.Parent, n.State = parent, Live
		if err := checkNode(n); err != nil {
			return err
		}
		if t.Nodes[n.ID] != nil || seen[n.ID] {
			return fmt.Errorf("%w: node %q already exists: give each new node a fresh id", ErrInvalid, n.ID)
		}
		seen[n.ID] = true
		ram = ram.add(n.RAMBytes).add(n.SharedRAMBytes)
		disk = disk.add(n.DiskBytes)
	}
	op := "fork"
	if parent == "" {
		op = "create"
	}
	if err := t.within(demand{op: op, node: parent, live: len(nodes), ram: ram.int64(), disk: disk.int64()}); err != nil {
		return err
	}
	if t.Nodes == nil {
		t.Nodes = map[string]*Node{}
	}
	for _, n := range nodes {
		nn := n
		t.Nodes[n.ID] = &nn
	}
	return nil
}

// within checks that the tree plus d fits without eviction, in the dimensions d grows.
func (t *Tree) within(d demand) error {
	u, b := t.Usage(), t.Budget
	var ram, disk wide
	ram, disk = ram.add(u.RAMBytes).add(d.ram), disk.add(u.DiskBytes).add(d.disk)
	switch {
	case d.live > 0 && u.Live+d.live > b.MaxLive:
		return &OverBudgetError{Op: d.op, Node: d.node, Budget: "max_live", Need: int64(d.live), Have: int64(u.Live), Limit: int64(b.MaxLive)}
	case d.ram > 0 && ram.gt(b.MaxRAMBytes):
		return &OverBudgetError{Op: d.op, Node: d.node, Budget: "max_ram_bytes", Need: d.ram, Have: u.RAMBytes, Limit: b.MaxRAMBytes}
	case d.disk > 0 && disk.gt(b.MaxDiskBytes):
		return &OverBudgetError{Op: d.op, Node: d.node, Budget: "max_disk_bytes", Need: d.disk, Have: u.DiskBytes, Limit: b.MaxDiskBytes}
	}
	return nil
}

// ApplySuspend records that live node id was suspended and its delta of deltaBytes
// written: its RAM charge goes, its disk grows, its SuspendBytes becomes 0. It refuses
// (tree unchanged) a delta that overflows the disk budget: the caller then discards the
// delta and thaws the node rather than ending it.
func (t *Tree) ApplySuspend(id string, deltaBytes int64) error {
	n, err := t.node(id)
	if err != nil {
		return err
	}
	if n.State != Live {
		return fmt.Errorf("%w: suspend of %q: it is %s, not live", ErrState, id, n.State)
	}
	if err := checkSize("delta", deltaBytes); err != nil {
		return err
	}
	if err := t.within(demand{op: "suspend", node: id, disk: deltaBytes}); err != nil {
		return err
	}
	var disk wide
	if disk = disk.add(n.DiskBytes).add(deltaBytes); disk.gt(MaxBytes) {
		return checkSize("node disk after the delta", disk.int64())
	}
	n.State, n.DiskBytes, n.SuspendBytes = Suspended, disk.int64(), 0
	return nil
}

// ApplyResume records that suspended node id is live again, charged ram, active at at.
// It refuses (tree unchanged) a node over the chain-depth bound or a resume over the
// live or RAM budget.
func (t *Tree) ApplyResume(id string, ram, at int64) error {
	if err := t.checkResume(id, ram); err != nil {
		return err
	}
	if err := t.within(demand{op: "resume", node: id, live: 1, ram: ram}); err != nil {
		return err
	}
	n := t.Nodes[id]
	n.State, n.RAMBytes, n.LastActive = Live, ram, max(n.LastActive, at)
	return nil
}

// ApplyKeyframe records that node id now owns a keyframe: disk more bytes on disk and
// sharedRAM more bytes of memory files on tmpfs (added: a refresh's old generation stays
// while forks map it; lower the charge with Measure once its files are gone). It refuses
// (tree unchanged) a keyframe over the disk or RAM budget.
func (t *Tree) ApplyKeyframe(id string, disk, sharedRAM int64) error {
	n, err := t.node(id)
	if err != nil {
		return err
	}
	if err := errors.Join(checkSize("keyframe disk", disk), checkSize("keyframe shared ram", sharedRAM)); err != nil {
		return err
	}
	if err := t.within(demand{op: "keyframe", node: id, ram: sharedRAM, disk: disk}); err != nil {
		return err
	}
	var nd, ns wide
	if nd = nd.add(n.DiskBytes).add(disk); nd.gt(MaxBytes) {
		return checkSize("node disk after the keyframe", nd.int64())
	}
	if ns = ns.add(n.SharedRAMBytes).add(sharedRAM); ns.gt(MaxBytes) {
		return checkSize("node shared ram after the keyframe", ns.int64())
	}
	n.Keyframe, n.DiskBytes, n.SharedRAMBytes = true, nd.int64(), ns.int64()
	return nil
}

// Measurement is what the caller measured of a node. A negative field is left as it was.
type Measurement struct {
	RAMBytes, SharedRAMBytes, DiskBytes, SuspendBytes int64
}

// Keep is the Measurement value that leaves a field unchanged.
const Keep int64 = -1

// Measure records measured charges of node id (the kernel's truth: no budget check; a
// tree that measures over budget is what PlanEvict is for).
func (t *Tree) Measure(id string, m Measurement) error {
	n, err := t.node(id)
	if err != nil {
		return err
	}
	c := *n
	for _, f := range []struct {
		dst *int64
		v   int64
	}{{&c.RAMBytes, m.RAMBytes}, {&c.SharedRAMBytes, m.SharedRAMBytes}, {&c.DiskBytes, m.DiskBytes}, {&c.SuspendBytes, m.SuspendBytes}} {
		if f.v >= 0 {
			*f.dst = f.v
		}
	}
	if err := checkNode(&c); err != nil {
		return err
	}
	*n = c
	return nil
}

// Touch records activity of node id at at (unix ns). LastActive never moves back.
func (t *Tree) Touch(id string, at int64) error {
	n, err := t.node(id)
	if err != nil {
		return err
	}
	n.LastActive = max(n.LastActive, at)
	return nil
}

// SetProtected protects (or unprotects) node id from eviction.
func (t *Tree) SetProtected(id string, on bool) error {
	n, err := t.node(id)
	if err != nil {
		return err
	}
	n.Protected = on
	return nil
}

// ApplyPrune removes node id and its whole subtree once the caller deleted them (see
// Subtree) and returns the IDs removed, leaves first. The only way nodes leave a tree.
func (t *Tree) ApplyPrune(id string) ([]string, error) {
	if _, err := t.node(id); err != nil {
		return nil, err
	}
	ids := t.Subtree(id)
	for _, r := range ids {
		delete(t.Nodes, r)
	}
	return ids, nil
}

func mulSat(n int, each int64) int64 {
	if n <= 0 || each <= 0 {
		return 0
	}
	if each > MaxBytes/int64(n) {
		return MaxBytes + 1 // over any budget, still far from overflow
	}
	return int64(n) * each
}

// ChangeError refuses a budget change the tree cannot be brought within by eviction:
// what stays charged after suspending every node eviction may take is over the new bound.
// Protected and Stuck name the live nodes that stop it (for max_disk_bytes: none; only
// prune frees disk).
type ChangeError struct {
	Budget string `json:"budget"` // max_live, max_ram_bytes or max_disk_bytes
	Have   int64  `json:"have"`   // what stays charged after every suspension eviction may make
	Limit  int64  `json:"limit"`  // the new bound
	// Protected are the live protected nodes; Stuck the live unprotected ones eviction may
	// not take (no keyframe within the new max_chain_depth, or a delta the disk budget
	// has no room for).
	Protected []string `json:"protected,omitempty"`
	Stuck     []string `json:"stuck,omitempty"`
}

func (e *ChangeError) Is(target error) bool { return target == ErrOverBudget }

func (e *ChangeError) Error() string {
	var who []string
	if len(e.Protected) > 0 {
		who = append(who, "protected "+strings.Join(e.Protected, ", "))
	}
	if len(e.Stuck) > 0 {
		who = append(who, "not evictable (unresumable or no disk for their delta) "+strings.Join(e.Stuck, ", "))
	}
	by := ""
	if len(who) > 0 {
		by = " (" + strings.Join(who, "; ") + ")"
	}
	switch e.Budget {
	case "max_live":
		return fmt.Sprintf("budget max_live %d is below the %d nodes that stay live after suspending every node eviction may take%s: unprotect, suspend or prune them, or raise max_live",
			e.Limit, e.Have, by)
	case "max_ram_bytes":
		if by == "" {
			return fmt.Sprintf("budget max_ram_bytes %s is below the %s that stays charged after suspending every node eviction may take (the keyframes' memory files on tmpfs, which stay while any node needs them): prune nodes, or raise max_ram_bytes",
				Bytes(e.Limit), Bytes(e.Have))
		}
		return fmt.Sprintf("budget max_ram_bytes %s is below the %s that stays charged after suspending every node eviction may take%s: unprotect, suspend or prune them, or raise max_ram_bytes",
			Bytes(e.Limit), Bytes(e.Have), by)
	}
	return fmt.Sprintf("budget max_disk_bytes %s is below the %s the tree holds on disk: prune nodes (eviction writes disk, only prune frees it), or raise max_disk_bytes",
		Bytes(e.Limit), Bytes(e.Have))
}

// PlanBudget plans changing the tree's budget to nb: the fewest least-recently-active
// nodes to suspend (evictable under nb: its chain depth decides what stays resumable, and
// a node whose delta would overflow nb's disk bound is skipped) after which the tree's
// live count and RAM are within nb. It refuses with a *ChangeError, naming the nodes that
// stop it, a budget the tree cannot be brought within, and a disk bound below what the
// tree already holds. The caller suspends the plan's nodes with nb in force (their deltas
// fit its disk bound, not necessarily the old one's), then ApplyBudget(nb).
func (t *Tree) PlanBudget(nb Budget) (Plan, error) {
	if err := nb.Validate(); err != nil {
		return Plan{}, err
	}
	c := t.Clone()
	c.Budget = nb
	live, ram, disk := c.usage()
	if disk.gt(nb.MaxDiskBytes) {
		return Plan{}, &ChangeError{Budget: "max_disk_bytes", Have: disk.int64(), Limit: nb.MaxDiskBytes}
	}
	p := Plan{Suspend: []string{}}
	cand := c.Evictable()
	var stuck []string
	for _, id := range cand {
		if live <= nb.MaxLive && !ram.gt(nb.MaxRAMBytes) {
			break
		}
		n := c.Nodes[id]
		if disk.add(n.SuspendBytes).gt(nb.MaxDiskBytes) {
			stuck = append(stuck, id)
			continue
		}
		p.Suspend = append(p.Suspend, id)
		live, ram, disk = live-1, ram.sub(n.RAMBytes), disk.add(n.SuspendBytes)
	}
	if live > nb.MaxLive || ram.gt(nb.MaxRAMBytes) {
		e := &ChangeError{Budget: "max_live", Have: int64(live), Limit: int64(nb.MaxLive)}
		if live <= nb.MaxLive {
			e.Budget, e.Have, e.Limit = "max_ram_bytes", ram.int64(), nb.MaxRAMBytes
		}
		for _, id := range c.ids() {
			n := c.Nodes[id]
			switch {
			case n.State != Live:
			case n.Protected:
				e.Protected = append(e.Protected, id)
			case !slices.Contains(cand, id):
				stuck = append(stuck, id)
			}
		}
		slices.Sort(stuck)
		e.Stuck = stuck
		return Plan{}, e
	}
	p.After = Usage{Live: live, RAMBytes: ram.int64(), DiskBytes: disk.int64()}
	return p, nil
}

// ApplyBudget sets the budget to nb once PlanBudget's suspensions were applied. It
// refuses (tree unchanged) a budget the tree is not within.
func (t *Tree) ApplyBudget(nb Budget) error {
	if err := nb.Validate(); err != nil {
		return err
	}
	if u := t.Usage(); !nb.Within(u) {
		p, err := t.PlanBudget(nb)
		if err == nil {
			err = fmt.Errorf("%w: budget %+v: the tree uses %+v: suspend %v first (PlanBudget)", ErrOverBudget, nb, u, p.Suspend)
		}
		return err
	}
	t.Budget = nb
	return nil
}
