// Package snaptree manages snapshot trees of LazyFork containers: a root container
// (created from an image or adopted) and the forks made from it and from each other,
// kept within a budget (live containers, live RAM, disk, chain depth) by suspending the
// least-recently-active unprotected nodes to disk. It composes lib/fork (Prepare, Fork,
// Restore, Stop, Start) and keeps its own documents in a plain directory tree:
//
//	$LAZYFORK_ROOT/trees/<tree-id>/
//	    tree.json                     the Tree document (budget, root, nodes), atomic
//	    .lock                         flock serialising the tree's operations
//	    nodes/<node-id>/<snapshot>/   a packed snapshot (snapshot.json + images/)
//	    families/<family>/<file>.mem  memory files packed snapshots need, once per tree
//
// A node is a container (kind "container"; its id is the container's) or a cluster (kind
// "cluster": containers sharing one network namespace, its id the leader's; every
// operation acts on all its members as one cut, see cluster.go). A keyframe is a
// snapshot of a node whose memory files the node itself and its forks map (lib/fork
// Prepare). Suspend stops a node into a snapshot (lib/fork Stop), packs that snapshot and
// every memory file it needs to disk, and deletes from tmpfs whatever no running process
// maps and no other snapshot needs: the node's RAM is freed. Resume unpacks and restores
// it in place (same id and name; its delta, the snapshot's own pages, is always applied).
//
// Every operation takes the tree's lock for its whole run, reads tree.json, checks the
// budget (lib/budget) and writes tree.json back with renameio. All members' cgroups live
// under one tree cgroup whose memory and pids limits derive from the budget.
package snaptree

import (
	"fmt"

	"github.com/lazyfork/lazyfork/lib/exitcode"
	"github.com/lazyfork/lazyfork/lib/treedoc"
)

// The documents are lib/treedoc's (lf-tree reads them without this package's weight).
type (
	Tree   = treedoc.Tree
	Node   = treedoc.Node
	Packed = treedoc.Packed
	Budget = treedoc.Budget
	Usage  = treedoc.Usage
)

// Kind and Version of tree.json; readers reject other versions.
const (
	Kind    = treedoc.Kind
	Version = treedoc.Version
)

// Node states.
const (
	StateLive      = treedoc.StateLive
	StateSuspended = treedoc.StateSuspended
	StateExited    = treedoc.StateExited
)

// Roles of packed snapshots.
const (
	RoleSuspend  = treedoc.RoleSuspend
	RoleKeyframe = treedoc.RoleKeyframe
)

// Node kinds: a container, or a cluster (see cluster.go).
const (
	NodeKind        = treedoc.NodeKind
	NodeKindCluster = treedoc.NodeKindCluster
)

// invalidState is an operation the node's or container's state does not allow (exit
// status 4, HTTP 409 invalid_state); badRequest one whose arguments are wrong (exit
// status 2, HTTP 400 bad_request). lib/daemon maps both by their exit status.
func invalidState(format string, args ...any) error {
	return exitcode.With(fmt.Errorf(format, args...), exitcode.InvalidState)
}

func badRequest(format string, args ...any) error {
	return exitcode.With(fmt.Errorf(format, args...), exitcode.Usage)
}

var (
	ErrNoTree    = treedoc.ErrNoTree
	ErrNotMember = treedoc.ErrNotMember
	ErrDropped   = treedoc.ErrDropped
)

// DefaultBudget is lib/budget's documented default.
func DefaultBudget() Budget { return treedoc.DefaultBudget() }

// TreesDir holds every tree ($LAZYFORK_ROOT/trees).
func TreesDir() string { return treedoc.TreesDir() }

// TreeDir is one tree's directory.
func TreeDir(id string) string { return treedoc.TreeDir(id) }

// TreeDirNode is a node's directory of packed snapshots.
func TreeDirNode(treeID, node string) string { return treedoc.NodeDir(treeID, node) }

// Read reads tree ref (id, unique id prefix or name) as written by its last operation,
// without locking or measuring it (lf-tree).
func Read(ref string) (*Tree, error) { return treedoc.Read(ref) }

// ReadAll reads every tree, oldest first, as written by its last operation.
func ReadAll() ([]*Tree, error) { return treedoc.ReadAll() }
