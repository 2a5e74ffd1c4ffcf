// Command lf-overlay prepares or tears down one container root file system layer
// (overlayfs: read-only lower layers, a writable upper) and prints it as JSON.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/alecthomas/kong"

	"github.com/lazyfork/lazyfork/lib/overlay"
	"github.com/lazyfork/lazyfork/lib/paths"
)

type cli struct {
	Prepare  prepareCmd  `cmd:"" help:"Create upper/work/target and mount the overlay; prints the layer."`
	Teardown teardownCmd `cmd:"" help:"Unmount a layer and remove its upper, work and target (layer JSON on stdin or --in)."`
}

type prepareCmd struct {
	Lower  []string `required:"" help:"Lower layer directories, top-most first (repeat or comma-separate)."`
	Upper  string   `required:"" help:"Upper (writable) directory."`
	Work   string   `required:"" help:"Overlay work directory (same file system as upper)."`
	Target string   `required:"" help:"Mount point."`
}

func (c *prepareCmd) Run() error {
	l := overlay.Layer{Lower: c.Lower, Upper: c.Upper, Work: c.Work, Target: c.Target}
	if err := overlay.Prepare(l); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(l)
}

type teardownCmd struct {
	In string `help:"Read the layer JSON from this file instead of stdin."`
}

func (c *teardownCmd) Run() error {
	in := os.Stdin
	if c.In != "" {
		f, err := os.Open(c.In)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	var l overlay.Layer
	if err := json.NewDecoder(io.LimitReader(in, 1<<20)).Decode(&l); err != nil {
		return fmt.Errorf("read layer JSON: %w (pass the output of `lf-overlay prepare`)", err)
	}
	if err := overlay.Teardown(l); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"removed": l})
}

func main() {
	var c cli
	ctx := kong.Parse(&c, kong.Name("lf-overlay"), kong.Description("Prepare and tear down LazyFork overlay layers."))
	err := paths.Ensure() // the state roots are root's, 0700, no symlinks: or refuse
	if err == nil {
		err = ctx.Run()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "lf-overlay: %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
		os.Exit(1)
	}
}
