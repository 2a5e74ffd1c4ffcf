package stage

import (
	"fmt"
	"io"
)

const mb = 1e6

// Explain tells what the step that printed the snapshot did (lf-dump for state dumped,
// lf-memfile for memfiled), from the facts the snapshot records: --explain of both.
func (s *Snapshot) Explain(w io.Writer) {
	src := s.Source.ID
	if s.Source.Name != "" {
		src = s.Source.Name + " (" + s.Source.ID + ")"
	}
	if s.State != SnapMemfiled || s.Memfile == nil {
		d := s.Dump
		fmt.Fprintf(w, "read: container %s, pid %d, depth %d, from the store (its record, never the pipe, says where it lives)\n", src, s.Source.Pid, s.Source.Depth)
		fmt.Fprintf(w, "froze its tasks for %.0f ms: CRIU dumps a stopped process tree, and the file system must be taken at the same instant as memory\n", d.FrozenMs)
		fmt.Fprintf(w, "  wrote checkpoint %s: %d of %d pages scanned had data (%.1f MB of image files)\n", s.CheckpointDir, d.PagesWritten, d.PagesScanned, float64(d.CheckpointBytes)/mb)
		fmt.Fprintf(w, "  copied its writable layer to %s while frozen (%.0f ms): forks mount it read-only under their own upper\n", s.Layer, d.LayerMs)
		if s.LeftRunning {
			fmt.Fprintf(w, "  then thawed it: the container runs on (--exit would have ended it)\n")
		} else {
			fmt.Fprintf(w, "  then ended it (--exit): its record now says stopped\n")
		}
		if s.Source.Depth > 0 {
			fmt.Fprintf(w, "family %s: the source is a fork, so its snapshot maps its family's memory files and holds only its own pages\n", s.Family)
		} else {
			fmt.Fprintf(w, "family %s: a root container's first snapshot starts a family of memory files (%s)\n", s.Family, s.FamilyDir)
		}
		fmt.Fprintf(w, "next: lf-memfile moves the checkpoint's memory into the family's memory files (without it, each restore copies every page)\n")
		return
	}
	m := s.Memfile
	fmt.Fprintf(w, "read: snapshot %s of %s, checkpoint %s\n", s.ID, src, s.CheckpointDir)
	fmt.Fprintf(w, "moved %d pages of %d anonymous VMAs and %d copied-on-write file VMAs into %d memory files in %s: %.1f MB written in %.0f ms (%.0f MB/s)\n",
		m.PagesMoved, m.VMAsConverted, m.FileVMAsConverted, m.Files, s.FamilyDir, float64(m.BytesWritten)/mb, m.Ms, m.MBPerSec)
	if m.SharedPages > 0 || m.DeltaPages > 0 {
		fmt.Fprintf(w, "  %d pages were already in the family's files (shared with the parent, stored once); %d pages are this snapshot's delta\n", m.SharedPages, m.DeltaPages)
	}
	if m.Rebased {
		fmt.Fprintf(w, "  rebased: the delta got fresh memory files instead of stacking on the parent's\n")
	}
	if m.HugePages > 0 {
		fmt.Fprintf(w, "  %d dense 2 MiB stretches became huge pages (forks map them without page tables)\n", m.HugePages)
	}
	fmt.Fprintf(w, "  %d pages stay in the checkpoint (stack, vdso, shared mappings, ...: lf-inspect says which and why)\n", m.PagesKept)
	fmt.Fprintf(w, "  rewrote the checkpoint's VMAs to map those files MAP_PRIVATE: every fork shares their pages on tmpfs and copies one only when it writes it\n")
	fmt.Fprintf(w, "next: lf-restore -n N restores forks that map %s at /.lazyfork/mem\n", s.FamilyDir)
}

// Restored is what a restore made: the snapshot it read and its forks (lf-restore --explain).
type Restored struct {
	Snapshot *Snapshot
	Forks    []Fork
}

// Explain tells what the restore read, made and why.
func (r Restored) Explain(w io.Writer) {
	s := r.Snapshot
	fmt.Fprintf(w, "read: snapshot %s (state %s), checkpoint %s, layer %s\n", s.ID, s.State, s.CheckpointDir, s.Layer)
	if s.State == SnapMemfiled {
		fmt.Fprintf(w, "restored %d fork(s) with CRIU; each maps the memory files of family %s (%s, read-only at /.lazyfork/mem) MAP_PRIVATE: they share every page until one writes it\n",
			len(r.Forks), s.Family, s.FamilyDir)
	} else {
		fmt.Fprintf(w, "restored %d fork(s) with CRIU from a snapshot lf-memfile did not rewrite: each fork copies all %d pages of the checkpoint (plain CRIU restore)\n",
			len(r.Forks), s.Dump.PagesWritten)
	}
	fmt.Fprintf(w, "  each fork is a new container: own namespaces, cgroup, hostname and record, an overlay upper over the snapshot's layer\n")
	for _, f := range r.Forks {
		name := f.ID
		if f.Name != "" {
			name = f.Name + " (" + f.ID + ")"
		}
		fmt.Fprintf(w, "  fork %s: pid %d, hostname %s, depth %d, parent %s, running after %.0f ms", name, f.Pid, f.Hostname, f.Depth, f.Parent, f.RestoreMs)
		if f.Address != "" {
			fmt.Fprintf(w, ", address %s", f.Address)
		}
		fmt.Fprintln(w)
	}
}
