package snaptree

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/lazyfork/lazyfork/lib/budget"
	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/guard"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/runtime"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/tree"
)

// PidsPerLive is the tree cgroup's pids limit per live member of the budget.
const PidsPerLive = 1024

// CgroupHeadroom is added to the RAM budget for the tree cgroup's hard memory limit: the
// budget is kept by eviction (at 85%); the kernel limit is the backstop, with room for
// CRIU, which restores each member from inside its group.
const CgroupHeadroom = 256 << 20

// Event is one mutation of a tree, for watchers (Manager.OnEvent).
type Event struct {
	Kind  string   `json:"kind"` // create, adopt, fork, prepare, rollback, suspend, resume, protect, unprotect, prune, evict, drop
	Tree  string   `json:"tree"`
	Node  string   `json:"node,omitempty"`
	Nodes []string `json:"nodes,omitempty"` // forks made, nodes pruned or suspended
	// LatencyNs is how long the operation took.
	LatencyNs int64     `json:"latency_ns"`
	Time      time.Time `json:"time"`
}

// Manager runs tree operations on a runtime. Its methods are safe to call from several
// goroutines and processes: each holds the tree's lock for its whole run.
type Manager struct {
	RT *runtime.Runtime
	// OnEvent, if set, is called after each mutation (including every eviction it
	// caused), with the tree lock released.
	OnEvent func(Event)
}

func (m *Manager) emit(evs []Event) {
	if m.OnEvent == nil {
		return
	}
	for _, e := range evs {
		m.OnEvent(e)
	}
}

// op is one operation on a locked tree, its events queued for after the unlock.
type op struct {
	m     *Manager
	t     *Tree
	trt   *runtime.Runtime // the runtime whose new cgroups go inside the tree's
	ctx   context.Context
	start time.Time
	evs   []Event
	// locks are the containers' own locks (lib/guard) this operation holds.
	locks map[string]func()
}

// lock takes container id's lock (lib/guard: the porcelain, daemon and stages take the
// same) for the rest of the operation, once, and returns the record read under it.
func (o *op) lock(id string) (*tree.Container, error) {
	if o.locks == nil {
		o.locks = map[string]func(){}
	}
	if _, ok := o.locks[id]; ok {
		return o.m.RT.Tree.Get(id)
	}
	c, unlock, err := guard.Lock(o.ctx, o.m.RT.Tree, id, 0)
	if err != nil {
		return nil, err
	}
	o.locks[id] = unlock
	return c, nil
}

func (o *op) unlockAll() {
	for _, u := range o.locks {
		u()
	}
	o.locks = nil
}

func (o *op) event(kind, node string, nodes ...string) {
	o.evs = append(o.evs, Event{Kind: kind, Tree: o.t.ID, Node: node, Nodes: nodes,
		LatencyNs: time.Since(o.start).Nanoseconds(), Time: time.Now().UTC()})
	o.start = time.Now()
}

// with runs f on tree ref, locked, and saves the tree after it (also on error: what
// was done is recorded).
func (m *Manager) with(ctx context.Context, ref string, f func(o *op) error) (*Tree, error) {
	return m.withDropped(ctx, ref, false, f)
}

// withDropped is with that also runs f on a dropped tree when allowed (prune).
func (m *Manager) withDropped(ctx context.Context, ref string, allowDropped bool, f func(o *op) error) (*Tree, error) {
	id, err := m.resolveID(ref)
	if err != nil {
		return nil, err
	}
	unlock, err := lockTree(id, false)
	if err != nil {
		return nil, err
	}
	t, err := readTree(id)
	if err != nil {
		unlock()
		return nil, err
	}
	if t.Dropped && !allowDropped {
		unlock()
		return nil, fmt.Errorf("%w: %s; its state is kept in %s (prune its root to delete it)", ErrDropped, t.ID, t.Dir())
	}
	o := &op{m: m, t: t, ctx: ctx, start: time.Now()}
	if err := o.ensureCgroup(); err != nil {
		unlock()
		return nil, err
	}
	t.refresh(m.RT)
	ferr := f(o)
	o.unlockAll()
	if _, err := os.Stat(t.Dir()); err == nil { // a pruned root takes the directory
		t.refresh(m.RT)
		if err := t.save(); err != nil {
			ferr = errors.Join(ferr, err)
		}
	}
	unlock()
	m.emit(o.evs)
	return t, ferr
}

