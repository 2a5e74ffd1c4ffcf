// Command lf-cgroup makes and drives one LazyFork container's cgroup (memory, pids,
// freezer) and prints it as JSON, so later stages can join, freeze, measure or remove it.
package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/alecthomas/kong"

	"github.com/lazyfork/lazyfork/lib/cgroup"
)

type cli struct {
	Create createCmd `cmd:"" help:"Create a new group (fails if it exists); prints it."`
	Stats  opCmd     `cmd:"" help:"Print memory, pids and freezer state."`
	Freeze opCmd     `cmd:"" help:"Freeze every task (bounded wait); prints the group."`
	Thaw   opCmd     `cmd:"" help:"Thaw the group; prints the group."`
	Kill   opCmd     `cmd:"" help:"SIGKILL every process and wait until empty; prints the group."`
	Remove opCmd     `cmd:"" help:"Remove the group in every hierarchy (fails if processes remain)."`
	Procs  opCmd     `cmd:"" help:"List the processes in the group."`
	Host   hostCmd   `cmd:"" help:"Print where the host's cgroup controllers are."`
}

// doc is the group as printed by create and read back by the other commands.
type doc struct {
	*cgroup.Cgroup
	CriuCgroupRoot []string `json:"criu_cgroup_root"` // values for criu restore --cgroup-root
	FreezerDir     string   `json:"freezer_dir"`      // value for criu dump --freeze-cgroup
}

func newDoc(c *cgroup.Cgroup) doc {
	return doc{Cgroup: c, CriuCgroupRoot: c.CriuRootArgs(), FreezerDir: c.FreezerDir()}
}

// opCmd is every command on an existing group, named by its JSON (stdin or --in) or by
// --name [--parent]. freeze, thaw and kill print the group again so they chain in a pipe.
type opCmd struct {
	In     string `help:"Read the group JSON from FILE instead of stdin." placeholder:"FILE"`
	Name   string `help:"Find the group by name (default paths) instead of reading JSON."`
	Parent string `help:"Parent cgroup path used with --name." env:"LAZYFORK_CGROUP_PARENT"`
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
	in := os.Stdin
	if t.In != "" && t.In != "-" {
		f, err := os.Open(t.In)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		in = f
	}
	var d doc
	if err := json.NewDecoder(io.LimitReader(in, 1<<20)).Decode(&d); err != nil || d.Cgroup == nil {
		return nil, fmt.Errorf("read cgroup JSON: %w (pass the output of `lf-cgroup create`, or --name)",
			cmp.Or(err, errors.New("no cgroup in it")))
	}
	return cgroup.LoadOwned(d.Paths)
}

type createCmd struct {
	Name   string `arg:"" help:"Group name (a safe file name, e.g. the container id)."`
	Parent string `help:"Parent cgroup path for every hierarchy (default: lazyfork under the caller's own cgroups)." env:"LAZYFORK_CGROUP_PARENT"`
}

func (c *createCmd) Run(w io.Writer) error {
	if err := cgroup.CheckParent(c.Parent); err != nil {
		return err
	}
	g, err := cgroup.Create(c.Name, c.Parent)
	if err != nil {
		return err
	}
	return emit(w, newDoc(g))
}

func (c *opCmd) Run(kctx *kong.Context, w io.Writer) error {
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
			Name string `json:"name"`
			cgroup.Stats
		}{g.Name, s}
	case "procs":
		pids, err := g.Procs()
		if err != nil {
			return err
		}
		out = map[string]any{"name": g.Name, "pids": append([]int{}, pids...)}
	case "remove":
		err = g.Remove()
		out = map[string]any{"name": g.Name, "paths": g.Paths, "removed": true}
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
	return emit(w, out)
}

type hostCmd struct{}

func (hostCmd) Run(w io.Writer) error {
	f, err := cgroup.HostFacts()
	if err != nil {
		return err
	}
	return emit(w, f)
}

func emit(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }

func main() {
	var c cli
	ctx := kong.Parse(&c, kong.Name("lf-cgroup"),
		kong.Description("Create and drive LazyFork container cgroups (JSON on stdout)."),
		kong.BindTo(io.Writer(os.Stdout), (*io.Writer)(nil)))
	if err := ctx.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "lf-cgroup: %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
		if errors.Is(err, cgroup.ErrExists) {
			os.Exit(3)
		}
		os.Exit(1)
	}
}
