package snaptree

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/guard"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/treedoc"
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
	RT *container.Runtime
	// OnEvent, if set, is called after each mutation (including every eviction it
	// caused), with the tree lock released.
	OnEvent func(Event)
	// OnDoc, if set, sees tree id's document under the tree's lock: as read at the start
	// of an operation (saved false: what the last operation, maybe another process's,
	// left) and as saved (saved true; t nil: the tree was removed). It must not keep t.
	// lib/daemon diffs these to stream mutations other processes make.
	OnDoc func(id string, t *Tree, saved bool)
}

func (m *Manager) doc(id string, t *Tree, saved bool) {
	if m.OnDoc != nil {
		m.OnDoc(id, t, saved)
	}
}

// save writes tree.json and shows it to OnDoc.
func (o *op) save() error {
	if err := o.t.Save(); err != nil {
		return err
	}
	o.m.doc(o.t.ID, o.t, true)
	return nil
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
	trt   *container.Runtime // the runtime whose new cgroups go inside the tree's
	ctx   context.Context
	start time.Time
	evs   []Event
	// locks are the containers' own locks (lib/guard) this operation holds.
	locks map[string]func()
}

// lock takes container id's lock (lib/guard: the porcelain, daemon and stages take the
// same) for the rest of the operation, once, and returns the record read under it.
func (o *op) lock(id string) (*store.Container, error) {
	if o.locks == nil {
		o.locks = map[string]func(){}
	}
	if _, ok := o.locks[id]; ok {
		return o.m.RT.Containers.Get(id)
	}
	c, unlock, err := guard.Lock(o.ctx, o.m.RT.Containers, id, 0)
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

// withNode is with for an operation on one node that answers with the node: f gets it
// and its container's record.
func (m *Manager) withNode(ctx context.Context, ref, node string, f func(o *op, n *Node, c *store.Container) error) (*Node, *Tree, error) {
	var out *Node
	t, err := m.with(ctx, ref, func(o *op) error {
		n, c, err := o.node(node)
		if err != nil {
			return err
		}
		out = n
		return f(o, n, c)
	})
	return out, t, err
}

// withDropped is with that also runs f on a dropped tree when allowed (prune).
func (m *Manager) withDropped(ctx context.Context, ref string, allowDropped bool, f func(o *op) error) (*Tree, error) {
	id, err := m.resolveID(ref)
	if err != nil {
		return nil, err
	}
	unlock, err := treedoc.Lock(id, false)
	if err != nil {
		return nil, err
	}
	t, err := treedoc.ReadID(id)
	if err != nil {
		unlock()
		return nil, err
	}
	m.doc(id, t, false)
	if t.Dropped && !allowDropped {
		unlock()
		return nil, fmt.Errorf("%w: %s; its state is kept in %s (prune its root to delete it)", ErrDropped, t.ID, t.Dir())
	}
	o := &op{m: m, t: t, ctx: ctx, start: time.Now()}
	if err := o.ensureCgroup(); err != nil {
		unlock()
		return nil, err
	}
	refresh(t, m.RT)
	ferr := f(o)
	o.unlockAll()
	if _, err := os.Stat(t.Dir()); err == nil { // a pruned root takes the directory
		refresh(t, m.RT)
		ferr = errors.Join(ferr, o.save())
	} else {
		m.doc(id, nil, true)
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

// resolveID finds a tree by id, unique id prefix or name.
func (m *Manager) resolveID(ref string) (string, error) { return treedoc.Resolve(ref) }

// List reads every tree, oldest first (figures as of their last operation).
func (m *Manager) List() ([]*Tree, error) { return ReadAll() }

// Get reads one tree with its live figures measured now (last-active included).
func (m *Manager) Get(ctx context.Context, ref string) (*Tree, error) {
	id, err := m.resolveID(ref)
	if err != nil {
		return nil, err
	}
	t, err := treedoc.ReadID(id)
	if err != nil {
		return nil, err
	}
	if t.Dropped {
		return t, nil
	}
	return m.with(ctx, id, func(*op) error { return nil })
}

// node resolves a node reference (container id, name or id prefix) within the tree.
func (o *op) node(ref string) (*Node, *store.Container, error) {
	if ref == "" {
		ref = o.t.Root
	}
	var c *store.Container
	var err error
	if n := o.t.Nodes[ref]; n != nil {
		c, err = o.m.RT.Containers.Get(ref)
	} else {
		c, err = o.m.RT.Containers.Resolve(ref)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tree %s: node %q: %w", o.t.ID, ref, err)
	}
	n := o.t.Nodes[c.ID]
	if n == nil && c.Cluster != "" && o.t.Nodes[c.Cluster] != nil && o.t.Nodes[c.Cluster].Kind == NodeKindCluster {
		// A cluster member names its cluster's node.
		n = o.t.Nodes[c.Cluster]
		if c, err = o.m.RT.Containers.Get(n.ID); err != nil {
			return nil, nil, fmt.Errorf("tree %s: node %q: its cluster %s: %w", o.t.ID, ref, n.ID, err)
		}
	}
	if n == nil {
		return nil, nil, fmt.Errorf("tree %s: %s: %w (see: lazyfork tree nodes %s)", o.t.ID, ref, ErrNotMember, o.t.ID)
	}
	if c, err = o.lock(c.ID); err != nil {
		return nil, nil, err
	}
	return n, c, nil
}
