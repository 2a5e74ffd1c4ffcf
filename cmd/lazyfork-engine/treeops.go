package main

import (
	"context"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/snaptree"
)

// treeOps is what the tree commands run on: lib/snaptree's Manager in this process, or,
// while a daemon serves this state, the daemon's tree routes (which run the same
// Manager), so that the daemon's watchers see the commands' mutations too.
type treeOps interface {
	Create(ctx context.Context, o snaptree.CreateOptions) (*snaptree.Tree, error)
	Adopt(ctx context.Context, ref string, o snaptree.CreateOptions) (*snaptree.Tree, error)
	List() ([]*snaptree.Tree, error)
	Get(ctx context.Context, ref string) (*snaptree.Tree, error)
	Fork(ctx context.Context, treeRef, node string, o snaptree.ForkOptions) ([]*snaptree.Node, *snaptree.Tree, error)
	Prepare(ctx context.Context, treeRef, node string, refresh bool) (*snaptree.Node, *snaptree.Tree, error)
	Rollback(ctx context.Context, treeRef, node, name, label string) (*snaptree.Node, *snaptree.Tree, error)
	Suspend(ctx context.Context, treeRef, node string) (*snaptree.Node, *snaptree.Tree, error)
	Resume(ctx context.Context, treeRef, node string) (*snaptree.Node, *snaptree.Tree, error)
	Protect(ctx context.Context, treeRef, node string, on bool) (*snaptree.Node, *snaptree.Tree, error)
	Prune(ctx context.Context, treeRef, node string) (*snaptree.PruneResult, *snaptree.Tree, error)
	Drop(ctx context.Context, treeRef string) (*snaptree.DropResult, *snaptree.Tree, error)
	Evict(ctx context.Context, treeRef string) ([]string, *snaptree.Tree, error)
	SetBudget(ctx context.Context, treeRef string, b snaptree.Budget) (*snaptree.Tree, error)
}

var (
	_ treeOps = (*snaptree.Manager)(nil)
	_ treeOps = treesViaDaemon{}
)

// treesViaDaemon is the daemon's tree routes behind treeOps (they answer with the same
// lib/treedoc documents lib/snaptree returns).
type treesViaDaemon struct {
	cl *client.Client
	// onEvent gets the events each answer lists (evictions included), as the Manager's
	// OnEvent does in-process.
	onEvent func(snaptree.Event)
}

// result is an operation's node and tree; its events go to onEvent.
func (d treesViaDaemon) result(res *client.TreeResult, err error) (*snaptree.Node, *snaptree.Tree, error) {
	if err != nil {
		return nil, nil, err
	}
	if d.onEvent != nil {
		for _, e := range res.Events {
			d.onEvent(snaptree.Event{Kind: e.Kind, Tree: e.Tree, Node: e.Node, Nodes: e.Nodes, LatencyNs: e.LatencyNs, Time: e.Time})
		}
	}
	return res.Node, res.Tree, nil
}

func createRequest(o snaptree.CreateOptions) client.TreeCreateRequest {
	req := client.TreeCreateRequest{Name: o.Name, Label: o.Label, KSM: o.KSM}
	if b := o.Budget; b != nil {
		req.Budget = &client.TreeBudgetRequest{MaxLive: &b.MaxLive, MaxRAMBytes: &b.MaxRAMBytes,
			MaxDiskBytes: &b.MaxDiskBytes, MaxChainDepth: &b.MaxChainDepth}
	}
	return req
}

func (d treesViaDaemon) Create(ctx context.Context, o snaptree.CreateOptions) (*snaptree.Tree, error) {
	req := createRequest(o)
	c := o.Container
	req.Root = &client.CreateRequest{Image: c.Image, Name: c.Name, Command: c.Command, Env: c.Env, Hook: c.Hook,
		User: c.User, Memory: c.Memory, PidsLimit: c.PidsLimit, Privileged: c.Privileged, Net: c.Net, NAT: c.NAT, Join: c.Join}
	return d.cl.CreateTree(ctx, req)
}

func (d treesViaDaemon) Adopt(ctx context.Context, ref string, o snaptree.CreateOptions) (*snaptree.Tree, error) {
	return d.cl.AdoptTree(ctx, ref, createRequest(o))
}

func (d treesViaDaemon) List() ([]*snaptree.Tree, error) {
	return d.cl.ListTrees(context.Background())
}

