// Command lazyfork (alias lfork) is the porcelain: it composes the lib packages the
// lf-* stage binaries are built from.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup/owned"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/exitcode"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/stagecmd"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// Globals are shared by every command; env vars configure them too.
type Globals struct {
	stagecmd.Roots // --root and --run, as every stage takes them
	container.Config
	Socket string `help:"Unix socket of the daemon; commands go through it when a daemon answers there." env:"LAZYFORK_SOCKET" default:"${socket}"`
	Local  bool   `help:"Run in this process even if a daemon is running." env:"LAZYFORK_LOCAL"`
	Trace  bool   `help:"Print on stderr how long each step took, the daemon's steps included." env:"LAZYFORK_TRACE"`
}

type CLI struct {
	Globals

	Create  createCmd  `cmd:"" help:"Create and start a container from an image."`
	Fork    forkCmd    `cmd:"" help:"Fork a running (or stopped) container into N copies that continue from the same instruction."`
	Cluster clusterCmd `cmd:"" help:"Containers sharing one network namespace (create --join): fork them as one cut."`
	Stop    stopCmd    `cmd:"" help:"Snapshot a container and end its processes; it stays forkable and can be started again."`
	Start   startCmd   `cmd:"" help:"Restart a stopped container from its snapshot."`
	Exec    execCmd    `cmd:"" help:"Run a command inside a container."`
	Shell   shellCmd   `cmd:"" help:"Open an interactive shell inside a container."`
	Attach  attachCmd  `cmd:"" help:"Stream a container's output (Ctrl-C detaches)."`
	Freeze  freezeCmd  `cmd:"" help:"Pause every process of a container."`
	Thaw    thawCmd    `cmd:"" help:"Resume a frozen container."`
	Delete  deleteCmd  `cmd:"" aliases:"rm" help:"Stop a container and remove everything it holds."`
	List    listCmd    `cmd:"" aliases:"ls,ps" help:"List containers."`
	Tree    treeGroup  `cmd:"" help:"Draw the lineage of forks (no subcommand), or manage snapshot trees."`
	Stats   statsCmd   `cmd:"" help:"Memory, snapshot and timing figures of one container."`
	GC      gcCmd      `cmd:"" name:"gc" help:"Remove memory files, layers and snapshots nothing references any more."`
	Status  statusCmd  `cmd:"" help:"Host facts and container totals."`
	Doctor  doctorCmd  `cmd:"" help:"Check every host requirement and name the fix for each missing one."`
	Image   imageCmd   `cmd:"" help:"Manage the local image store."`
	Daemon  daemonCmd  `cmd:"" help:"Run or manage the daemon (HTTP/JSON API on a unix socket)."`
}

func main() {
	rec := trace.New() // from the start of main; used only with --trace
	criu.MaybeKdatHelper()
	container.MaybeInit()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	parsed := time.Now()
	kctx, cli := parse(ctx, os.Args[1:])
	// The roots and the operator's cgroup parent come from the flags or the environment
	// (kong's env tags), here only.
	paths.Set(cli.Root, cli.Run)
	owned.SetParent(cli.CgroupParent)
	if cli.Trace {
		ctx := trace.With(ctx, rec)
		trace.Add(ctx, "parse the command line", parsed, time.Since(parsed))
		kctx.BindTo(ctx, (*context.Context)(nil))
	}
	err := kctx.Run(cli)
	stop()
	if cli.Trace {
		rec.Write(os.Stderr)
	}
	if err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		fmt.Fprintf(os.Stderr, "lazyfork: %v\n", err)
		os.Exit(exitcode.Of(err)) // the stages' statuses: 3 not found, 4 invalid state, ...
	}
}

// exitError carries a child's exit code through without printing anything.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// open applies the globals and opens the runtime.
func (g *Globals) open() (*container.Runtime, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("lazyfork must run as root (namespaces, mounts, cgroups, CRIU): try sudo")
	}
	if err := paths.Ensure(); err != nil {
		return nil, err
	}
	return container.Open(g.Config)
}