// ensureCgroup makes sure the tree cgroup exists (a reboot or power cut removes it) with
// the budget's limits, and points new members' groups inside it.
func (o *op) ensureCgroup() error {
	t := o.t
	cg, err := cgroup.LoadOwned(t.Cgroup)
	if err != nil {
		cg, err = cgroup.Create("tree-"+t.ID[1:], cgroup.ParentOf(t.Cgroup))
		if err != nil {
			return fmt.Errorf("tree %s: cgroup: %w", t.ID, err)
		}
	}
	if err := cg.SetLimits(limits(t.Budget)); err != nil {
		return fmt.Errorf("tree %s: %w", t.ID, err)
	}
	trt := *o.m.RT
	trt.CgroupParent = cgroup.ParentFor(cg)
	o.trt = &trt
	return nil
}

func limits(b Budget) cgroup.Limits {
	return cgroup.Limits{Memory: b.MaxRAMBytes + CgroupHeadroom, Pids: int64(b.MaxLive) * PidsPerLive}
}

// Read reads tree ref (id, unique id prefix or name) as written by its last operation,
// without locking or measuring it (lf-tree).
func Read(ref string) (*Tree, error) {
	id, err := (&Manager{}).resolveID(ref)
	if err != nil {
		return nil, err
	}
	return readTree(id)
}

// resolveID finds a tree by id, unique id prefix or name.
func (m *Manager) resolveID(ref string) (string, error) {
	if treeIDRe.MatchString(ref) {
		if _, err := os.Stat(TreeDir(ref)); err == nil {
			return ref, nil
		}
	}
	all, err := m.List()
	if err != nil {
		return "", err
	}
	var hits []string
	for _, t := range all {
		if t.Name == ref && ref != "" {
			return t.ID, nil
		}
		if len(ref) >= 2 && len(ref) <= len(t.ID) && t.ID[:len(ref)] == ref {
			hits = append(hits, t.ID)
		}
	}
	if len(hits) == 1 {
		return hits[0], nil
	}
	if len(hits) > 1 {
		return "", fmt.Errorf("tree %q is ambiguous (%v): give more of the id", ref, hits)
	}
	return "", fmt.Errorf("%w %q (see: lazyfork tree ls)", ErrNoTree, ref)
}

// List reads every tree, oldest first (figures as of their last operation).
func (m *Manager) List() ([]*Tree, error) { return ReadAll() }

// ReadAll reads every tree, oldest first, as written by its last operation.
func ReadAll() ([]*Tree, error) {
	ents, err := os.ReadDir(TreesDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list trees: %w", err)
	}
	var out []*Tree
	for _, e := range ents {
		if !treeIDRe.MatchString(e.Name()) {
			continue
		}
		t, err := readTree(e.Name())
		if err != nil {
			if errors.Is(err, ErrNoTree) {
				continue // being created or removed
			}
			return nil, err
		}
		out = append(out, t)
	}
	sortTrees(out)
	return out, nil
}

// Get reads one tree with its live figures measured now (last-active included).
func (m *Manager) Get(ctx context.Context, ref string) (*Tree, error) {
	id, err := m.resolveID(ref)
	if err != nil {
		return nil, err
	}
	t, err := readTree(id)
	if err != nil {
		return nil, err
	}
	if t.Dropped {
		return t, nil
	}
	return m.with(ctx, id, func(*op) error { return nil })
}

// node resolves a node reference (container id, name or id prefix) within the tree.
func (o *op) node(ref string) (*Node, *tree.Container, error) {
	if ref == "" {
		ref = o.t.Root
	}
	var c *tree.Container
	var err error
	if n := o.t.Nodes[ref]; n != nil {
		c, err = o.m.RT.Tree.Get(ref)
	} else {
		c, err = o.m.RT.Tree.Resolve(ref)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tree %s: node %q: %w", o.t.ID, ref, err)
	}
	n := o.t.Nodes[c.ID]
	if n == nil {
		return nil, nil, fmt.Errorf("tree %s: %s: %w (see: lazyfork tree nodes %s)", o.t.ID, ref, ErrNotMember, o.t.ID)
	}
	if c, err = o.lock(c.ID); err != nil {
		return nil, nil, err
	}
	return n, c, nil
}

