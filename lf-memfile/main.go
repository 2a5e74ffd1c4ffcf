// Command lf-memfile rewrites a dumped snapshot's CRIU image so its memory lives in the
// family's memory files on tmpfs (sparse files every fork maps MAP_PRIVATE). It reads the
// snapshot JSON of lf-dump on stdin (or a snapshot directory/id as argument) and prints
// the snapshot JSON again, now in state "memfiled".
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kong"

	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/stage"
)

type cli struct {
	Snapshot      string `arg:"" optional:"" help:"Snapshot directory or id (default: snapshot JSON on stdin)."`
	Force         bool   `help:"Rewrite even if the image maps jemalloc, mimalloc or tcmalloc."`
	NoFilePrivate bool   `help:"Leave copied-on-write library pages in the image (per-fork floor ~2 MB)."`
	Rebase        *bool  `help:"Force (or with --no-rebase forbid) writing fresh memory files for a fork's delta." negatable:""`
}

func main() {
	var c cli
	kong.Parse(&c, kong.Name("lf-memfile"), kong.Description("Move a CRIU image's memory into tmpfs memory files; prints snapshot JSON."))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintf(os.Stderr, "lf-memfile: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c cli) error {
	var s *stage.Snapshot
	var err error
	if c.Snapshot != "" {
		s, err = fork.LoadSnapshot(c.Snapshot)
	} else {
		s, err = stage.ReadSnapshot(os.Stdin)
	}
	if err != nil {
		return err
	}
	s, err = fork.Memfile(ctx, s, fork.MemfileOptions{Force: c.Force, NoFilePrivate: c.NoFilePrivate, Rebase: c.Rebase})
	if err != nil {
		return err
	}
	m := s.Memfile
	fmt.Fprintf(os.Stderr, "memfiled %s: %d files, %d pages moved (%.1f MB in %.0f ms, %.0f MB/s), %d pages left in the image\n",
		s.ID, m.Files, m.PagesMoved, float64(m.BytesWritten)/1e6, m.Ms, m.MBPerSec, m.PagesKept)
	return json.NewEncoder(os.Stdout).Encode(s)
}
