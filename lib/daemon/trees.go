package daemon

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/snaptree"
	"github.com/lazyfork/lazyfork/lib/store"
)

// treeHub is the service's view of snapshot trees: one lib/snaptree Manager (the same
// operations `lazyfork tree ...` runs) whose mutations are published to watchers.
type treeHub struct {
	once sync.Once
	m    *snaptree.Manager
	// mu is held shared by every mutation (its events are published before it returns)
	// and exclusively while a watch subscribes and reads the tree, so a watcher gets
	// exactly the mutations after the tree it was sent.
	mu sync.RWMutex
	// pubMu orders numbering and sending, so that a Seq read under it covers every event
	// already sent.
	pubMu  sync.Mutex
	seq    atomic.Uint64
	events fanout[client.TreeEvent]
	// docs is every tree's shape as last seen, for the mutations of other processes
	// (treewatch.go).
	docs treeDocs
}

// Trees returns the service's snapshot-tree manager (its mutations are published).
func (s *Service) Trees() *snaptree.Manager {
	h := &s.trees
	h.once.Do(func() {
		h.m = &snaptree.Manager{RT: s.RT, OnEvent: func(e snaptree.Event) { s.publishTree(e) }, OnDoc: s.sawDoc}
	})
	return h.m
}

// publishTree numbers a tree event and sends it to the watchers.
func (s *Service) publishTree(e snaptree.Event) client.TreeEvent {
	return s.publishTreeEvent(client.TreeEvent{Kind: e.Kind, Tree: e.Tree, Node: e.Node, Nodes: e.Nodes,
		LatencyNs: e.LatencyNs, Time: e.Time})
}

func (s *Service) publishTreeEvent(te client.TreeEvent) client.TreeEvent {
	s.trees.pubMu.Lock()
	defer s.trees.pubMu.Unlock()
	te.Seq = s.trees.seq.Add(1)
	s.trees.events.publish(te)
	return te
}

// lastTreeSeq is the number of the last tree event sent.
func (s *Service) lastTreeSeq() uint64 {
	s.trees.pubMu.Lock()
	defer s.trees.pubMu.Unlock()
	return s.trees.seq.Load()
}

// mutate runs one tree mutation to the end (a CRIU dump or restore is never cut short
// by a client hanging up; what it made stays in the tree, and watchers see it). Its
// events (evictions it caused included) are published and, if res is not nil, added to
// res.Events: f gets a manager of its own, so they are this operation's only.
func (s *Service) mutate(ctx context.Context, res *client.TreeResult, f func(ctx context.Context, m *snaptree.Manager) error) error {
	m := &snaptree.Manager{RT: s.Trees().RT, OnEvent: func(e snaptree.Event) {
		te := s.publishTree(e)
		if res != nil {
			res.Events = append(res.Events, te)
		}
	}, OnDoc: s.sawDoc}
	s.trees.mu.RLock()
	defer s.trees.mu.RUnlock()
	return f(context.WithoutCancel(ctx), m)
}

// treeBudget is base with the fields r gives, checked.
func treeBudget(base snaptree.Budget, r *client.TreeBudgetRequest) (snaptree.Budget, error) {
	b := base
	if r != nil {
		if r.MaxLive != nil {
			b.MaxLive = *r.MaxLive
		}
		if r.MaxRAMBytes != nil {
			b.MaxRAMBytes = *r.MaxRAMBytes
		}
		if r.MaxDiskBytes != nil {
			b.MaxDiskBytes = *r.MaxDiskBytes
		}
		if r.MaxChainDepth != nil {
			b.MaxChainDepth = *r.MaxChainDepth
		}
	}
	if err := b.Validate(); err != nil {
		return b, badRequest("%v", err)
	}
	return b, nil
}

// MaxLabel bounds a node label (bytes).
const MaxLabel = 256

// checkLabels refuses labels that are long or hold control characters (they end up in
// tables on terminals).
func checkLabels(labels ...string) error {
	for _, l := range labels {
		if len(l) > MaxLabel {
			return badRequest("label %.20q... is %d bytes: at most %d", l, len(l), MaxLabel)
		}
		for _, r := range l {
			if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
				return badRequest("label %q holds a control character: use printable text", l)
			}
		}
	}
	return nil
}

// ListTrees returns every tree, oldest first (figures as of each one's last operation).
func (s *Service) ListTrees(ctx context.Context) ([]*snaptree.Tree, error) {
	all, err := s.Trees().List()
	if all == nil {
		all = []*snaptree.Tree{}
	}
	return all, err
}

