// Package treedoc is the snapshot tree's documents on disk: tree.json (Tree, Node,
// Packed, Budget, Usage), their directory layout under $LAZYFORK_ROOT/trees, the tree's
// lock, and the checks a document passes before anything it names is touched. It does no
// container work (lib/snaptree does, on these types), so lf-tree reads trees without
// linking the fork pipeline.
package treedoc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/budget"
	"github.com/lazyfork/lazyfork/lib/cgroup/owned"
	"github.com/lazyfork/lazyfork/lib/exitcode"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/resolve"
)

// Kind and Version of tree.json; readers reject other versions.
const (
	Kind    = "lazyfork.tree"
	Version = 1
)

// Node states.
const (
	StateLive      = "live"      // its processes run
	StateSuspended = "suspended" // packed to disk, no process, no RAM
	StateExited    = "exited"    // its processes ended without a suspend (killed, power cut)
)

// Roles of packed snapshots.
const (
	RoleSuspend  = "suspend"  // what Resume restores
	RoleKeyframe = "keyframe" // the node's keyframe, for rollback
)

// Node kinds: one container, or a cluster (containers sharing a network namespace,
// lib/fork.ForkCluster) whose node id is its leader's.
const (
	NodeKind        = "container"
	NodeKindCluster = "cluster"
)

var (
	// ErrNoTree: no tree matches the reference (exit status 3).
	ErrNoTree = exitcode.NewNotFound("no such tree")
	// ErrNotMember: the node is not in the tree (exit status 3).
	ErrNotMember = exitcode.NewNotFound("not a node of this tree")
	// ErrDropped: the tree was dropped; its state stays on disk (exit status 4).
	ErrDropped = exitcode.Kind{Msg: "tree was dropped", Code: exitcode.InvalidState}
)

// Budget is a tree's budget in tree.json (lib/budget.Budget with JSON names).
type Budget struct {
	MaxLive       int   `json:"max_live"`
	MaxRAMBytes   int64 `json:"max_ram_bytes"`
	MaxDiskBytes  int64 `json:"max_disk_bytes"`
	MaxChainDepth int   `json:"max_chain_depth"`
}

// DefaultBudget is lib/budget's documented default.
func DefaultBudget() Budget { return fromBudget(budget.Default()) }

func fromBudget(b budget.Budget) Budget {
	return Budget{MaxLive: b.MaxLive, MaxRAMBytes: b.MaxRAMBytes, MaxDiskBytes: b.MaxDiskBytes, MaxChainDepth: b.MaxChainDepth}
}

// Lib is the budget as lib/budget takes it.
func (b Budget) Lib() budget.Budget {
	return budget.Budget{MaxLive: b.MaxLive, MaxRAMBytes: b.MaxRAMBytes, MaxDiskBytes: b.MaxDiskBytes, MaxChainDepth: b.MaxChainDepth}
}

// Validate checks the budget (lib/budget's rules).
func (b Budget) Validate() error { return b.Lib().Validate() }

// Usage is a tree's consumption against its budget.
type Usage struct {
	Live int `json:"live"`
	// RAMBytes is what the tree cgroup is charged (v1: rss+cache+kmem; v2: memory.current).
	RAMBytes int64 `json:"ram_bytes"`
	// DiskBytes is the physical size of the tree's directory (packed snapshots and files).
	DiskBytes int64 `json:"disk_bytes"`
	// TmpfsBytes is what the memory files of the tree's families hold on tmpfs.
	TmpfsBytes int64 `json:"tmpfs_bytes"`
}

// Packed is one snapshot of a node kept on disk.
type Packed struct {
	Snapshot string `json:"snapshot"`
	Role     string `json:"role"` // suspend or keyframe
	Family   string `json:"family"`
	// Files are the memory files the snapshot needs (in the tree's families/<family>).
	Files []string `json:"files"`
	Dir   string   `json:"dir"`   // nodes/<node>/<snapshot>
	Bytes int64    `json:"bytes"` // physical bytes of Dir
}

