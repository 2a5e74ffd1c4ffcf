// Command lf-dump checkpoints a running container with CRIU and freezes its upper layer
// at the same instant. It prints the snapshot JSON (state "dumped") for lf-memfile.
//
//	lf-dump c1 | lf-memfile | lf-restore -n 10
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup/owned"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/guard"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/stagecmd"
)

type cli struct {
	hook.Flags
	stagecmd.ExplainFlag
	stagecmd.Roots
	container.Config
	Container string        `arg:"" help:"Name, id or unique id prefix of a running container; - reads its record (lf-tree get's output) on stdin."`
	Exit      bool          `help:"End the container after the dump (as lazyfork stop does)."`
	Force     bool          `help:"Dump even if the workload maps jemalloc, mimalloc or tcmalloc."`
	Wait      time.Duration `help:"How long to wait while another operation holds the container (default 5m)." default:"0s"`
}

func main() {
	criu.MaybeKdatHelper()
	var c cli
	stagecmd.Parse(&c, "lf-dump", "Checkpoint a running container (CRIU) and freeze its file system layer; prints snapshot JSON.",
		"lf-dump c1 | lf-memfile | lf-restore -n 10\nlf-dump --explain c1 > dumped.json; lf-inspect < dumped.json")
	stagecmd.Run("lf-dump", func(ctx context.Context) error { return run(ctx, c) })
}

func run(ctx context.Context, c cli) error {
	owned.SetParent(c.CgroupParent)
	rt, err := container.Open(c.Config)
	if err != nil {
		return err
	}
	ref := c.Container
	if ref == "-" {
		if ref, err = refFromStdin(); err != nil {
			return err
		}
	}
	// The container's lock, as the porcelain and the daemon take it: a `lazyfork stop`
	// of the same container waits for this dump, and this dump for it.
	ct, unlock, err := guard.Lock(ctx, rt.Containers, ref, c.Wait)
	if err != nil {
		return err
	}
	defer unlock()
	s, err := fork.Dump(ctx, rt, ct, fork.DumpOptions{Exit: c.Exit, Force: c.Force, Hook: c.Flags.Options()})
	if err != nil {
		return err
	}
	if c.Exit {
		// The processes are gone; the container's record must say so.
		if err := fork.MarkStopped(rt, ct, s); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "dumped %s: %d pages, frozen %.0f ms, wall %.0f ms\n", ct.Display(), s.Dump.PagesWritten, s.Dump.FrozenMs, s.Dump.WallMs)
	c.Tell(s)
	return stagecmd.Print(s)
}

// refFromStdin takes the id of a container record on stdin. Only the id is used: the
// record itself is read again from the store, never trusted from the pipe.
func refFromStdin() (string, error) {
	var r struct {
		Kind string `json:"kind"`
		ID   string `json:"id"`
	}
	err := json.NewDecoder(io.LimitReader(os.Stdin, stagecmd.MaxDocument)).Decode(&r)
	if err == nil && r.ID == "" {
		err = errors.New("it has no id")
	}
	if err != nil {
		return "", fmt.Errorf("read a container record on stdin: %w (pass `lf-tree get NAME`'s output, or name the container)", err)
	}
	if r.Kind != "" && r.Kind != "lazyfork.container" {
		return "", fmt.Errorf("document of kind %q on stdin, want lazyfork.container (`lf-tree get NAME`)", r.Kind)
	}
	return r.ID, nil
}
