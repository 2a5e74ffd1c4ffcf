// Command lf-restore restores a snapshot N times concurrently. Each fork is a new
// container (own namespaces, cgroup, overlay upper, hostname, tree record) mapping the
// family memory files. It reads snapshot JSON on stdin (or a snapshot directory/id as
// argument) and prints one lazyfork.fork JSON line per fork.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/lazyfork/lazyfork/lib/cgroup/owned"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/stagecmd"
	"github.com/lazyfork/lazyfork/lib/trace"
)

type cli struct {
	hook.Flags
	stagecmd.ExplainFlag
	stagecmd.Roots
	container.Config
	Snapshot string   `arg:"" optional:"" help:"Snapshot directory or id; - or nothing: snapshot JSON on stdin."`
	N        int      `short:"n" default:"1" help:"How many forks."`
	Name     []string `help:"Name for a fork (repeat for several)."`
	Parallel int      `help:"Concurrent restores (default: number of CPUs)."`
	Rm       bool     `help:"Remove the snapshot and its checkpoint afterwards (memory files and layers stay while forks use them)."`
	// For comparison (bench/): the restore path LazyFork used before the criu service.
	PerForkCriu bool `help:"Start a criu (swrk) per fork instead of serving the batch from one criu service (slower)."`
	Progress    bool `help:"As each fork starts running, write its lazyfork.fork JSON line on stderr (for monitors such as bench/; stdout still gets the whole batch once it stands)."`
	Trace       bool `help:"At the end, print on stderr how long each step of each fork took (lib/trace)."`
}

func main() {
	criu.MaybeKdatHelper()
	var c cli
	stagecmd.Parse(&c, "lf-restore", "Restore a snapshot as N forks; prints one JSON line per fork.",
		"lf-dump c1 | lf-memfile | lf-restore -n 10\nlf-restore -n 3 --name a --name b --explain s0123456789ab")
	stagecmd.Run("lf-restore", func(ctx context.Context) error { return run(ctx, c) })
}

func run(ctx context.Context, c cli) error {
	owned.SetParent(c.CgroupParent)
	if c.Trace {
		rec := trace.New()
		ctx = trace.With(ctx, rec)
		defer rec.Write(os.Stderr)
	}
	rt, err := container.Open(c.Config)
	if err != nil {
		return err
	}
	arg := c.Snapshot
	if arg == "-" {
		arg = ""
	}
	s, err := fork.ReadSnapshotArg(arg)
	if err != nil {
		return err
	}
	progress := json.NewEncoder(os.Stderr)
	// Lines are printed only once the whole batch stands: a failed batch is undone.
	forks, err := fork.Restore(ctx, rt, s, fork.RestoreOptions{N: c.N, Names: c.Name, Parallel: c.Parallel, PerForkCriu: c.PerForkCriu, Hook: c.Flags.Options(),
		OnFork: func(f stage.Fork) {
			if c.Progress {
				_ = progress.Encode(f)
				return
			}
			fmt.Fprintf(os.Stderr, "fork %s running (pid %d, %.0f ms)\n", f.ID, f.Pid, f.RestoreMs)
		}})
	if err != nil {
		return err
	}
	c.Tell(stage.Restored{Snapshot: s, Forks: forks})
	for _, f := range forks {
		if err := stagecmd.Print(f); err != nil {
			return err
		}
	}
	if c.Rm {
		if err := fork.RemoveSnapshot(s); err != nil {
			return err
		}
		return fork.GC(rt)
	}
	return nil
}