// CreateOptions make a tree.
type CreateOptions struct {
	Name   string  // optional tree name
	Budget *Budget // nil: DefaultBudget
	KSM    bool    // opt-in KSM for the tree's memory (recorded; same-tenant only)
	Label  string  // the root node's label
	// Container is the root container to create (Create only).
	Container runtime.CreateOptions
}

// Create makes a tree rooted at a new container created from an image, inside the tree
// cgroup, and writes the root's keyframe at once. On failure nothing remains.
func (m *Manager) Create(ctx context.Context, o CreateOptions) (*Tree, error) {
	return m.create(ctx, o, "")
}

// Adopt makes a tree rooted at existing running container ref: it is moved onto its
// keyframe (lib/fork.Prepare), which puts it in the tree cgroup. A container that
// already belongs to a tree is refused.
func (m *Manager) Adopt(ctx context.Context, ref string, o CreateOptions) (*Tree, error) {
	c, err := m.RT.Tree.Resolve(ref)
	if err != nil {
		return nil, err
	}
	if st := m.RT.State(c); st != tree.StateRunning {
		return nil, fmt.Errorf("adopt %s: it is %s; only a running container can root a tree", ref, st)
	}
	if t, err := m.treeOf(c.ID); err != nil {
		return nil, err
	} else if t != "" {
		return nil, fmt.Errorf("adopt %s: it is already a node of tree %s", ref, t)
	}
	return m.create(ctx, o, c.ID)
}

// treeOf is the tree container id belongs to ("" if none).
func (m *Manager) treeOf(id string) (string, error) {
	all, err := m.List()
	if err != nil {
		return "", err
	}
	for _, t := range all {
		if t.Nodes[id] != nil && !t.Dropped {
			return t.ID, nil
		}
	}
	return "", nil
}

func (m *Manager) create(ctx context.Context, o CreateOptions, adopt string) (_ *Tree, retErr error) {
	b := DefaultBudget()
	if o.Budget != nil {
		b = *o.Budget
	}
	if err := b.Validate(); err != nil {
		return nil, fmt.Errorf("tree budget: %w", err)
	}
	if o.Name != "" {
		if err := tree.ValidateName(o.Name); err != nil {
			return nil, fmt.Errorf("tree name: %w", err)
		}
		if all, err := m.List(); err != nil {
			return nil, err
		} else {
			for _, t := range all {
				if t.Name == o.Name {
					return nil, fmt.Errorf("tree name %q is tree %s: pick another name or prune it", o.Name, t.ID)
				}
			}
		}
	}
	id := newTreeID()
	unlock, err := lockTree(id, true)
	if err != nil {
		return nil, err
	}
	defer unlock()
	t := &Tree{Kind: Kind, Version: Version, ID: id, Name: o.Name, Budget: b, KSM: o.KSM,
		Created: time.Now().UTC(), Nodes: map[string]*Node{}}
	cg, err := cgroup.Create("tree-"+id[1:], m.RT.CgroupParent)
	if err != nil {
		_ = fsutil.RemoveAll(t.Dir())
		return nil, fmt.Errorf("create tree: %w", err)
	}
	t.Cgroup = cg.Paths
	var c *tree.Container
	defer func() {
		if retErr != nil {
			if c != nil && adopt == "" {
				_ = m.RT.Delete(c)
			}
			_ = cg.Remove()
			_ = fsutil.RemoveAll(t.Dir())
		}
	}()
	op := &op{m: m, t: t, ctx: ctx, start: time.Now()}
	if err := op.ensureCgroup(); err != nil {
		return nil, err
	}
	kind := "create"
	if adopt != "" {
		kind = "adopt"
		if c, err = m.RT.Tree.Get(adopt); err != nil {
			return nil, err
		}
	} else if c, err = op.trt.Create(ctx, o.Container); err != nil {
		return nil, err
	}
	k, err := fork.Prepare(ctx, op.trt, c, fork.PrepareOptions{})
	if err != nil {
		return nil, fmt.Errorf("tree root keyframe: %w", err)
	}
	now := time.Now().UTC()
	n := &Node{ID: c.ID, Name: c.Name, State: StateLive, Label: o.Label, Kind: NodeKind, Members: 1,
		Created: now, LastActive: now}
	n.setKeyframe(k)
	t.Root = c.ID
	t.Nodes[c.ID] = n
	t.refresh(m.RT)
	if err := t.save(); err != nil {
		return nil, err
	}
	op.event(kind, c.ID)
	m.emit(op.evs)
	return t, nil
}