// CreateTree makes a tree rooted at a new container (req.Root) or adopts a running one
// (req.Adopt); the root's keyframe is written at once.
func (s *Service) CreateTree(ctx context.Context, req client.TreeCreateRequest) (*snaptree.Tree, error) {
	if (req.Root == nil) == (req.Adopt == "") {
		return nil, badRequest("give root (a container to create: {\"image\": ...}) or adopt (a running container), not both or neither")
	}
	b, err := treeBudget(snaptree.DefaultBudget(), req.Budget)
	if err != nil {
		return nil, err
	}
	if err := checkLabels(req.Label); err != nil {
		return nil, err
	}
	if req.Name != "" {
		if err := store.ValidateName(req.Name); err != nil {
			return nil, fmt.Errorf("tree name: %w", err)
		}
		all, err := s.Trees().List()
		if err != nil {
			return nil, err
		}
		for _, t := range all {
			if t.Name == req.Name {
				return nil, client.Errorf(http.StatusConflict, client.CodeNameInUse, "tree name %q is already in use by tree %s: pick another name or prune it", req.Name, t.ID)
			}
		}
	}
	o := snaptree.CreateOptions{Name: req.Name, Budget: &b, KSM: req.KSM, Label: req.Label}
	if req.Adopt != "" {
		c, err := s.RT.Containers.Resolve(req.Adopt)
		if err != nil {
			return nil, err
		}
		if st := s.RT.State(c); st != store.StateRunning {
			return nil, client.Errorf(http.StatusConflict, client.CodeInvalidState, "adopt %s: it is %s; only a running container can root a tree (start it first)", c.Display(), st)
		}
	} else if o.Container, err = s.createOptions(ctx, *req.Root, nil); err != nil {
		return nil, err
	}
	var t *snaptree.Tree
	err = s.mutate(ctx, nil, func(ctx context.Context, m *snaptree.Manager) error {
		if req.Adopt != "" {
			t, err = m.Adopt(ctx, req.Adopt, o)
		} else {
			t, err = m.Create(ctx, o)
		}
		return err
	})
	return t, err
}

// GetTree returns tree ref with its figures measured now.
func (s *Service) GetTree(ctx context.Context, ref string) (*snaptree.Tree, error) {
	return s.Trees().Get(ctx, ref)
}

// TreeNodes returns tree ref's nodes, oldest (the root) first.
func (s *Service) TreeNodes(ctx context.Context, ref string) ([]*snaptree.Node, error) {
	t, err := s.GetTree(ctx, ref)
	if err != nil {
		return nil, err
	}
	return t.NodeList(), nil
}

// TreeNode returns one node of tree ref: its id, its container's name or unique id prefix.
func (s *Service) TreeNode(ctx context.Context, ref, node string) (*snaptree.Node, error) {
	t, err := s.GetTree(ctx, ref)
	if err != nil {
		return nil, err
	}
	if n := t.Nodes[node]; n != nil {
		return n, nil
	}
	c, err := s.RT.Containers.Resolve(node)
	if err != nil {
		return nil, fmt.Errorf("tree %s: node %q: %w", t.ID, node, err)
	}
	if n := t.Nodes[c.ID]; n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("tree %s: %s: %w", t.ID, node, snaptree.ErrNotMember)
}

// DropTree forgets tree ref: live nodes are suspended, the state stays on disk.
func (s *Service) DropTree(ctx context.Context, ref string) (*client.TreeResult, error) {
	res := &client.TreeResult{}
	err := s.mutate(ctx, res, func(ctx context.Context, m *snaptree.Manager) error {
		d, t, err := m.Drop(ctx, ref)
		res.Tree = t
		if d != nil {
			res.Suspended, res.Dir = d.Suspended, d.Dir
		}
		return err
	})
	return res, err
}

// EvictTree runs the budget's eviction now.
func (s *Service) EvictTree(ctx context.Context, ref string) (*client.TreeResult, error) {
	res := &client.TreeResult{}
	err := s.mutate(ctx, res, func(ctx context.Context, m *snaptree.Manager) error {
		ids, t, err := m.Evict(ctx, ref)
		res.Tree, res.Suspended = t, ids
		return err
	})
	return res, err
}

// SetTreeBudget changes the budget fields b gives, then evicts what the new budget asks.
func (s *Service) SetTreeBudget(ctx context.Context, ref string, b client.TreeBudgetRequest) (*client.TreeResult, error) {
	t, err := s.GetTree(ctx, ref)
	if err != nil {
		return nil, err
	}
	nb, err := treeBudget(t.Budget, &b)
	if err != nil {
		return nil, err
	}
	res := &client.TreeResult{}
	err = s.mutate(ctx, res, func(ctx context.Context, m *snaptree.Manager) error {
		res.Tree, err = m.SetBudget(ctx, t.ID, nb)
		return err
	})
	for _, e := range res.Events {
		if e.Kind == "evict" {
			res.Suspended = append(res.Suspended, e.Nodes...)
		}
	}
	return res, err
}