func (d treesViaDaemon) Get(ctx context.Context, ref string) (*snaptree.Tree, error) {
	return d.cl.GetTree(ctx, ref)
}

// node is the node reference for a route: the root when none is given.
func (d treesViaDaemon) node(ctx context.Context, treeRef, node string) (string, error) {
	if node != "" {
		return node, nil
	}
	t, err := d.cl.GetTree(ctx, treeRef)
	if err != nil {
		return "", err
	}
	return t.Root, nil
}

func (d treesViaDaemon) Fork(ctx context.Context, treeRef, node string, o snaptree.ForkOptions) ([]*snaptree.Node, *snaptree.Tree, error) {
	node, err := d.node(ctx, treeRef, node)
	if err != nil {
		return nil, nil, err
	}
	res, err := d.cl.ForkNode(ctx, treeRef, node, client.TreeForkRequest{N: o.N, Names: o.Names, Labels: o.Labels})
	_, t, err := d.result(res, err)
	if err != nil {
		return nil, nil, err
	}
	return res.Nodes, t, nil
}

func (d treesViaDaemon) Prepare(ctx context.Context, treeRef, node string, refresh bool) (*snaptree.Node, *snaptree.Tree, error) {
	node, err := d.node(ctx, treeRef, node)
	if err != nil {
		return nil, nil, err
	}
	return d.result(d.cl.PrepareNode(ctx, treeRef, node, refresh))
}

func (d treesViaDaemon) Rollback(ctx context.Context, treeRef, node, name, label string) (*snaptree.Node, *snaptree.Tree, error) {
	node, err := d.node(ctx, treeRef, node)
	if err != nil {
		return nil, nil, err
	}
	return d.result(d.cl.RollbackNode(ctx, treeRef, node, client.TreeRollbackRequest{Name: name, Label: label}))
}

func (d treesViaDaemon) Suspend(ctx context.Context, treeRef, node string) (*snaptree.Node, *snaptree.Tree, error) {
	return d.result(d.cl.SuspendNode(ctx, treeRef, node))
}

func (d treesViaDaemon) Resume(ctx context.Context, treeRef, node string) (*snaptree.Node, *snaptree.Tree, error) {
	return d.result(d.cl.ResumeNode(ctx, treeRef, node))
}

func (d treesViaDaemon) Protect(ctx context.Context, treeRef, node string, on bool) (*snaptree.Node, *snaptree.Tree, error) {
	if on {
		return d.result(d.cl.ProtectNode(ctx, treeRef, node))
	}
	return d.result(d.cl.UnprotectNode(ctx, treeRef, node))
}

func (d treesViaDaemon) Prune(ctx context.Context, treeRef, node string) (*snaptree.PruneResult, *snaptree.Tree, error) {
	res, err := d.cl.PruneNode(ctx, treeRef, node)
	_, t, err := d.result(res, err)
	if err != nil {
		return nil, nil, err
	}
	return &snaptree.PruneResult{Pruned: res.Pruned, TreeRemoved: res.TreeRemoved, TmpfsFreed: res.TmpfsFreed, DiskFreed: res.DiskFreed}, t, nil
}

func (d treesViaDaemon) Drop(ctx context.Context, treeRef string) (*snaptree.DropResult, *snaptree.Tree, error) {
	res, err := d.cl.DropTree(ctx, treeRef)
	_, t, err := d.result(res, err)
	if err != nil {
		return nil, nil, err
	}
	return &snaptree.DropResult{Suspended: res.Suspended, Dir: res.Dir}, t, nil
}

func (d treesViaDaemon) Evict(ctx context.Context, treeRef string) ([]string, *snaptree.Tree, error) {
	res, err := d.cl.EvictTree(ctx, treeRef)
	_, t, err := d.result(res, err)
	if err != nil {
		return nil, nil, err
	}
	return res.Suspended, t, nil
}

func (d treesViaDaemon) SetBudget(ctx context.Context, treeRef string, b snaptree.Budget) (*snaptree.Tree, error) {
	_, t, err := d.result(d.cl.SetTreeBudget(ctx, treeRef, client.TreeBudgetRequest{MaxLive: &b.MaxLive, MaxRAMBytes: &b.MaxRAMBytes,
		MaxDiskBytes: &b.MaxDiskBytes, MaxChainDepth: &b.MaxChainDepth}))
	return t, err
}