func (n *Node) setKeyframe(k *stage.Snapshot) {
	n.HasKeyframe, n.Keyframe = true, k.ID
	n.Generation++
	n.DirtyPages = int64(k.Dump.PagesWritten)
	// Physical bytes, as written: the memory files named after it and its image.
	n.KeyframeBytes = keyframeTmpfsBytes(k.Family, k.ID) + diskBytes(k.ImagesDir)
}

// ForkOptions tune a fork batch.
type ForkOptions struct {
	N      int
	Names  []string // optional container names, one per fork
	Labels []string // optional node labels, one per fork
}

// Fork makes o.N forks of node (a batch shares one dump) and returns their nodes. A live
// node without a keyframe gets one first (its first fork moves it onto its snapshot); a
// suspended node's forks are restored straight from its packed snapshot, and it stays
// suspended. The budget is checked first: least-recently-active unprotected nodes are
// suspended to make room, and a batch that cannot fit fails, changing nothing.
func (m *Manager) Fork(ctx context.Context, treeRef, node string, o ForkOptions) ([]*Node, *Tree, error) {
	var out []*Node
	t, err := m.with(ctx, treeRef, func(op *op) error {
		var err error
		out, err = op.fork(node, o)
		return err
	})
	return out, t, err
}

func (o *op) fork(ref string, fo ForkOptions) ([]*Node, error) {
	if fo.N <= 0 {
		return nil, errors.New("fork: -n must be at least 1")
	}
	if len(fo.Labels) > fo.N {
		return nil, fmt.Errorf("fork: %d labels for %d forks", len(fo.Labels), fo.N)
	}
	n, c, err := o.node(ref)
	if err != nil {
		return nil, err
	}
	if n.State == StateExited {
		return nil, fmt.Errorf("fork %s: its processes are gone (killed or power cut) and it was not suspended; prune it", n.ID)
	}
	if err := o.makeRoom(n.ID, fo.N, o.estimate(n)); err != nil {
		return nil, err
	}
	var forks []stage.Fork
	var dirty int64
	ro := fork.RestoreOptions{N: fo.N, Names: fo.Names}
	switch {
	case n.State == StateSuspended:
		p := n.packed(RoleSuspend)
		if p == nil {
			return nil, fmt.Errorf("fork %s: suspended with no packed snapshot in tree.json", n.ID)
		}
		s, err := o.t.unpack(o.ctx, *p)
		if err != nil {
			return nil, err
		}
		forks, err = fork.Restore(o.ctx, o.trt, s, ro)
		// The packed copy stays on disk; the tmpfs copy is not needed after the restore.
		_ = fork.RemoveSnapshot(s)
		if err != nil {
			return nil, err
		}
		dirty = int64(s.Dump.PagesWritten)
		// Its forks map that snapshot's memory files: it is the node's keyframe now.
		if n.Keyframe != s.ID {
			n.HasKeyframe, n.Keyframe = true, s.ID
			n.Generation++
		}
	case !n.HasKeyframe:
		k, err := fork.Prepare(o.ctx, o.trt, c, fork.PrepareOptions{})
		if err != nil {
			return nil, err
		}
		n.setKeyframe(k)
		o.event("prepare", n.ID)
		if forks, err = fork.Restore(o.ctx, o.trt, k, ro); err != nil {
			return nil, err
		}
	default:
		var s *stage.Snapshot
		forks, s, err = fork.Fork(o.ctx, o.trt, c, fork.Options{RestoreOptions: ro})
		if err != nil {
			return nil, err
		}
		if s != nil {
			dirty = int64(s.Dump.PagesWritten)
		}
	}
	now := time.Now().UTC()
	n.LastActive = now
	var out []*Node
	var ids []string
	for i, f := range forks {
		k := &Node{ID: f.ID, Name: f.Name, Parent: n.ID, State: StateLive, Kind: NodeKind, Members: 1,
			DirtyPages: dirty, Created: now, LastActive: now}
		if i < len(fo.Labels) {
			k.Label = fo.Labels[i]
		}
		o.t.Nodes[f.ID] = k
		out = append(out, k)
		ids = append(ids, f.ID)
	}
	o.event("fork", n.ID, ids...)
	o.t.refresh(o.m.RT)
	return out, o.autoEvict()
}

