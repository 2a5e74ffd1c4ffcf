// Command lf-overlay prepares or tears down one container root file system layer
// (overlayfs: read-only lower layers, a writable upper) and prints it as a lazyfork.layer
// document.
package main

import (
	"cmp"
	"context"

	"github.com/lazyfork/lazyfork/lib/overlay"
	"github.com/lazyfork/lazyfork/lib/stagecmd"
)

// KindLayer is the document prepare prints and teardown reads.
const KindLayer = "lazyfork.layer"

type layerDoc struct {
	stagecmd.Header
	overlay.Layer
	Removed bool `json:"removed,omitempty"` // teardown: the layer is gone
}

type cli struct {
	stagecmd.ExplainFlag
	stagecmd.Roots
	Prepare  prepareCmd  `cmd:"" help:"Create upper/work/target and mount the overlay; prints the layer."`
	Teardown teardownCmd `cmd:"" help:"Unmount a layer and remove its upper, work and target; prints it with removed: true."`
}

type prepareCmd struct {
	Lower  []string `required:"" help:"Lower layer directories, top-most first (repeat or comma-separate)."`
	Upper  string   `required:"" help:"Upper (writable) directory."`
	Work   string   `required:"" help:"Overlay work directory (same file system as upper)."`
	Target string   `required:"" help:"Mount point."`
}

func (c *prepareCmd) Run(x *stagecmd.ExplainFlag) error {
	l := overlay.Layer{Lower: c.Lower, Upper: c.Upper, Work: c.Work, Target: c.Target}
	if err := overlay.Prepare(l); err != nil {
		return err
	}
	x.Tell(stagecmd.ExplainFunc(l.ExplainPrepare))
	return stagecmd.Print(layerDoc{Header: stagecmd.H(KindLayer), Layer: l})
}

type teardownCmd struct {
	Layer string `arg:"" optional:"" help:"File holding the layer JSON; - or nothing: stdin."`
	In    string `hidden:"" help:"Same as the argument (older scripts)."`
}

func (c *teardownCmd) Run(x *stagecmd.ExplainFlag) error {
	var d layerDoc
	if err := stagecmd.ReadDoc(cmp.Or(c.Layer, c.In), KindLayer, "`lf-overlay prepare`", &d); err != nil {
		return err
	}
	if err := overlay.Teardown(d.Layer); err != nil {
		return err
	}
	x.Tell(stagecmd.ExplainFunc(d.Layer.ExplainTeardown))
	d.Header, d.Removed = stagecmd.H(KindLayer), true
	return stagecmd.Print(d)
}

func main() {
	var c cli
	kctx := stagecmd.Parse(&c, "lf-overlay", "Prepare and tear down LazyFork overlay layers (JSON on stdout).",
		"lf-overlay prepare --lower L --upper U --work W --target T > layer.json\nlf-overlay teardown --explain layer.json")
	stagecmd.Run("lf-overlay", func(ctx context.Context) error { return kctx.Run(&c.ExplainFlag) })
}
