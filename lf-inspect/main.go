// Command lf-inspect explains a checkpoint (a CRIU image directory): every VMA with the
// memory-file rewrite's decision for it and why, the page accounting, and the memory
// files (made, or that lf-memfile would make). It changes nothing.
//
//	lf-dump c1 | lf-inspect            # what lf-memfile is about to do
//	lf-dump c1 | lf-memfile | lf-inspect
//	lf-inspect s0123456789ab           # a snapshot by id or directory
//	lf-inspect /path/to/criu/images    # any checkpoint (a CRIU image directory)
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/lazyfork/lazyfork/lib/memfile"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/stagecmd"
)

type cli struct {
	stagecmd.ExplainFlag
	stagecmd.Roots
	Checkpoint string `arg:"" optional:"" help:"Snapshot id or directory, or a checkpoint (any CRIU image directory); - or nothing: snapshot JSON on stdin."`
	FamilyDir  string `help:"Where the memory files the checkpoint maps live (default: the snapshot's family, or <checkpoint>.mem beside a raw checkpoint)."`
	JSON       bool   `help:"Print the report as JSON instead of tables."`
	AllVMAs    bool   `name:"all" help:"List every VMA (default: those with pages, and every decision other than keep)."`
}

func main() {
	var c cli
	stagecmd.Parse(&c, "lf-inspect", "Explain a checkpoint: each VMA, the memory-file rewrite's decision and why, the page accounting and the memory files. Changes nothing.",
		"lf-dump c1 | lf-inspect              # what lf-memfile is about to do\nlf-dump c1 | lf-memfile | lf-inspect\nlf-inspect --json s0123456789ab | jq .pages")
	stagecmd.Run("lf-inspect", func(ctx context.Context) error { return run(c) })
}

// KindInspect is the document --json prints.
const KindInspect = "lazyfork.inspect"

func run(c cli) error {
	checkpoint, family, err := resolve(c)
	if err != nil {
		return err
	}
	rep, err := memfile.Inspect(memfile.Options{CheckpointDir: checkpoint, FamilyDir: family, ConvertFilePrivate: true})
	if err != nil {
		return err
	}
	c.Tell(rep) // the decisions grouped, beside the tables or the JSON
	var onDisk []memfile.FileReport
	if family != "" {
		onDisk, _ = memfile.FamilyFiles(family)
	}
	if c.JSON {
		return stagecmd.Print(struct {
			stagecmd.Header
			*memfile.Report
			FamilyDir   string               `json:"family_dir,omitempty"`
			FamilyFiles []memfile.FileReport `json:"family_files,omitempty"`
		}{stagecmd.H(KindInspect), rep, family, onDisk})
	}
	return printTables(os.Stdout, rep, family, onDisk, c.AllVMAs)
}

// resolve finds the CRIU image directory and the family directory for the argument.
func resolve(c cli) (checkpoint, family string, err error) {
	arg := c.Checkpoint
	var s *stage.Snapshot
	switch {
	case arg == "" || arg == "-" || isFile(arg):
		in, err := stagecmd.Input(arg)
		if err != nil {
			return "", "", err
		}
		defer in.Close()
		if s, err = stage.ReadSnapshot(io.LimitReader(in, stagecmd.MaxDocument)); err != nil {
			return "", "", fmt.Errorf("read snapshot JSON: %w (or name a snapshot or a checkpoint directory)", err)
		}
	case exists(filepath.Join(arg, "inventory.img")) && !exists(filepath.Join(filepath.Dir(arg), "snapshot.json")):
		checkpoint = arg
		family = c.FamilyDir
		if family == "" && exists(arg+".mem") {
			family = arg + ".mem"
		}
		return checkpoint, family, nil
	default:
		dir := arg
		if stage.ValidSnapshotID(arg) {
			dir = filepath.Join(paths.Snapshots(), arg)
		} else if exists(filepath.Join(filepath.Dir(arg), "snapshot.json")) {
			dir = filepath.Dir(arg) // the snapshot's checkpoint dir was named
		}
		f, err := os.Open(filepath.Join(dir, "snapshot.json"))
		if err != nil {
			return "", "", fmt.Errorf("%s is neither a snapshot nor a checkpoint (CRIU image directory): %w", arg, err)
		}
		defer f.Close()
		if s, err = stage.ReadSnapshot(io.LimitReader(f, 1<<20)); err != nil {
			return "", "", err
		}
	}
	if err := stage.CheckSnapshot(s); err != nil {
		return "", "", err
	}
	family = c.FamilyDir
	if family == "" {
		family = s.FamilyDir
	}
	return s.CheckpointDir, family, nil
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// isFile: the argument is a document (snapshot JSON saved from a stage), not a directory.
func isFile(p string) bool { fi, err := os.Stat(p); return err == nil && fi.Mode().IsRegular() }

func printTables(w io.Writer, rep *memfile.Report, family string, onDisk []memfile.FileReport, all bool) error {
	fmt.Fprintf(w, "checkpoint %s: %d task(s), %d VMAs", rep.Dir, rep.Tasks, len(rep.VMAs))
	if rep.Rewritten {
		fmt.Fprint(w, " (already maps memory files)")
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tSTART-END\tPROT\tKB\tPAGES\tDECISION\tFILE\tWHY")
	hidden := 0
	for _, v := range rep.VMAs {
		if !all && v.Pages == 0 && v.Decision == "keep" {
			hidden++
			continue
		}
		what := v.Why
		if v.Maps != "" && v.Decision == "keep" {
			what += " [" + v.Maps + "]"
		}
		fmt.Fprintf(tw, "%d\t%x-%x\t%s\t%d\t%d\t%s\t%s\t%s\n", v.Pid, v.Start, v.End, v.Prot, (v.End-v.Start)>>10, v.Pages, v.Decision, dash(v.File), what)
	}
	tw.Flush()
	if hidden > 0 {
		fmt.Fprintf(w, "(%d VMAs with no dumped pages and nothing to do are not shown; --all shows them)\n", hidden)
	}
	p := rep.Pages
	fmt.Fprintf(w, "\npages: %d pagemap entries; %d pages with data in the checkpoint: %d go to memory files, %d stay in the checkpoint; %d pagemap pages have no data here\n",
		p.PagemapEntries, p.InCheckpoint, p.ToMemoryFiles, p.StayInCheckpoint, p.NotInCheckpoint)
	if p.SharedFamily > 0 || p.Delta > 0 {
		fmt.Fprintf(w, "family: the checkpoint's VMAs map %d pages of family memory files and add %d delta pages of their own\n", p.SharedFamily, p.Delta)
	}
	if len(rep.Files) > 0 {
		fmt.Fprintln(w, "\nmemory files this checkpoint maps or a rewrite would write:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tKIND\tVMAS\tAPPARENT\tON TMPFS\tTO WRITE")
		for _, f := range rep.Files {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", f.Name, f.Kind, f.VMAs, size(f.Size), size(f.Bytes), size(f.Planned))
		}
		tw.Flush()
	}
	if family != "" && len(onDisk) > 0 {
		var app, real int64
		for _, f := range onDisk {
			app += f.Size
			real += f.Bytes
		}
		fmt.Fprintf(w, "\nfamily dir %s: %d memory files, %s apparent, %s on tmpfs (sparse: only pages with data take RAM)\n", family, len(onDisk), size(app), size(real))
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func size(b int64) string {
	switch {
	case b == 0:
		return "-"
	case b >= 1<<40:
		return fmt.Sprintf("%.0f TiB", float64(b)/(1<<40))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	default:
		return fmt.Sprintf("%.0f KiB", float64(b)/(1<<10))
	}
}