// estimate is the RAM a fork of n is expected to take: n's own charge (a fork starts
// with none of n's private pages, so this is the bound once it has dirtied as much).
func (o *op) estimate(n *Node) int64 {
	return max(n.RAMBytes, 1)
}

// makeRoom executes lib/budget's plan for adding n forks of parent: the nodes it names
// are suspended first. An OverBudgetError is returned as it is, before anything changed.
func (o *op) makeRoom(parent string, n int, ramEach int64) error {
	plan, err := o.t.budgetTree().PlanAdd(parent, n, ramEach, 0)
	if err != nil {
		return overBudget(err)
	}
	return o.execute(plan, "evict")
}

func (o *op) execute(plan budget.Plan, kind string) error {
	var done []string
	for _, id := range plan.Suspend {
		if err := o.suspend(id); err != nil {
			return fmt.Errorf("make room: suspend %s: %w", id, err)
		}
		done = append(done, id)
	}
	if len(done) > 0 {
		o.event(kind, "", done...)
	}
	return nil
}

// autoEvict suspends what lib/budget's PlanEvict names (the tree at 85% of its RAM
// budget or more).
func (o *op) autoEvict() error {
	o.t.refresh(o.m.RT)
	return o.execute(o.t.budgetTree().PlanEvict(), "evict")
}

// overBudget passes lib/budget's refusal on: its *OverBudgetError is one line naming
// the operation, the budget, the figures and the fix.
func overBudget(err error) error { return err }

// OverBudgetError is lib/budget's: an operation that cannot fit even after eviction.
type OverBudgetError = budget.OverBudgetError

// Prepare writes node's keyframe now (idempotent: a node that has one is left as it
// is); refresh writes a new generation for a node that has one. The old generation's
// files stay while anything maps them.
func (m *Manager) Prepare(ctx context.Context, treeRef, node string, refresh bool) (*Node, *Tree, error) {
	var out *Node
	t, err := m.with(ctx, treeRef, func(o *op) error {
		n, c, err := o.node(node)
		if err != nil {
			return err
		}
		out = n
		if n.HasKeyframe && !refresh {
			return nil
		}
		if n.State != StateLive {
			return fmt.Errorf("prepare %s: it is %s; resume it first", n.ID, n.State)
		}
		old := n.Keyframe
		k, err := fork.Prepare(ctx, o.trt, c, fork.PrepareOptions{})
		if err != nil {
			return err
		}
		n.setKeyframe(k)
		n.LastActive = time.Now().UTC()
		if old != "" {
			// The old generation's snapshot goes; its memory files stay while mapped.
			if s, err := fork.LoadSnapshot(old); err == nil {
				_ = fork.RemoveSnapshot(s)
			}
			_ = o.t.dropPacked(n, old)
		}
		o.event("prepare", n.ID)
		return o.autoEvict()
	})
	return out, t, err
}

