// Command lf-cgroup makes and drives one LazyFork container's cgroup (memory, pids,
// freezer) and prints it as a lazyfork.cgroup document, so later stages can join,
// freeze, measure or remove it.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"

	"github.com/alecthomas/kong"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/cgroup/owned"
	"github.com/lazyfork/lazyfork/lib/exitcode"
	"github.com/lazyfork/lazyfork/lib/stagecmd"
)

type cli struct {
	stagecmd.ExplainFlag
	stagecmd.Roots
	CgroupParent string `help:"The operator's parent cgroup path: create and --name use it without --parent, and groups directly under it count as LazyFork's (default: lazyfork under the caller's own cgroups on v1, /lazyfork on v2)." env:"LAZYFORK_CGROUP_PARENT"`

	Create createCmd `cmd:"" help:"Create a new group (fails if it exists); prints it."`
	Stats  opCmd     `cmd:"" help:"Print memory, pids and freezer state."`
	Freeze opCmd     `cmd:"" help:"Freeze every task (bounded wait); prints the group."`
	Thaw   opCmd     `cmd:"" help:"Thaw the group; prints the group."`
	Kill   opCmd     `cmd:"" help:"SIGKILL every process and wait until empty; prints the group."`
	Remove opCmd     `cmd:"" help:"Remove the group in every hierarchy (fails if processes remain)."`
	Procs  opCmd     `cmd:"" help:"List the processes in the group."`
	Host   hostCmd   `cmd:"" help:"Print where the host's cgroup controllers are."`
}

// Kinds of the documents lf-cgroup prints.
const (
	KindCgroup = "lazyfork.cgroup"       // create, freeze, thaw, kill, remove; the others read it
	KindStats  = "lazyfork.cgroup-stats" // stats
	KindProcs  = "lazyfork.cgroup-procs" // procs
	KindHost   = "lazyfork.cgroup-host"  // host
)

// doc is the group as printed by create and read back by the other commands.
type doc struct {
	stagecmd.Header
	*cgroup.Cgroup
	CriuCgroupRoot []string `json:"criu_cgroup_root"` // values for criu restore --cgroup-root
	FreezerDir     string   `json:"freezer_dir"`      // value for criu dump --freeze-cgroup
}

func newDoc(c *cgroup.Cgroup) doc {
	return doc{Header: stagecmd.H(KindCgroup), Cgroup: c, CriuCgroupRoot: c.CriuRootArgs(), FreezerDir: c.FreezerDir()}
}

// opCmd is every command on an existing group, named by its JSON (a file, or stdin) or by
// --name [--parent]. freeze, thaw and kill print the group again so they chain in a pipe.
type opCmd struct {
	Group  string `arg:"" optional:"" help:"File holding the group JSON (lf-cgroup create's output); - or nothing: stdin." placeholder:"FILE"`
	In     string `hidden:"" help:"Same as the argument (older scripts)." placeholder:"FILE"`
	Name   string `help:"Find the group by name (default paths) instead of reading JSON."`
	Parent string `help:"Parent cgroup path used with --name (default: --cgroup-parent)."`
}

// open loads the group only if it is one of LazyFork's (cgroup.LoadOwned): the JSON may
// be forged, and kill or remove on /system.slice must not happen.
func (t *opCmd) open() (*cgroup.Cgroup, error) {
	if t.Name != "" {
		if err := cgroup.CheckParent(t.Parent); err != nil {
			return nil, err
		}
		c, err := cgroup.Resolve(t.Name, t.Parent)
		if err != nil {
			return nil, err
		}
		return cgroup.LoadOwned(c.Paths)
	}
	var d doc
	if err := stagecmd.ReadDoc(cmp.Or(t.Group, t.In), KindCgroup, "`lf-cgroup create`, or --name", &d); err != nil {
		return nil, err
	}
	if d.Cgroup == nil {
		return nil, errors.New("read lazyfork.cgroup JSON: no group in it (pass the output of `lf-cgroup create`, or --name)")
	}
	return cgroup.LoadOwned(d.Paths)
}

type createCmd struct {
	Name   string `arg:"" help:"Group name (a safe file name, e.g. the container id)."`
	Parent string `help:"Parent cgroup path for every hierarchy (default: --cgroup-parent)."`
}

func (c *createCmd) Run(w io.Writer, x *stagecmd.ExplainFlag) error {
	if err := cgroup.CheckParent(c.Parent); err != nil {
		return err
	}
	g, err := cgroup.Create(c.Name, c.Parent)
	if errors.Is(err, cgroup.ErrExists) {
		return exitcode.With(err, exitcode.InvalidState)
	}
	if err != nil {
		return err
	}
	x.Tell(explain(g, "create"))
	return emit(w, newDoc(g))
}

// explain is the group's account of op.
func explain(g *cgroup.Cgroup, op string) stagecmd.Explainer {
	return stagecmd.ExplainFunc(func(w io.Writer) { g.Explain(w, op) })
}

func (c *opCmd) Run(kctx *kong.Context, w io.Writer, x *stagecmd.ExplainFlag) error {
	g, err := c.open()
	if err != nil {
		return err
	}
	var out any = newDoc(g)
	switch kctx.Selected().Name {
	case "stats":
		s, err := g.Stats()
		if err != nil {
			return err
		}
		out = struct {
			stagecmd.Header
			Name string `json:"name"`
			cgroup.Stats
		}{stagecmd.H(KindStats), g.Name, s}
	case "procs":
		pids, err := g.Procs()
		if err != nil {
			return err
		}
		out = struct {
			stagecmd.Header
			Name string `json:"name"`
			Pids []int  `json:"pids"`
		}{stagecmd.H(KindProcs), g.Name, append([]int{}, pids...)}
	case "remove":
		err = g.Remove()
		out = struct {
			doc
			Removed bool `json:"removed"`
		}{newDoc(g), true}
	case "freeze":
		err = g.Freeze()
	case "thaw":
		err = g.Thaw()
	case "kill":
		err = g.Kill()
	}
	if err != nil {
		return err
	}
	x.Tell(explain(g, kctx.Selected().Name))
	return emit(w, out)
}

type hostCmd struct{}

func (hostCmd) Run(w io.Writer) error {
	f, err := cgroup.HostFacts()
	if err != nil {
		return err
	}
	return emit(w, struct {
		stagecmd.Header
		cgroup.Facts
	}{stagecmd.H(KindHost), f})
}

func emit(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }

func main() {
	var c cli
	kctx := stagecmd.Parse(&c, "lf-cgroup", "Create and drive LazyFork container cgroups (JSON on stdout).",
		"lf-cgroup create c1 > cg.json\nlf-cgroup freeze --explain cg.json | lf-cgroup stats\nlf-cgroup kill cg.json | lf-cgroup remove",
		kong.BindTo(io.Writer(os.Stdout), (*io.Writer)(nil)))
	owned.SetParent(c.CgroupParent)
	// Groups live under the cgroup mounts, not the state roots.
	stagecmd.RunWithoutRoots("lf-cgroup", func(ctx context.Context) error { return kctx.Run(&c.ExplainFlag) })
}