// Node is one node's metadata.
type Node struct {
	ID       string   `json:"id"`
	Name     string   `json:"name,omitempty"`
	Parent   string   `json:"parent,omitempty"`
	Children []string `json:"children"`
	State    string   `json:"state"`
	Label    string   `json:"label,omitempty"`
	Kind     string   `json:"kind"`
	Members  int      `json:"member_count"`
	// MemberIDs are a cluster node's containers, its leader (the node's id) first.
	MemberIDs []string `json:"member_ids,omitempty"`
	// DirtyPages are the pages its last dump captured (its delta over the memory files).
	DirtyPages int64 `json:"dirty_pages"`
	// HasKeyframe: the node owns a keyframe (Keyframe, generation Generation); forks of
	// it map that snapshot's files.
	HasKeyframe bool   `json:"has_keyframe"`
	Keyframe    string `json:"keyframe,omitempty"`
	Generation  int    `json:"generation"`
	// KeyframeBytes are the physical bytes its keyframe wrote (the memory files named
	// after it and its image); DeltaBytes are the physical bytes on disk of its suspended
	// snapshot (images and layer).
	KeyframeBytes int64 `json:"keyframe_bytes"`
	DeltaBytes    int64 `json:"delta_bytes"`
	// RAMBytes is its cgroup's charge when live (at the last look), or at suspend.
	RAMBytes int64 `json:"ram_bytes"`
	// SharedRAMBytes: the memory files its keyframe needs still on tmpfs (its forks map
	// them), each file counted for one node of the tree only (the oldest that needs it).
	SharedRAMBytes int64 `json:"shared_ram_bytes"`
	// DiskBytes: its packed snapshots plus its share of the packed memory files.
	DiskBytes  int64     `json:"disk_bytes"`
	Created    time.Time `json:"created"`
	LastActive time.Time `json:"last_active"`
	Protected  bool      `json:"protected"`
	// From is the snapshot a rollback restored it from.
	From     string   `json:"from,omitempty"`
	Packed   []Packed `json:"packed,omitempty"`
	CPUTicks uint64   `json:"cpu_ticks"`
	// KSMMergingPages are the node's pages ksmd merged (a live node of a ksm tree).
	KSMMergingPages int64 `json:"ksm_merging_pages,omitempty"`
}

// Tree is tree.json.
type Tree struct {
	Kind    string            `json:"kind"`
	Version int               `json:"version"`
	ID      string            `json:"id"`
	Name    string            `json:"name,omitempty"`
	Root    string            `json:"root"`
	Budget  Budget            `json:"budget"`
	KSM     bool              `json:"ksm"`
	Cgroup  map[string]string `json:"cgroup"`
	Created time.Time         `json:"created"`
	Dropped bool              `json:"dropped,omitempty"`
	Usage   Usage             `json:"usage"`
	Nodes   map[string]*Node  `json:"nodes"`
}

// Dir is the tree's directory.
func (t *Tree) Dir() string { return TreeDir(t.ID) }

// NodeList is the nodes, oldest first (root first).
func (t *Tree) NodeList() []*Node {
	out := make([]*Node, 0, len(t.Nodes))
	for _, n := range t.Nodes {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Created.Equal(out[j].Created) {
			return out[i].ID < out[j].ID
		}
		return out[i].Created.Before(out[j].Created)
	})
	return out
}

// Subtree is id and every node below it, deepest first.
func (t *Tree) Subtree(id string) []string {
	var out []string
	var walk func(string)
	walk = func(n string) {
		for _, k := range t.NodeList() {
			if k.Parent == n && k.ID != n {
				walk(k.ID)
			}
		}
		out = append(out, n)
	}
	walk(id)
	return out
}

// FillChildren recomputes every node's Children from the parent links.
func (t *Tree) FillChildren() {
	for _, n := range t.Nodes {
		n.Children = []string{}
	}
	for _, n := range t.NodeList() {
		if p := t.Nodes[n.Parent]; p != nil && n.Parent != n.ID {
			p.Children = append(p.Children, n.ID)
		}
	}
}

// SortTrees orders trees oldest first.
func SortTrees(ts []*Tree) {
	sort.Slice(ts, func(i, j int) bool {
		if ts[i].Created.Equal(ts[j].Created) {
			return ts[i].ID < ts[j].ID
		}
		return ts[i].Created.Before(ts[j].Created)
	})
}

// TreesDir holds every tree ($LAZYFORK_ROOT/trees).
func TreesDir() string { return filepath.Join(paths.Root(), "trees") }

// TreeDir is one tree's directory.
func TreeDir(id string) string { return filepath.Join(TreesDir(), id) }

// IDRe is a tree id: t and 12 hex digits.
var IDRe = regexp.MustCompile(`^t[0-9a-f]{12}$`)

// NewID is a fresh tree id no tree uses.
func NewID() string {
	return resolve.NewID("t", func(id string) bool {
		_, err := os.Stat(TreeDir(id))
		return !errors.Is(err, os.ErrNotExist)
	})
}

// ReadID reads tree.json of tree id (no lock) and checks it.
func ReadID(id string) (*Tree, error) {
	if !IDRe.MatchString(id) {
		return nil, fmt.Errorf("%w: %q", ErrNoTree, id)
	}
	var t Tree
	if err := fsutil.ReadJSON(filepath.Join(TreeDir(id), "tree.json"), &t); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", ErrNoTree, id)
		}
		return nil, fmt.Errorf("read tree %s: %w", id, err)
	}
	if t.Kind != Kind || t.Version != Version {
		return nil, fmt.Errorf("read tree %s: kind %q version %d not supported (want %s %d)", id, t.Kind, t.Version, Kind, Version)
	}
	if t.ID != id {
		return nil, fmt.Errorf("read tree %s: tree.json names tree %q", id, t.ID)
	}
	if t.Nodes == nil {
		t.Nodes = map[string]*Node{}
	}
	if len(t.Cgroup) > 0 {
		if err := owned.Check(t.Cgroup); err != nil {
			return nil, fmt.Errorf("read tree %s: %w", id, err)
		}
	}
	for id, n := range t.Nodes {
		if n.ID != id || !containerIDRe.MatchString(id) {
			return nil, fmt.Errorf("read tree %s: bad node %q", t.ID, id)
		}
		for i, m := range n.MemberIDs {
			if !containerIDRe.MatchString(m) || (i == 0) != (m == n.ID) {
				return nil, fmt.Errorf("read tree %s: node %s: bad member %q", t.ID, id, m)
			}
		}
		for _, p := range n.Packed {
			if err := CheckPacked(&t, n, p); err != nil {
				return nil, fmt.Errorf("read tree %s: %w", t.ID, err)
			}
		}
	}
	t.FillChildren()
	return &t, nil
}