// Rollback makes a new branch: one new child of node restored from node's keyframe (its
// state when the keyframe was written), or from its suspended state when it has none.
// Node and its other children are left as they are.
func (m *Manager) Rollback(ctx context.Context, treeRef, node, name, label string) (*Node, *Tree, error) {
	var out *Node
	t, err := m.with(ctx, treeRef, func(o *op) error {
		n, _, err := o.node(node)
		if err != nil {
			return err
		}
		var s *stage.Snapshot
		switch {
		case n.HasKeyframe:
			if s, err = o.keyframe(n); err != nil {
				return err
			}
		case n.packed(RoleSuspend) != nil:
			if s, err = o.t.unpack(ctx, *n.packed(RoleSuspend)); err != nil {
				return err
			}
			defer fork.RemoveSnapshot(s)
		default:
			return fmt.Errorf("rollback %s: it has no keyframe and is not suspended: nothing earlier to branch from (prepare it first)", n.ID)
		}
		if err := o.makeRoom(n.ID, 1, o.estimate(n)); err != nil {
			return err
		}
		var names []string
		if name != "" {
			names = []string{name}
		}
		forks, err := fork.Restore(ctx, o.trt, s, fork.RestoreOptions{N: 1, Names: names})
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		out = &Node{ID: forks[0].ID, Name: forks[0].Name, Parent: n.ID, State: StateLive, Label: label, Kind: NodeKind,
			Members: 1, Created: now, LastActive: now, From: s.ID}
		o.t.Nodes[out.ID] = out
		o.event("rollback", n.ID, out.ID)
		return o.autoEvict()
	})
	return out, t, err
}

// keyframe is n's keyframe snapshot on tmpfs, unpacked from disk if it was packed.
func (o *op) keyframe(n *Node) (*stage.Snapshot, error) {
	if s, err := fork.LoadSnapshot(n.Keyframe); err == nil {
		return s, nil
	}
	for _, p := range n.Packed {
		if p.Snapshot == n.Keyframe {
			return o.t.unpack(o.ctx, p)
		}
	}
	return nil, fmt.Errorf("node %s: its keyframe %s is neither on tmpfs nor packed (lost in a power cut while live)", n.ID, n.Keyframe)
}

// Suspend stops node into a snapshot, packs it (and its keyframe) to disk with every
// memory file it needs, and deletes from tmpfs what nothing else needs: its RAM is freed.
func (m *Manager) Suspend(ctx context.Context, treeRef, node string) (*Node, *Tree, error) {
	var out *Node
	t, err := m.with(ctx, treeRef, func(o *op) error {
		n, _, err := o.node(node)
		if err != nil {
			return err
		}
		out = n
		if n.State == StateSuspended {
			return nil
		}
		if err := o.suspend(n.ID); err != nil {
			return err
		}
		o.event("suspend", n.ID)
		return nil
	})
	return out, t, err
}

func (o *op) suspend(id string) error {
	n := o.t.Nodes[id]
	c, err := o.lock(id)
	if err != nil {
		return err
	}
	if n.State != StateLive {
		return fmt.Errorf("suspend %s: it is %s", id, n.State)
	}
	ram := n.RAMBytes
	// Disk headroom for what is about to be written (its RAM and family at most).
	if plan, err := o.t.budgetTree().PlanKeyframe(id, ram); err != nil {
		return overBudget(err)
	} else if len(plan.Suspend) > 0 {
		if err := o.execute(plan, "evict"); err != nil {
			return err
		}
	}
	s, err := fork.Stop(o.ctx, o.trt, c, hook.Options{})
	if err != nil {
		return err
	}
	n.State = StateSuspended
	p, err := o.t.pack(n, s, RoleSuspend)
	if err != nil {
		// Not packed: the snapshot stays on tmpfs, where lazyfork start still finds it.
		n.State = StateExited
		return err
	}
	_ = o.t.dropPacked(n, s.ID)
	n.Packed = append(n.Packed, p)
	n.DirtyPages = int64(s.Dump.PagesWritten)
	n.DeltaBytes = p.Bytes
	n.RAMBytes = ram
	// The keyframe goes to disk too: on tmpfs it would keep its files in RAM.
	if n.HasKeyframe {
		if k, err := fork.LoadSnapshot(n.Keyframe); err == nil {
			if kp, err := o.t.pack(n, k, RoleKeyframe); err == nil {
				_ = o.t.dropPacked(n, k.ID)
				n.Packed = append(n.Packed, kp)
				_ = fork.RemoveSnapshot(k)
			}
		}
	}
	// tree.json names the packed copy before the tmpfs one goes (a crash in between
	// leaves both).
	if err := o.t.save(); err != nil {
		return err
	}
	if err := fork.RemoveSnapshot(s); err != nil {
		return err
	}
	_, err = FreeFamily(o.ctx, o.m.RT, s.Family)
	return err
}

