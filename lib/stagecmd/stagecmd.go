// Package stagecmd is what every stage binary's main shares: a context that Ctrl-C and
// SIGTERM cancel (so a stage undoes half-made work instead of dying mid-way), and one
// line on stderr plus exit status 1 on error.
package stagecmd

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/lazyfork/lazyfork/lib/paths"
)

// Run runs fn and exits the process with its outcome.
func Run(name string, fn func(ctx context.Context) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := paths.Ensure() // state roots 0700, root's, no symlinks: refuse anything else
	if err == nil {
		err = fn(ctx)
	}
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}