// ForkNode forks node of tree ref: req.N branches sharing one dump.
func (s *Service) ForkNode(ctx context.Context, ref, node string, req client.TreeForkRequest) (*client.TreeResult, error) {
	n, err := forkCount(req.N, len(req.Names), len(req.Labels))
	if err != nil {
		return nil, err
	}
	for _, name := range req.Names {
		if err := store.ValidateName(name); err != nil {
			return nil, err
		}
	}
	if err := s.RT.Containers.CheckNamesFree(req.Names); err != nil {
		return nil, err
	}
	if err := checkLabels(req.Labels...); err != nil {
		return nil, err
	}
	res := &client.TreeResult{}
	err = s.mutate(ctx, res, func(ctx context.Context, m *snaptree.Manager) error {
		nodes, t, err := m.Fork(ctx, ref, node, snaptree.ForkOptions{N: n, Names: req.Names, Labels: req.Labels})
		res.Tree, res.Nodes = t, nodes
		return err
	})
	return res, err
}

// PrepareNode writes node's keyframe now (idempotent); refresh writes a new generation.
func (s *Service) PrepareNode(ctx context.Context, ref, node string, req client.TreePrepareRequest) (*client.TreeResult, error) {
	return s.nodeOp(ctx, func(ctx context.Context, m *snaptree.Manager) (*snaptree.Node, *snaptree.Tree, error) {
		return m.Prepare(ctx, ref, node, req.Refresh)
	})
}

// RollbackNode starts a new branch from node's keyframe; the answer's node is the branch.
func (s *Service) RollbackNode(ctx context.Context, ref, node string, req client.TreeRollbackRequest) (*client.TreeResult, error) {
	if err := checkLabels(req.Label); err != nil {
		return nil, err
	}
	if req.Name != "" {
		if err := store.ValidateName(req.Name); err != nil {
			return nil, err
		}
		if err := s.RT.Containers.CheckNamesFree([]string{req.Name}); err != nil {
			return nil, err
		}
	}
	return s.nodeOp(ctx, func(ctx context.Context, m *snaptree.Manager) (*snaptree.Node, *snaptree.Tree, error) {
		return m.Rollback(ctx, ref, node, req.Name, req.Label)
	})
}

// SuspendNode writes node's state to disk and frees its RAM (idempotent).
func (s *Service) SuspendNode(ctx context.Context, ref, node string) (*client.TreeResult, error) {
	return s.nodeOp(ctx, func(ctx context.Context, m *snaptree.Manager) (*snaptree.Node, *snaptree.Tree, error) {
		return m.Suspend(ctx, ref, node)
	})
}

// ResumeNode restores a suspended node in place (idempotent).
func (s *Service) ResumeNode(ctx context.Context, ref, node string) (*client.TreeResult, error) {
	return s.nodeOp(ctx, func(ctx context.Context, m *snaptree.Manager) (*snaptree.Node, *snaptree.Tree, error) {
		return m.Resume(ctx, ref, node)
	})
}

// ProtectNode sets or clears node's protection from eviction.
func (s *Service) ProtectNode(ctx context.Context, ref, node string, on bool) (*client.TreeResult, error) {
	return s.nodeOp(ctx, func(ctx context.Context, m *snaptree.Manager) (*snaptree.Node, *snaptree.Tree, error) {
		return m.Protect(ctx, ref, node, on)
	})
}

func (s *Service) nodeOp(ctx context.Context, op func(context.Context, *snaptree.Manager) (*snaptree.Node, *snaptree.Tree, error)) (*client.TreeResult, error) {
	res := &client.TreeResult{}
	err := s.mutate(ctx, res, func(ctx context.Context, m *snaptree.Manager) error {
		n, t, err := op(ctx, m)
		res.Node, res.Tree = n, t
		return err
	})
	return res, err
}

// PruneNode deletes node and its whole subtree; the root takes the tree with it.
func (s *Service) PruneNode(ctx context.Context, ref, node string) (*client.TreeResult, error) {
	res := &client.TreeResult{}
	err := s.mutate(ctx, res, func(ctx context.Context, m *snaptree.Manager) error {
		p, t, err := m.Prune(ctx, ref, node)
		if p != nil {
			res.Pruned, res.TreeRemoved, res.TmpfsFreed, res.DiskFreed = p.Pruned, p.TreeRemoved, p.TmpfsFreed, p.DiskFreed
		}
		if !res.TreeRemoved {
			res.Tree = t
		}
		return err
	})
	return res, err
}

// WatchTree subscribes to tree ref's mutations and returns the tree as it is: every
// event on the channel (filtered to this tree by the caller) is of a mutation made after
// it. The channel closes if the watcher falls 256 events behind.
func (s *Service) WatchTree(ctx context.Context, ref string) (*snaptree.Tree, <-chan client.TreeEvent, func(), error) {
	m := s.Trees()
	s.trees.mu.Lock()
	defer s.trees.mu.Unlock()
	ch, cancel := s.trees.events.subscribe()
	t, err := m.Get(ctx, ref)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	// Reading the tree may have published the changes another process made to it: they
	// are in t already, so the watcher gets only the events after them.
	last := s.lastTreeSeq()
	out := make(chan client.TreeEvent, cap(ch))
	go func() {
		defer close(out)
		for e := range ch {
			if e.Seq <= last {
				continue
			}
			select {
			case out <- e:
			default:
				cancel() // fell behind: ch closes, and so does out
			}
		}
	}()
	return t, out, cancel, nil
}
