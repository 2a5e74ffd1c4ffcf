package client

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/lazyfork/lazyfork/lib/treedoc"
)

// Snapshot trees (docs/api.md, "Snapshot trees"): a root container and the forks made
// from it, kept within a budget by suspending least-recently-active unprotected nodes to
// disk.

// The documents are lib/treedoc's (tree.json), the same the porcelain and lf-tree print.
type (
	SnapshotTree = treedoc.Tree   // one tree: budget, usage and every node
	TreeNodeInfo = treedoc.Node   // one node's metadata
	TreeBudget   = treedoc.Budget // a tree's bounds
	TreeUsage    = treedoc.Usage  // its consumption against them
	TreePacked   = treedoc.Packed // a snapshot of a node kept on disk
)

// Node states in a snapshot tree.
const (
	NodeLive      = treedoc.StateLive
	NodeSuspended = treedoc.StateSuspended
	NodeExited    = treedoc.StateExited
)

// TreeBudgetRequest is a budget in a request: a field left out takes the default (on
// create) or stays as it is (on a budget change).
type TreeBudgetRequest struct {
	MaxLive       *int   `json:"max_live,omitempty"`
	MaxRAMBytes   *int64 `json:"max_ram_bytes,omitempty"`
	MaxDiskBytes  *int64 `json:"max_disk_bytes,omitempty"`
	MaxChainDepth *int   `json:"max_chain_depth,omitempty"`
}

// TreeCreateRequest is the body of POST /v1/trees: Root (a new container) or Adopt (a
// running container's ref), not both.
type TreeCreateRequest struct {
	Name   string             `json:"name,omitempty"`
	Root   *CreateRequest     `json:"root,omitempty"`
	Adopt  string             `json:"adopt,omitempty"`
	Label  string             `json:"label,omitempty"` // the root node's label
	KSM    bool               `json:"ksm,omitempty"`
	Budget *TreeBudgetRequest `json:"budget,omitempty"`
}

// TreeForkRequest is the body of POST /v1/trees/{tree}/nodes/{node}/fork.
type TreeForkRequest struct {
	N      int      `json:"n,omitempty"` // default 1, or len(Names), or len(Labels)
	Names  []string `json:"names,omitempty"`
	Labels []string `json:"labels,omitempty"`
}

// TreePrepareRequest is the optional body of POST .../prepare.
type TreePrepareRequest struct {
	Refresh bool `json:"refresh,omitempty"`
}

// TreeRollbackRequest is the optional body of POST .../rollback.
type TreeRollbackRequest struct {
	Name  string `json:"name,omitempty"`
	Label string `json:"label,omitempty"`
}

// TreeResult answers every tree operation: the tree after it, and what applies of the
// rest.
type TreeResult struct {
	Tree  *SnapshotTree   `json:"tree,omitempty"`  // absent once the tree is removed
	Node  *TreeNodeInfo   `json:"node,omitempty"`  // prepare, rollback, suspend, resume, protect, unprotect
	Nodes []*TreeNodeInfo `json:"nodes,omitempty"` // fork: the new nodes
	// Prune.
	Pruned      []string `json:"pruned,omitempty"`
	TreeRemoved bool     `json:"tree_removed,omitempty"`
	TmpfsFreed  int64    `json:"tmpfs_freed,omitempty"`
	DiskFreed   int64    `json:"disk_freed,omitempty"`
	// Drop and evict: the nodes suspended; drop: where the state stays on disk.
	Suspended []string `json:"suspended,omitempty"`
	Dir       string   `json:"dir,omitempty"`
	// Events are the operation's mutations as watchers get them, evictions it caused
	// included.
	Events []TreeEvent `json:"events,omitempty"`
}

// TreeEvent is one mutation of a tree.
type TreeEvent struct {
	// Kind: create, adopt, fork, prepare, rollback, suspend, resume, protect, unprotect,
	// prune, evict, drop, budget.
	Kind  string   `json:"kind"`
	Tree  string   `json:"tree"`
	Node  string   `json:"node,omitempty"`
	Nodes []string `json:"nodes,omitempty"` // forks made, nodes pruned or suspended
	// LatencyNs is how long the daemon took for this step of the operation.
	LatencyNs int64     `json:"latency_ns"`
	Time      time.Time `json:"time"`
	// Seq orders the daemon's tree events (it starts again when the daemon restarts).
	Seq uint64 `json:"seq"`
	// External: the mutation was made by another process (`lazyfork --local tree ...`);
	// the daemon saw it in tree.json and LatencyNs is 0.
	External bool `json:"external,omitempty"`
}

// TreeWatchMessage is one line of GET /v1/trees/{tree}/watch: first the tree as it is,
// then one event per mutation.
type TreeWatchMessage struct {
	Tree  *SnapshotTree `json:"tree,omitempty"`
	Event *TreeEvent    `json:"event,omitempty"`
	Error *Error        `json:"error,omitempty"`
	// End is the last line when the daemon ends the stream: "removed" (the tree's root
	// was pruned) or "shutdown" (the daemon stops).
	End string `json:"end,omitempty"`
}

func treePath(ref, verb string) string {
	p := "/v1/trees/" + url.PathEscape(ref)
	if verb != "" {
		p += "/" + verb
	}
	return p
}

func nodePath(treeRef, node, verb string) string {
	p := treePath(treeRef, "nodes/"+url.PathEscape(node))
	if verb != "" {
		p += "/" + verb
	}
	return p
}

