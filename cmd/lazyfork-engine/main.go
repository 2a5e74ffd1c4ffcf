// Command lazyfork-engine is lazyfork with the runtime linked in: the container commands
// of lib/porcelain run in this process (lib/daemon.Service over lib/container and
// lib/fork), plus the daemon, snapshot trees, images and doctor. Users type lazyfork
// (cmd/lazyfork), which talks to a running daemon itself and hands everything else to
// this binary, found next to it, with the same command line.
package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup/owned"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/daemon"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/porcelain"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// Globals are shared by every command; env vars configure them too.
type Globals = porcelain.Globals

type CLI struct {
	Globals
	porcelain.Commands // create, fork, ..., status: also in cmd/lazyfork

	Tree   treeGroup `cmd:"" help:"Draw the lineage of forks (no subcommand), or manage snapshot trees."`
	Doctor doctorCmd `cmd:"" help:"Check every host requirement and name the fix for each missing one."`
	Image  imageCmd  `cmd:"" help:"Manage the local image store."`
	Daemon daemonCmd `cmd:"" help:"Run or manage the daemon (HTTP/JSON API on a unix socket)."`
}

var _ porcelain.Engine = (*daemon.Service)(nil)

func main() {
	rec := trace.New() // from the start of main; used only with --trace
	criu.MaybeKdatHelper()
	container.MaybeInit()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	porcelain.LocalEngine = func(_ context.Context, g *Globals) (porcelain.Engine, error) {
		rt, err := open(g)
		if err != nil {
			return nil, err
		}
		return daemon.NewService(rt), nil
	}
	parsed := time.Now()
	kctx, g := parse(ctx, os.Args[1:])
	// The roots and the operator's cgroup parent come from the flags or the environment
	// (kong's env tags), here only.
	paths.Set(g.Root, g.Run)
	owned.SetParent(g.CgroupParent)
	porcelain.Run(ctx, kctx, g, rec, parsed)
}

// open applies the globals and opens the runtime.
func open(g *Globals) (*container.Runtime, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("lazyfork must run as root (namespaces, mounts, cgroups, CRIU): try sudo")
	}
	if err := paths.Ensure(); err != nil {
		return nil, err
	}
	return container.Open(g.Config)
}

// The output helpers are lib/porcelain's, so that every command prints alike.
var (
	printJSON     = porcelain.PrintJSON
	printJSONLine = porcelain.PrintJSONLine
	printResult   = porcelain.PrintResult
	humanBytes    = porcelain.HumanBytes
	dash          = porcelain.Dash
	parseBytes    = porcelain.ParseBytes
	limits        = porcelain.Limits
	dashdash      = porcelain.DashDash
)

type exitError = porcelain.ExitError
