package snaptree

import (
	"context"
	"fmt"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/treedoc"
)

// CreateOptions make a tree.
type CreateOptions struct {
	Name   string  // optional tree name
	Budget *Budget // nil: DefaultBudget
	KSM    bool    // opt-in KSM for the tree's memory (recorded; same-tenant only)
	Label  string  // the root node's label
	// Container is the root container to create (Create only).
	Container container.CreateOptions
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
	c, err := m.RT.Containers.Resolve(ref)
	if err != nil {
		return nil, err
	}
	// A cluster member: the whole cluster roots the tree, as one node led by its leader.
	members, err := m.RT.Members(c)
	if err != nil {
		return nil, fmt.Errorf("adopt %s: %w", ref, err)
	}
	for _, x := range members {
		if st := m.RT.State(x); st != store.StateRunning {
			return nil, invalidState("adopt %s: %s is %s; only a running container (every member of a cluster) can root a tree (start it first)", ref, x.Display(), st)
		}
		if t, err := m.treeOf(x.ID); err != nil {
			return nil, err
		} else if t != "" {
			return nil, invalidState("adopt %s: %s is already a node of tree %s (prune it there first)", ref, x.Display(), t)
		}
	}
	return m.create(ctx, o, members[0].ID)
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
		if err := store.ValidateName(o.Name); err != nil {
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
	id := treedoc.NewID()
	unlock, err := treedoc.Lock(id, true)
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
	var c *store.Container
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
	defer op.unlockAll()
	if err := op.ensureCgroup(); err != nil {
		return nil, err
	}
	kind := "create"
	if adopt != "" {
		kind = "adopt"
		if c, err = m.RT.Containers.Get(adopt); err != nil {
			return nil, err
		}
	} else if c, err = op.trt.Create(ctx, o.Container); err != nil {
		return nil, err
	}
	var n *Node
	if c.Cluster != "" && adopt != "" {
		if n, err = op.adoptCluster(c, o.Label); err != nil {
			return nil, err
		}
	} else {
		k, err := fork.Prepare(ctx, op.trt, c, fork.PrepareOptions{KSM: t.KSM})
		if err != nil {
			return nil, fmt.Errorf("tree root keyframe: %w", err)
		}
		now := time.Now().UTC()
		n = &Node{ID: c.ID, Name: c.Name, State: StateLive, Label: o.Label, Kind: NodeKind, Members: 1,
			Created: now, LastActive: now}
		setKeyframe(n, k)
	}
	t.Root = c.ID
	t.Nodes[c.ID] = n
	refresh(t, m.RT)
	if err := op.save(); err != nil {
		return nil, err
	}
	op.event(kind, c.ID)
	m.emit(op.evs)
	return t, nil
}

func setKeyframe(n *Node, k *stage.Snapshot) {
	n.HasKeyframe, n.Keyframe = true, k.ID
	n.Generation++
	n.DirtyPages = int64(k.Dump.PagesWritten)
	// Physical bytes, as written: the memory files named after it and its image.
	n.KeyframeBytes = keyframeTmpfsBytes(k.Family, k.ID) + diskBytes(k.CheckpointDir)
}
