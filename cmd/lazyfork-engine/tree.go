package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/alecthomas/kong"

	"github.com/lazyfork/lazyfork/lib/budget"
	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/exitcode"
	"github.com/lazyfork/lazyfork/lib/snaptree"
)

// treeGroup is `lazyfork tree`: with no subcommand the lineage view of every container
// (as before snapshot trees), else an operation on a snapshot tree (lib/snaptree).
type treeGroup struct {
	Lineage   treeCmd          `cmd:"" default:"withargs" help:"Draw the lineage of forks (the default)."`
	Create    treeCreateCmd    `cmd:"" help:"Create a snapshot tree rooted at a new container from an image; its keyframe is written at once."`
	Adopt     treeAdoptCmd     `cmd:"" help:"Create a snapshot tree rooted at a running container."`
	Ls        treeLsCmd        `cmd:"" help:"List snapshot trees with their usage against their budget."`
	Nodes     treeNodesCmd     `cmd:"" help:"List a tree's nodes."`
	Fork      treeForkCmd      `cmd:"" help:"Fork N branches from a live or suspended node (one dump for the batch)."`
	Prepare   treePrepareCmd   `cmd:"" help:"Write a node's keyframe now (idempotent); --refresh writes a new generation."`
	Rollback  treeRollbackCmd  `cmd:"" help:"Start a new branch from a node's keyframe (its earlier state); nothing else changes."`
	Suspend   treeNodeCmd      `cmd:"" help:"Write a node's state to disk and free its RAM."`
	Resume    treeNodeCmd      `cmd:"" help:"Restore a suspended node in place (same id and name)."`
	Protect   treeNodeCmd      `cmd:"" help:"Exclude a node from eviction."`
	Unprotect treeNodeCmd      `cmd:"" help:"Let eviction choose a node again."`
	Prune     treeNodeCmd      `cmd:"" help:"Delete a node and its whole subtree (processes, snapshots, memory files, disk); the root deletes the tree."`
	Drop      treeTreeCmd      `cmd:"" help:"Forget a tree: suspend its live nodes to disk and print where the state is kept."`
	Evict     treeTreeCmd      `cmd:"" help:"Suspend least-recently-active unprotected nodes now, while the tree is at 85% of its RAM budget."`
	Budget    treeSetBudgetCmd `cmd:"" name:"set-budget" help:"Change a tree's budget (and its cgroup's limits); evicts what the new budget asks for."`
}

// budgetFlags are a tree's budget on the command line; 0 takes lib/budget's default.
type budgetFlags struct {
	MaxLive       int    `name:"max-live" help:"Most live containers (default: 16, lib/budget's)."`
	MaxRAM        string `name:"max-ram" help:"Most live RAM, bytes with k, m or g (default: 4g)."`
	MaxDisk       string `name:"max-disk" help:"Most disk for suspended state, bytes with k, m or g (default: 16g)."`
	MaxChainDepth int    `name:"max-chain-depth" default:"-1" help:"Most non-keyframe hops from a resumed node to its keyframe (default: 1)."`
}

func (b budgetFlags) budget() (*snaptree.Budget, error) {
	out := snaptree.DefaultBudget()
	if b.MaxLive != 0 {
		out.MaxLive = b.MaxLive
	}
	for _, f := range []struct {
		flag, val string
		dst       *int64
	}{{"--max-ram", b.MaxRAM, &out.MaxRAMBytes}, {"--max-disk", b.MaxDisk, &out.MaxDiskBytes}} {
		if f.val == "" {
			continue
		}
		n, err := parseBytes(f.val)
		if err != nil {
			return nil, exitcode.With(fmt.Errorf("%s %q: give a positive size in bytes or with a k, m or g suffix, e.g. 512m", f.flag, f.val), exitcode.Usage)
		}
		*f.dst = n
	}
	if b.MaxChainDepth >= 0 {
		out.MaxChainDepth = b.MaxChainDepth
	}
	if err := out.Validate(); err != nil {
		return nil, err
	}
	return &out, nil
}