var (
	containerIDRe = regexp.MustCompile(`^[0-9a-f]{12}$`)
	// SnapIDRe is a snapshot or family id.
	SnapIDRe = regexp.MustCompile(`^s[0-9a-f]{12}$`)
	// Compiled on first use: its bounded repetition cost every process start ~0.3 ms.
	memFileRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_.+-]{1,200}$`) })
)

// CheckPacked refuses a packed entry whose names could lead outside the tree's directory
// (tree.json is as hostile as any stage document).
func CheckPacked(t *Tree, n *Node, p Packed) error {
	if !SnapIDRe.MatchString(p.Snapshot) || !SnapIDRe.MatchString(p.Family) {
		return fmt.Errorf("node %s: packed snapshot %q of family %q: bad id", n.ID, p.Snapshot, p.Family)
	}
	if p.Dir != filepath.Join(TreeDir(t.ID), "nodes", n.ID, p.Snapshot) {
		return fmt.Errorf("node %s: packed snapshot dir %q is not the tree's", n.ID, p.Dir)
	}
	for _, f := range p.Files {
		if !memFileRe().MatchString(f) || f == "." || f == ".." {
			return fmt.Errorf("node %s: packed memory file %q: bad name", n.ID, f)
		}
	}
	return nil
}

// Save writes tree.json atomically.
func (t *Tree) Save() error {
	t.Kind, t.Version = Kind, Version
	t.FillChildren()
	if err := os.MkdirAll(t.Dir(), 0o700); err != nil {
		return fmt.Errorf("save tree %s: %w", t.ID, err)
	}
	return fsutil.WriteJSON(filepath.Join(t.Dir(), "tree.json"), t)
}

// Lock takes tree id's flock (the same kind of lock as the container store's); create
// makes the tree's directory first (a new tree), else a tree gone meanwhile is ErrNoTree.
func Lock(id string, create bool) (unlock func(), err error) {
	if create {
		if err := os.MkdirAll(TreeDir(id), 0o700); err != nil {
			return nil, fmt.Errorf("lock tree %s: %w", id, err)
		}
	} else if _, err := os.Stat(TreeDir(id)); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNoTree, id)
	}
	f, err := os.OpenFile(filepath.Join(TreeDir(id), ".lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNoTree, id) // pruned meanwhile
	}
	if err != nil {
		return nil, fmt.Errorf("lock tree %s: %w", id, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock tree %s: %w", id, err)
	}
	return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
}

// StoreDir is where the tree keeps packed memory files of a family.
func (t *Tree) StoreDir(family string) string {
	return filepath.Join(t.Dir(), "families", family)
}

// NodeDir is a node's directory of packed snapshots.
func NodeDir(treeID, node string) string {
	return filepath.Join(TreeDir(treeID), "nodes", node)
}

// PackedRole is n's packed snapshot of role (suspend or keyframe), or nil.
func (n *Node) PackedRole(role string) *Packed {
	for i := range n.Packed {
		if n.Packed[i].Role == role {
			return &n.Packed[i]
		}
	}
	return nil
}

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
		if !IDRe.MatchString(e.Name()) {
			continue
		}
		t, err := ReadID(e.Name())
		if err != nil {
			if errors.Is(err, ErrNoTree) {
				continue // being created or removed
			}
			return nil, err
		}
		out = append(out, t)
	}
	SortTrees(out)
	return out, nil
}

// Resolve finds a tree's id by id, unique id prefix (two characters at least) or name.
func Resolve(ref string) (string, error) {
	if IDRe.MatchString(ref) {
		if _, err := os.Stat(TreeDir(ref)); err == nil {
			return ref, nil
		}
	}
	all, err := ReadAll()
	if err != nil {
		return "", err
	}
	t, found, err := resolve.Find(all, ref, "tree", 2, func(t *Tree) (string, string) { return t.ID, t.Name })
	if err != nil {
		return "", err
	}
	if !found {
		return "", fmt.Errorf("%w %q (see: lazyfork tree ls)", ErrNoTree, ref)
	}
	return t.ID, nil
}

// Read reads tree ref (id, unique id prefix or name) as written by its last operation,
// without locking or measuring it.
func Read(ref string) (*Tree, error) {
	id, err := Resolve(ref)
	if err != nil {
		return nil, err
	}
	return ReadID(id)
}
