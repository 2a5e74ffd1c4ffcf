// Command lf-memfile rewrites a dumped snapshot's checkpoint so its memory lives in the
// family's memory files on tmpfs (sparse files every fork maps MAP_PRIVATE). It reads the
// snapshot JSON of lf-dump on stdin (or a snapshot directory/id as argument) and prints
// the snapshot JSON again, now in state "memfiled".
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/lazyfork/lazyfork/lib/memfile"
	"github.com/lazyfork/lazyfork/lib/snapshot"
	"github.com/lazyfork/lazyfork/lib/stagecmd"
)

type cli struct {
	stagecmd.ExplainFlag
	stagecmd.Roots
	Snapshot      string `arg:"" optional:"" help:"Snapshot directory or id, or a raw checkpoint (any CRIU image directory); - or nothing: snapshot JSON on stdin."`
	FamilyDir     string `help:"Raw checkpoint mode: tmpfs directory for the memory files (default: <checkpoint>.mem beside it)."`
	MountPath     string `help:"Raw checkpoint mode: path at which the restored task sees the memory files (default: the family dir itself)."`
	Force         bool   `help:"Rewrite even if the checkpoint maps jemalloc, mimalloc or tcmalloc."`
	NoFilePrivate bool   `help:"Leave copied-on-write library pages in the checkpoint (per-fork floor ~2 MB)."`
	HugePages     bool   `help:"Make each 2 MiB stretch of anonymous memory that is at least 3/4 data one huge page, allocated just ahead of the copy into it: forks map it without page tables (~0.4 MB less per working fork of a 256 MiB heap); on a VM whose balloon hands free memory back to the host the rewrite takes longer."`
	KSM           bool   `name:"ksm" help:"Mark the memory files' mappings MADV_MERGEABLE so ksmd may merge the forks' identical pages (same tenant only: see docs/security.md)."`
	Rebase        *bool  `help:"Force (or with --no-rebase forbid) writing fresh memory files for a fork's delta." negatable:""`
	DryRun        bool   `help:"Print the plan (lf-inspect's JSON: each VMA's decision and why) and write nothing."`
}

func main() {
	var c cli
	stagecmd.Parse(&c, "lf-memfile", "Move a checkpoint's memory into tmpfs memory files; prints snapshot JSON.",
		"lf-dump c1 | lf-memfile --explain | lf-restore -n 10\nlf-dump c1 | lf-memfile --dry-run | jq '.vmas[] | select(.decision != \"keep\")'\nlf-memfile /path/to/criu/images      # raw mode: any checkpoint, rewritten in place")
	stagecmd.Run("lf-memfile", func(ctx context.Context) error { return run(ctx, c) })
}

// Kinds of the documents lf-memfile prints besides the snapshot.
const (
	KindInspect = "lazyfork.inspect" // --dry-run: lf-inspect's report
	KindRewrite = "lazyfork.rewrite" // raw mode: what the rewrite did
)

func run(ctx context.Context, c cli) error {
	if c.Snapshot == "-" {
		c.Snapshot = ""
	}
	if c.Snapshot != "" && isRawCheckpoint(c.Snapshot) {
		return rewriteRaw(ctx, c)
	}
	s, err := snapshot.ReadSnapshotArg(c.Snapshot)
	if err != nil {
		return err
	}
	if done, err := plan(c, s.CheckpointDir, s.FamilyDir); done || err != nil {
		return err
	}
	s, err = snapshot.Memfile(ctx, s, snapshot.MemfileOptions{Force: c.Force, NoFilePrivate: c.NoFilePrivate, Rebase: c.Rebase, HugePages: c.HugePages, KSM: c.KSM})
	if err != nil {
		return err
	}
	m := s.Memfile
	fmt.Fprintf(os.Stderr, "memfiled %s: %d files, %d pages moved (%.1f MB in %.0f ms, %.0f MB/s), %d pages left in the checkpoint\n",
		s.ID, m.Files, m.PagesMoved, float64(m.BytesWritten)/1e6, m.Ms, m.MBPerSec, m.PagesKept)
	c.Tell(s)
	return stagecmd.Print(s)
}

// plan inspects the image when --dry-run or --explain asks for the plan: --explain tells
// it on stderr, --dry-run prints it and ends the stage (done) before anything is written.
func plan(c cli, images, family string) (done bool, err error) {
	if !c.DryRun && !c.Explain {
		return false, nil
	}
	rep, err := memfile.Inspect(memfile.Options{CheckpointDir: images, FamilyDir: family, ConvertFilePrivate: !c.NoFilePrivate})
	if err != nil {
		return false, err
	}
	c.Tell(rep) // each decision and why
	if !c.DryRun {
		return false, nil
	}
	return true, stagecmd.Print(struct {
		stagecmd.Header
		*memfile.Report
	}{stagecmd.H(KindInspect), rep})
}

// isRawCheckpoint reports a CRIU image directory that did not come from lf-dump.
func isRawCheckpoint(dir string) bool {
	_, errImg := os.Stat(filepath.Join(dir, "inventory.img"))
	_, errSnap := os.Stat(filepath.Join(dir, "snapshot.json"))
	_, errParent := os.Stat(filepath.Join(filepath.Dir(dir), "snapshot.json"))
	return errImg == nil && errSnap != nil && errParent != nil
}

// rewriteRaw runs the rewrite alone on any checkpoint, for debugging and teaching: the
// image is rewritten in place and the memory files land in the family directory.
func rewriteRaw(ctx context.Context, c cli) error {
	dir, _ := filepath.Abs(c.Snapshot)
	fam := c.FamilyDir
	if fam == "" {
		fam = dir + ".mem"
	}
	mount := c.MountPath
	if mount == "" {
		mount = fam
	}
	if done, err := plan(c, dir, fam); done || err != nil {
		return err
	}
	// The memory files are a process's heap: 0700, like a family's (the files are 0400).
	if err := os.MkdirAll(fam, 0o700); err != nil {
		return err
	}
	res, err := memfile.Rewrite(ctx, memfile.Options{CheckpointDir: dir, FamilyDir: fam, MountPath: mount,
		ConvertFilePrivate: !c.NoFilePrivate, Prefix: "m", AllowAllocators: c.Force, HugePages: c.HugePages, KSM: c.KSM})
	if err != nil {
		_ = os.Remove(fam) // only if still empty
		return err
	}
	fmt.Fprintf(os.Stderr, "rewrote %s: %d files in %s, %d pages moved, %d left in the checkpoint\n", dir, len(res.Files), fam, res.PagesMoved, res.PagesKept)
	c.Tell(res)
	return stagecmd.Print(struct {
		stagecmd.Header
		*memfile.Result
	}{stagecmd.H(KindRewrite), res})
}