// verb is the tree subcommand being run ("suspend" in "tree suspend <tree> <node>").
func verb(k *kong.Context) string {
	if f := strings.Fields(k.Command()); len(f) > 1 {
		return f[1]
	}
	return ""
}

// manager is the daemon's tree routes while a daemon serves this state (treeops.go),
// else lib/snaptree in this process, reporting evictions on stderr.
func manager(g *Globals) (treeOps, error) {
	report := func(e snaptree.Event) {
		if e.Kind == "evict" {
			fmt.Fprintf(os.Stderr, "lazyfork: tree %s: evicted (suspended to disk) %s\n", e.Tree, strings.Join(e.Nodes, ", "))
		}
	}
	if cl := g.Daemon(context.Background()); cl != nil {
		return treesViaDaemon{cl, report}, nil
	}
	rt, err := open(g)
	if err != nil {
		return nil, err
	}
	return &snaptree.Manager{RT: rt, OnEvent: report}, nil
}

type treeCreateCmd struct {
	Image   string   `arg:"" help:"Image of the root container."`
	Command []string `arg:"" optional:"" passthrough:"" help:"Command of the root container (after --)."`
	Root    string   `name:"root-name" help:"Name of the root container."`
	Env     []string `short:"e" help:"Environment variable KEY=VALUE (repeatable)."`
	newTreeFlags

	// As lazyfork create.
	Hook       string `help:"Runtime hook socket inside the root container (see lazyfork create --help)."`
	User       string `short:"u" help:"User to run as: uid[:gid] or names from the image."`
	Memory     string `short:"m" help:"Memory limit of the root and each fork (k, m or g suffix)."`
	PidsLimit  int64  `name:"pids-limit" help:"Most tasks the root and each fork may hold."`
	Privileged bool   `help:"Run without confinement (see docs/security.md)."`
	Net        string `default:"none" enum:"none,host" help:"Network: none or host (see lazyfork create --help)."`
}

// newTreeFlags are what tree create and tree adopt share: the new tree's name, root
// label, KSM and budget.
type newTreeFlags struct {
	Name  string `help:"Name of the tree."`
	Label string `help:"Label of the root node."`
	KSM   bool   `name:"ksm" help:"Mark the tree's memory mergeable by KSM (same-tenant hosts only)."`
	JSON  bool   `help:"Print the tree as JSON."`
	budgetFlags
}

func (f newTreeFlags) options() (snaptree.CreateOptions, error) {
	b, err := f.budget()
	return snaptree.CreateOptions{Name: f.Name, Budget: b, KSM: f.KSM, Label: f.Label}, err
}

func (c *treeCreateCmd) Run(ctx context.Context, g *Globals) error {
	o, err := c.options()
	if err != nil {
		return err
	}
	mem, err := limits(c.Memory, c.PidsLimit)
	if err != nil {
		return err
	}
	m, err := manager(g)
	if err != nil {
		return err
	}
	o.Container = container.CreateOptions{Image: c.Image, Name: c.Root, Command: dashdash(c.Command), Env: c.Env, Progress: os.Stderr,
		Hook: c.Hook, User: c.User, Memory: mem, PidsLimit: c.PidsLimit, Privileged: c.Privileged, Net: c.Net}
	t, err := m.Create(ctx, o)
	return printTree(t, err, c.JSON)
}

type treeAdoptCmd struct {
	Container string `arg:"" help:"Running container (name, id or unique id prefix) to root the tree; a cluster member roots it at its whole cluster (one node of kind cluster)."`
	newTreeFlags
}

func (c *treeAdoptCmd) Run(ctx context.Context, g *Globals) error {
	o, err := c.options()
	if err != nil {
		return err
	}
	m, err := manager(g)
	if err != nil {
		return err
	}
	t, err := m.Adopt(ctx, c.Container, o)
	return printTree(t, err, c.JSON)
}