// Resume restores a suspended node in place (same id and name) from its packed
// snapshot, applying its whole delta, after the budget check (chain depth included).
func (m *Manager) Resume(ctx context.Context, treeRef, node string) (*Node, *Tree, error) {
	var out *Node
	t, err := m.with(ctx, treeRef, func(o *op) error {
		n, c, err := o.node(node)
		if err != nil {
			return err
		}
		out = n
		if n.State == StateLive {
			return nil
		}
		p := n.packed(RoleSuspend)
		var s *stage.Snapshot
		if p == nil {
			// Stopped but not packed (`lazyfork stop`, or a suspend whose process died
			// before packing): its snapshot on tmpfs restarts it.
			if c.State == tree.StateStopped {
				s, _ = fork.LoadSnapshot(c.Snapshot)
			}
			if s == nil {
				return fmt.Errorf("resume %s: it is %s and has no snapshot to resume from (prune it)", n.ID, n.State)
			}
		}
		plan, err := o.t.budgetTree().PlanResume(n.ID, n.RAMBytes)
		if err != nil {
			return overBudget(err)
		}
		if err := o.execute(plan, "evict"); err != nil {
			return err
		}
		if p != nil {
			if s, err = o.t.unpack(ctx, *p); err != nil {
				return err
			}
		}
		if c.Snapshot != s.ID || c.State != tree.StateStopped {
			return fmt.Errorf("resume %s: its record is %s on snapshot %q, not the packed %s", n.ID, c.State, c.Snapshot, s.ID)
		}
		if err := fork.Start(ctx, o.trt, c); err != nil {
			return err
		}
		n.State, n.LastActive = StateLive, time.Now().UTC()
		if s.ID == n.Keyframe && p != nil {
			// Forks were made from the suspended state: it stays on disk as the keyframe.
			p.Role = RoleKeyframe
		} else if err := o.t.dropPacked(n, s.ID); err != nil {
			return err
		}
		n.DeltaBytes = 0
		if err := o.t.sweepStore(); err != nil {
			return err
		}
		o.event("resume", n.ID)
		return o.autoEvict()
	})
	return out, t, err
}

// Protect sets (or clears) node's protection from eviction.
func (m *Manager) Protect(ctx context.Context, treeRef, node string, on bool) (*Node, *Tree, error) {
	var out *Node
	t, err := m.with(ctx, treeRef, func(o *op) error {
		n, _, err := o.node(node)
		if err != nil {
			return err
		}
		out = n
		n.Protected = on
		kind := "protect"
		if !on {
			kind = "unprotect"
		}
		o.event(kind, n.ID)
		return nil
	})
	return out, t, err
}

// PruneResult says what a prune removed.
type PruneResult struct {
	Pruned []string `json:"pruned"`
	// TreeRemoved: the root was pruned, and with it the tree.
	TreeRemoved bool `json:"tree_removed"`
	// Freed bytes on tmpfs (memory files) and on disk (packed snapshots and files).
	TmpfsFreed int64 `json:"tmpfs_freed"`
	DiskFreed  int64 `json:"disk_freed"`
}

