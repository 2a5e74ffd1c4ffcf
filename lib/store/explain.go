package store

import (
	"fmt"
	"io"
	"path/filepath"
)

// Explain tells what a store operation did (lf-tree --explain): op is "list",
// "children", "get", "put" or "rm"; recs are the records it read, wrote or removed.
func (s *Store) Explain(w io.Writer, op string, recs []*Container) {
	switch op {
	case "list", "children":
		fmt.Fprintf(w, "read %d record(s) in %s (each <id>/container.json), oldest first; nothing changed\n", len(recs), s.Dir)
	case "get":
		fmt.Fprintf(w, "read: the reference resolved by name, id or unique id prefix; nothing changed\n")
	case "put":
		fmt.Fprintf(w, "checked the record (paths inside the state roots, a cgroup of LazyFork's), then wrote it atomically (a temporary file beside it, renamed over it)\n")
	case "rm":
		fmt.Fprintf(w, "removed the record's directory, never crossing a mount point; its processes, cgroup and layers are left alone (lazyfork delete removes those)\n")
	}
	for _, c := range recs {
		if op == "list" || op == "children" {
			continue
		}
		fmt.Fprintf(w, "  %s: %s, state %s, pid %d, depth %d\n", filepath.Join(s.Path(c.ID), "container.json"), c.Display(), c.State, c.Pid, c.Depth)
	}
}