// printTree prints a new tree: its id, or the document.
func printTree(t *snaptree.Tree, err error, asJSON bool) error {
	if err != nil {
		return err
	}
	if r := t.Nodes[t.Root]; !asJSON && r.Kind == snaptree.NodeKindCluster {
		fmt.Fprintf(os.Stderr, "lazyfork: tree %s rooted at cluster %s (%d members)\n", t.ID, t.Root, r.Members)
	} else if !asJSON {
		fmt.Fprintf(os.Stderr, "lazyfork: tree %s rooted at %s (keyframe %s)\n", t.ID, t.Root, r.Keyframe)
	}
	return printResult(t, t.ID, asJSON)
}

type treeLsCmd struct {
	JSON bool `help:"Print the trees as JSON (one array)."`
}

func (c *treeLsCmd) Run(ctx context.Context, g *Globals) error {
	m, err := manager(g)
	if err != nil {
		return err
	}
	all, err := m.List()
	if err != nil {
		return err
	}
	if c.JSON {
		if all == nil {
			all = []*snaptree.Tree{}
		}
		return printJSON(all)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TREE\tNAME\tROOT\tNODES\tLIVE\tRAM\tDISK\tSTATE")
	for _, t := range all {
		st := "active"
		if t.Dropped {
			st = "dropped"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d/%d\t%s/%s\t%s/%s\t%s\n", t.ID, t.Name, t.Root, len(t.Nodes),
			t.Usage.Live, t.Budget.MaxLive, budget.Bytes(t.Usage.RAMBytes), budget.Bytes(t.Budget.MaxRAMBytes),
			budget.Bytes(t.Usage.DiskBytes), budget.Bytes(t.Budget.MaxDiskBytes), st)
	}
	return w.Flush()
}

type treeNodesCmd struct {
	Tree string `arg:"" help:"Tree id, unique id prefix or name."`
	JSON bool   `help:"Print the tree document (budget, usage, nodes) as JSON."`
}

func (c *treeNodesCmd) Run(ctx context.Context, g *Globals) error {
	m, err := manager(g)
	if err != nil {
		return err
	}
	t, err := m.Get(ctx, c.Tree)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(t)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tNAME\tKIND\tPARENT\tSTATE\tLABEL\tKEYFRAME\tPROTECTED\tRAM\tDISK\tDIRTY PAGES\tLAST ACTIVE")
	for _, n := range t.NodeList() {
		kf := "-"
		if n.HasKeyframe {
			kf = fmt.Sprintf("gen %d", n.Generation)
		}
		kind := n.Kind
		if kind == snaptree.NodeKindCluster {
			kind = fmt.Sprintf("cluster/%d", n.Members)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%v\t%s\t%s\t%d\t%s ago\n", n.ID, n.Name, kind, dash(n.Parent), n.State, n.Label, kf,
			n.Protected, budget.Bytes(n.RAMBytes), budget.Bytes(n.DiskBytes), n.DirtyPages,
			time.Since(n.LastActive).Round(time.Second))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "usage: %d/%d live, RAM %s/%s, disk %s/%s, tmpfs %s\n", t.Usage.Live, t.Budget.MaxLive,
		budget.Bytes(t.Usage.RAMBytes), budget.Bytes(t.Budget.MaxRAMBytes), budget.Bytes(t.Usage.DiskBytes),
		budget.Bytes(t.Budget.MaxDiskBytes), budget.Bytes(t.Usage.TmpfsBytes))
	return nil
}

type treeForkCmd struct {
	Tree   string   `arg:"" help:"Tree id, unique id prefix or name."`
	Node   string   `arg:"" optional:"" help:"Node to fork (default: the root)."`
	N      int      `short:"n" default:"1" help:"How many forks."`
	Names  []string `name:"name" help:"Container name of each fork (repeatable)."`
	Labels []string `name:"label" help:"Label of each fork's node (repeatable)."`
	JSON   bool     `help:"Print the new nodes as JSON lines."`
}

func (c *treeForkCmd) Run(ctx context.Context, g *Globals) error {
	m, err := manager(g)
	if err != nil {
		return err
	}
	nodes, _, err := m.Fork(ctx, c.Tree, c.Node, snaptree.ForkOptions{N: c.N, Names: c.Names, Labels: c.Labels})
	// Forks made before a failure (an eviction after them) are printed too.
	for _, n := range nodes {
		if perr := printNode(n, c.JSON); perr != nil {
			return perr
		}
	}
	return err
}

func printNode(n *snaptree.Node, asJSON bool) error {
	if asJSON {
		return printJSONLine(n)
	}
	fmt.Println(n.ID)
	return nil
}

type treePrepareCmd struct {
	Tree    string `arg:"" help:"Tree id, unique id prefix or name."`
	Node    string `arg:"" optional:"" help:"Node (default: the root)."`
	Refresh bool   `help:"Write a new generation for a node that has a keyframe."`
	JSON    bool   `help:"Print the node as JSON."`
}

func (c *treePrepareCmd) Run(ctx context.Context, g *Globals) error {
	m, err := manager(g)
	if err != nil {
		return err
	}
	n, _, err := m.Prepare(ctx, c.Tree, c.Node, c.Refresh)
	if err != nil {
		return err
	}
	return printResult(n, n.Keyframe, c.JSON)
}

type treeRollbackCmd struct {
	Tree  string `arg:"" help:"Tree id, unique id prefix or name."`
	Node  string `arg:"" help:"Node whose keyframe (or suspended state) the branch starts from."`
	Name  string `help:"Container name of the new branch."`
	Label string `help:"Label of the new node."`
	JSON  bool   `help:"Print the new node as JSON."`
}

func (c *treeRollbackCmd) Run(ctx context.Context, g *Globals) error {
	m, err := manager(g)
	if err != nil {
		return err
	}
	n, _, err := m.Rollback(ctx, c.Tree, c.Node, c.Name, c.Label)
	if err != nil {
		return err
	}
	return printNode(n, c.JSON)
}

// treeNodeCmd is every operation on one node: suspend, resume, protect, unprotect, prune.
type treeNodeCmd struct {
	Tree string `arg:"" help:"Tree id, unique id prefix or name."`
	Node string `arg:"" help:"Node: container id, name or unique id prefix."`
	JSON bool   `help:"Print the result as JSON."`
}

// nodeOps are the operations on one node that answer with the node, by verb.
var nodeOps = map[string]func(m treeOps, ctx context.Context, tree, node string) (*snaptree.Node, *snaptree.Tree, error){
	"suspend": treeOps.Suspend,
	"resume":  treeOps.Resume,
	"protect": func(m treeOps, ctx context.Context, tree, node string) (*snaptree.Node, *snaptree.Tree, error) {
		return m.Protect(ctx, tree, node, true)
	},
	"unprotect": func(m treeOps, ctx context.Context, tree, node string) (*snaptree.Node, *snaptree.Tree, error) {
		return m.Protect(ctx, tree, node, false)
	},
}

func (c *treeNodeCmd) Run(ctx context.Context, g *Globals, k *kong.Context) error {
	m, err := manager(g)
	if err != nil {
		return err
	}
	verb := verb(k)
	if verb == "prune" {
		return c.prune(ctx, m)
	}
	op, ok := nodeOps[verb]
	if !ok {
		return fmt.Errorf("tree %s: unknown operation", verb)
	}
	n, _, err := op(m, ctx, c.Tree, c.Node)
	if err != nil {
		return err
	}
	return printResult(n, n.ID, c.JSON)
}

func (c *treeNodeCmd) prune(ctx context.Context, m treeOps) error {
	res, _, err := m.Prune(ctx, c.Tree, c.Node)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(res)
	}
	for _, id := range res.Pruned {
		fmt.Println(id)
	}
	fmt.Fprintf(os.Stderr, "lazyfork: pruned %d nodes; freed %s of tmpfs and %s of disk\n", len(res.Pruned),
		budget.Bytes(res.TmpfsFreed), budget.Bytes(res.DiskFreed))
	return nil
}