// Prune deletes node and its whole subtree: processes, records, snapshots, packed state,
// memory files and layers nothing else needs (a file a live node outside the subtree maps
// stays). Pruning the root removes the tree, a dropped one too.
func (m *Manager) Prune(ctx context.Context, treeRef, node string) (*PruneResult, *Tree, error) {
	res := &PruneResult{}
	t, err := m.withDropped(ctx, treeRef, true, func(o *op) error {
		n, _, err := o.node(node)
		if err != nil {
			return err
		}
		fams := o.t.families(o.m.RT)
		tmpfsBefore, diskBefore := o.t.tmpfsBytes(o.m.RT), diskBytes(o.t.Dir())
		var errs []error
		for _, id := range o.t.Subtree(n.ID) {
			if c, err := o.lock(id); err == nil {
				if err := o.m.RT.Delete(c); err != nil {
					errs = append(errs, err)
					continue
				}
			}
			for _, p := range o.t.Nodes[id].Packed {
				errs = append(errs, fsutil.RemoveAll(p.Dir))
			}
			errs = append(errs, fsutil.RemoveAll(TreeDirNode(o.t.ID, id)))
			if u := o.locks[id]; u != nil {
				u()
				delete(o.locks, id)
			}
			delete(o.t.Nodes, id)
			res.Pruned = append(res.Pruned, id)
		}
		errs = append(errs, o.t.sweepStore())
		// Snapshots, families and layers whose last reference went (lib/fork's GC), then
		// the memory files of the remaining families that nothing maps or needs.
		errs = append(errs, fork.GC(o.m.RT))
		for _, f := range fams {
			_, err := FreeFamily(ctx, o.m.RT, f)
			errs = append(errs, err)
		}
		if n.ID == o.t.Root {
			if cg, err := cgroup.LoadOwned(o.t.Cgroup); err == nil {
				errs = append(errs, cg.Kill(), cg.Remove())
			}
			errs = append(errs, fsutil.RemoveAll(o.t.Dir()))
			res.TreeRemoved = true
		}
		res.TmpfsFreed = tmpfsBefore - o.t.tmpfsBytes(o.m.RT)
		res.DiskFreed = diskBefore - diskBytes(o.t.Dir())
		o.event("prune", n.ID, res.Pruned...)
		return errors.Join(errs...)
	})
	return res, t, err
}

// TreeDirNode is a node's directory of packed snapshots.
func TreeDirNode(treeID, node string) string {
	return TreeDir(treeID) + "/nodes/" + node
}

// DropResult says what a drop did and where the state is.
type DropResult struct {
	Suspended []string `json:"suspended"`
	Dir       string   `json:"dir"` // where the tree's state stays on disk
}

// Drop forgets the tree: live members are suspended (stopped, their state packed to
// disk), the tree cgroup is removed, and tree.json is marked dropped. Everything on disk
// stays in Dir; the containers stay as stopped records.
func (m *Manager) Drop(ctx context.Context, treeRef string) (*DropResult, *Tree, error) {
	res := &DropResult{}
	t, err := m.with(ctx, treeRef, func(o *op) error {
		res.Dir = o.t.Dir()
		for _, n := range o.t.NodeList() {
			if n.State != StateLive {
				continue
			}
			if err := o.suspend(n.ID); err != nil {
				return err
			}
			res.Suspended = append(res.Suspended, n.ID)
		}
		if cg, err := cgroup.LoadOwned(o.t.Cgroup); err == nil {
			if err := cg.Remove(); err != nil {
				return err
			}
		}
		o.t.Dropped = true
		o.event("drop", "", res.Suspended...)
		return nil
	})
	return res, t, err
}

// Evict runs lib/budget's eviction now and returns the nodes it suspended.
func (m *Manager) Evict(ctx context.Context, treeRef string) ([]string, *Tree, error) {
	var out []string
	t, err := m.with(ctx, treeRef, func(o *op) error {
		plan := o.t.budgetTree().PlanEvict()
		out = plan.Suspend
		return o.execute(plan, "evict")
	})
	return out, t, err
}

// SetBudget replaces the tree's budget (and the tree cgroup's limits), then evicts what
// the new budget asks for.
func (m *Manager) SetBudget(ctx context.Context, treeRef string, b Budget) (*Tree, error) {
	if err := b.Validate(); err != nil {
		return nil, fmt.Errorf("tree budget: %w", err)
	}
	return m.with(ctx, treeRef, func(o *op) error {
		o.t.Budget = b
		o.event("budget", "")
		// Evicted first: a lower memory limit than the group's charge would fail.
		if err := o.autoEvict(); err != nil {
			return err
		}
		return o.ensureCgroup()
	})
}