// ListTrees returns every tree (figures as of each tree's last operation).
func (c *Client) ListTrees(ctx context.Context) ([]*SnapshotTree, error) {
	var out []*SnapshotTree
	return out, c.do(ctx, "GET", "/v1/trees", nil, &out)
}

// CreateTree makes a tree rooted at a new container (req.Root) or a running one
// (req.Adopt); the root's keyframe is written at once.
func (c *Client) CreateTree(ctx context.Context, req TreeCreateRequest) (*SnapshotTree, error) {
	var out SnapshotTree
	return &out, c.do(ctx, "POST", "/v1/trees", req, &out)
}

// AdoptTree makes a tree rooted at running container ref.
func (c *Client) AdoptTree(ctx context.Context, ref string, req TreeCreateRequest) (*SnapshotTree, error) {
	req.Adopt = ref
	return c.CreateTree(ctx, req)
}

// GetTree returns tree ref (id, unique id prefix or name) with every node, its figures
// measured now.
func (c *Client) GetTree(ctx context.Context, ref string) (*SnapshotTree, error) {
	var out SnapshotTree
	return &out, c.do(ctx, "GET", treePath(ref, ""), nil, &out)
}

// TreeNodes returns the nodes of tree ref, oldest first.
func (c *Client) TreeNodes(ctx context.Context, ref string) ([]*TreeNodeInfo, error) {
	var out []*TreeNodeInfo
	return out, c.do(ctx, "GET", treePath(ref, "nodes"), nil, &out)
}

// DropTree forgets tree ref: live nodes are suspended to disk, the state stays in
// res.Dir.
func (c *Client) DropTree(ctx context.Context, ref string) (*TreeResult, error) {
	var out TreeResult
	return &out, c.do(ctx, "DELETE", treePath(ref, ""), nil, &out)
}

// EvictTree runs the budget's eviction now; res.Suspended lists what it suspended.
func (c *Client) EvictTree(ctx context.Context, ref string) (*TreeResult, error) {
	var out TreeResult
	return &out, c.do(ctx, "POST", treePath(ref, "evict"), nil, &out)
}

// SetTreeBudget changes the fields of tree ref's budget that b gives, then evicts what
// the new budget asks for (res.Events).
func (c *Client) SetTreeBudget(ctx context.Context, ref string, b TreeBudgetRequest) (*TreeResult, error) {
	var out TreeResult
	return &out, c.do(ctx, "POST", treePath(ref, "budget"), b, &out)
}

// ForkNode forks node of tree treeRef (a batch of req.N shares one dump).
func (c *Client) ForkNode(ctx context.Context, treeRef, node string, req TreeForkRequest) (*TreeResult, error) {
	return c.nodeOp(ctx, treeRef, node, "fork", req)
}

// PrepareNode writes node's keyframe now (idempotent); refresh writes a new generation.
func (c *Client) PrepareNode(ctx context.Context, treeRef, node string, refresh bool) (*TreeResult, error) {
	return c.nodeOp(ctx, treeRef, node, "prepare", TreePrepareRequest{Refresh: refresh})
}

// RollbackNode starts a new branch from node's keyframe (its earlier state).
func (c *Client) RollbackNode(ctx context.Context, treeRef, node string, req TreeRollbackRequest) (*TreeResult, error) {
	return c.nodeOp(ctx, treeRef, node, "rollback", req)
}

// SuspendNode writes node's state to disk and frees its RAM.
func (c *Client) SuspendNode(ctx context.Context, treeRef, node string) (*TreeResult, error) {
	return c.nodeOp(ctx, treeRef, node, "suspend", nil)
}

// ResumeNode restores a suspended node in place.
func (c *Client) ResumeNode(ctx context.Context, treeRef, node string) (*TreeResult, error) {
	return c.nodeOp(ctx, treeRef, node, "resume", nil)
}

// ProtectNode excludes node from eviction; UnprotectNode lets eviction choose it again.
func (c *Client) ProtectNode(ctx context.Context, treeRef, node string) (*TreeResult, error) {
	return c.nodeOp(ctx, treeRef, node, "protect", nil)
}

func (c *Client) UnprotectNode(ctx context.Context, treeRef, node string) (*TreeResult, error) {
	return c.nodeOp(ctx, treeRef, node, "unprotect", nil)
}

// PruneNode deletes node and its whole subtree; the root takes the tree with it.
func (c *Client) PruneNode(ctx context.Context, treeRef, node string) (*TreeResult, error) {
	var out TreeResult
	return &out, c.do(ctx, "DELETE", nodePath(treeRef, node, ""), nil, &out)
}

func (c *Client) nodeOp(ctx context.Context, treeRef, node, verb string, body any) (*TreeResult, error) {
	var out TreeResult
	return &out, c.do(ctx, "POST", nodePath(treeRef, node, verb), body, &out)
}

// WatchTree calls fn with tree ref as it is, then with one event per mutation, until ctx
// ends, fn returns an error, or the tree is removed (then it returns nil).
func (c *Client) WatchTree(ctx context.Context, ref string, fn func(TreeWatchMessage) error) error {
	return stream(ctx, c, treePath(ref, "watch"), "watch tree "+ref, func(m TreeWatchMessage) (bool, error) {
		switch {
		case m.Error != nil:
			return true, m.Error
		case m.End == "removed":
			return true, nil
		case m.End != "":
			return true, fmt.Errorf("watch tree %s: the daemon ended the stream (%s)", ref, m.End)
		}
		return false, fn(m)
	})
}