// treeTreeCmd is every operation on a whole tree: drop, evict.
type treeTreeCmd struct {
	Tree string `arg:"" help:"Tree id, unique id prefix or name."`
	JSON bool   `help:"Print the result as JSON."`
}

func (c *treeTreeCmd) Run(ctx context.Context, g *Globals, k *kong.Context) error {
	m, err := manager(g)
	if err != nil {
		return err
	}
	switch verb(k) {
	case "drop":
		res, _, err := m.Drop(ctx, c.Tree)
		if err != nil {
			return err
		}
		if c.JSON {
			return printJSON(res)
		}
		fmt.Println(res.Dir)
		fmt.Fprintf(os.Stderr, "lazyfork: dropped; suspended %d live nodes; the state stays in %s\n", len(res.Suspended), res.Dir)
		return nil
	default: // evict
		ids, _, err := m.Evict(ctx, c.Tree)
		if err != nil {
			return err
		}
		if c.JSON {
			if ids == nil {
				ids = []string{}
			}
			return printJSON(map[string][]string{"suspended": ids})
		}
		for _, id := range ids {
			fmt.Println(id)
		}
		return nil
	}
}

type treeSetBudgetCmd struct {
	Tree string `arg:"" help:"Tree id, unique id prefix or name."`
	JSON bool   `help:"Print the tree as JSON."`
	budgetFlags
}

