// Package paths names where LazyFork keeps its state. Two roots: a persistent one for
// images, containers and the lineage tree, and a tmpfs one for snapshots and the family
// memory files (they must live in RAM; see the spec).
package paths

import (
	"os"
	"path/filepath"
)

// set holds the roots a command chose (Set): the porcelain's --root and --run.
var set struct{ root, run string }

// Set gives the state roots explicitly (call it once, before any use); "" keeps the
// environment's or the default. Child processes that need the roots get them passed
// (lazyfork daemon start gives them to the daemon), not through this process's env.
func Set(root, run string) { set.root, set.run = root, run }

// Root is the persistent state directory: Set's, else $LAZYFORK_ROOT, else
// /var/lib/lazyfork.
func Root() string {
	if set.root != "" {
		return filepath.Clean(set.root)
	}
	if r := os.Getenv("LAZYFORK_ROOT"); r != "" {
		return filepath.Clean(r)
	}
	return "/var/lib/lazyfork"
}

// Run is the tmpfs state directory: Set's, else $LAZYFORK_RUN, else /dev/shm/lazyfork.
func Run() string {
	if set.run != "" {
		return filepath.Clean(set.run)
	}
	if r := os.Getenv("LAZYFORK_RUN"); r != "" {
		return filepath.Clean(r)
	}
	return "/dev/shm/lazyfork"
}

func Images() string     { return filepath.Join(Root(), "images") }
func Containers() string { return filepath.Join(Root(), "containers") }
func Snapshots() string  { return filepath.Join(Run(), "snapshots") }
func Families() string   { return filepath.Join(Run(), "families") }
