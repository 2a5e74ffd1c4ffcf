// Command lazyfork (alias lfork) is the porcelain users type. This binary is the client
// half: it runs the container commands of lib/porcelain (create, fork, exec, list, ...)
// through a running daemon, and links nothing of the runtime, so that it starts about
// as fast as a small Go binary (each fork or exec through the daemon pays it). Every other
// command line (help, a usage error, tree, image, doctor, daemon), and every command that
// no daemon serves (none running, another state, --local), it hands unchanged to
// lazyfork-engine (cmd/lazyfork-engine) next to it, which runs the same commands in process.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"syscall"
	"time"

	"github.com/alecthomas/kong"

	"github.com/lazyfork/lazyfork/lib/porcelain"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// EngineName is the file name of the binary that runs what this one does not.
const EngineName = "lazyfork-engine"

func main() {
	rec := trace.New() // from the start of main; used only with --trace
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	parsed := time.Now()
	args := os.Args[1:]
	one, g := porcelain.OneCommand(reflect.TypeOf(porcelain.Commands{}), args)
	if one == nil {
		handOver()
	}
	p, err := kong.New(one, porcelain.Options(ctx)...)
	if err != nil {
		handOver()
	}
	kctx, err := p.Parse(args)
	if err != nil {
		handOver() // the engine parses with the whole CLI and words the error
	}
	// Called by a command before it does anything else, when no daemon serves its state.
	porcelain.LocalEngine = func(context.Context, *porcelain.Globals) (porcelain.Engine, error) {
		handOver()
		return nil, nil
	}
	porcelain.Run(ctx, kctx, g, rec, parsed)
}

// handOver replaces this process with lazyfork-engine next to it, with the same command
// line and environment; it returns only by exiting when that cannot start.
func handOver() {
	exe, err := os.Executable()
	if err == nil {
		exe = filepath.Join(filepath.Dir(exe), EngineName)
		err = syscall.Exec(exe, os.Args, os.Environ())
	}
	fmt.Fprintf(os.Stderr, "lazyfork: cannot start %s (%v): it runs every command no daemon serves; build it with make build, or reinstall (make install, or the wheel)\n", exe, err)
	os.Exit(1)
}