func (c *treeSetBudgetCmd) Run(ctx context.Context, g *Globals) error {
	m, err := manager(g)
	if err != nil {
		return err
	}
	t, err := m.Get(ctx, c.Tree)
	if err != nil {
		return err
	}
	b := t.Budget
	nb, err := c.budget()
	if err != nil {
		return err
	}
	// Only the flags given change.
	if c.MaxLive != 0 {
		b.MaxLive = nb.MaxLive
	}
	if c.MaxRAM != "" {
		b.MaxRAMBytes = nb.MaxRAMBytes
	}
	if c.MaxDisk != "" {
		b.MaxDiskBytes = nb.MaxDiskBytes
	}
	if c.MaxChainDepth >= 0 {
		b.MaxChainDepth = nb.MaxChainDepth
	}
	t, err = m.SetBudget(ctx, c.Tree, b)
	if err != nil {
		return err
	}
	return printResult(t, t.ID, c.JSON)
}

type treeCmd struct {
	JSON bool `help:"Print the list with parents as JSON."`
}

func (c *treeCmd) Run(ctx context.Context, g *Globals) error {
	e, err := g.Engine(ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		rows, err := e.List(ctx)
		if err != nil {
			return err
		}
		return printJSON(rows)
	}
	// The forest is the engine's (daemon.Service.Tree, or the daemon's GET /tree).
	forest, err := e.Tree(ctx)
	if err != nil {
		return err
	}
	var draw func(n client.TreeNode, prefix string, last, top bool)
	draw = func(n client.TreeNode, prefix string, last, top bool) {
		branch, next := "├── ", "│   "
		if last {
			branch, next = "└── ", "    "
		}
		if top {
			branch, next = "", ""
		}
		label := n.ID
		if n.Name != "" {
			label += " (" + n.Name + ")"
		}
		orphan := ""
		if top && n.Parent != "" {
			orphan = "  [parent " + n.Parent + " deleted]"
		}
		fmt.Printf("%s%s%s  %s  %s%s\n", prefix, branch, label, n.State, humanBytes(n.MemoryBytes), orphan)
		for i, k := range n.Children { // oldest first
			draw(k, prefix+next, i == len(n.Children)-1, false)
		}
	}
	for _, n := range forest {
		draw(n, "", true, true)
	}
	return nil
}
