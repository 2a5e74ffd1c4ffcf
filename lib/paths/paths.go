// Package paths names where LazyFork keeps its state. Two roots: a persistent one for
// images, containers and the lineage tree, and a tmpfs one for snapshots and the family
// memory files (they must live in RAM; see the spec).
package paths

import "path/filepath"

// set holds the roots the process was given (Set).
var set struct{ root, run string }

// Default roots, for a process that was given none.
const (
	DefaultRoot = "/var/lib/lazyfork"
	DefaultRun  = "/dev/shm/lazyfork"
)

// Set gives the state roots ("" keeps the default). Only the mains call it, with what
// their flags or the environment say (kong's env tags: LAZYFORK_ROOT, LAZYFORK_RUN);
// nothing in lib reads the environment for them. Child processes that need the roots
// get them passed (lazyfork daemon start gives them to the daemon).
func Set(root, run string) { set.root, set.run = root, run }

// Root is the persistent state directory: Set's, else DefaultRoot.
func Root() string {
	if set.root != "" {
		return filepath.Clean(set.root)
	}
	return DefaultRoot
}

// Run is the tmpfs state directory: Set's, else DefaultRun.
func Run() string {
	if set.run != "" {
		return filepath.Clean(set.run)
	}
	return DefaultRun
}

func Images() string     { return filepath.Join(Root(), "images") }
func Containers() string { return filepath.Join(Root(), "containers") }
func Snapshots() string  { return filepath.Join(Run(), "snapshots") }
func Families() string   { return filepath.Join(Run(), "families") }
