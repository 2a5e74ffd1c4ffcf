// Package paths names where LazyFork keeps its state. Two roots: a persistent one for
// images, containers and the lineage tree, and a tmpfs one for snapshots and the family
// memory files (they must live in RAM; see the spec).
package paths

import (
	"os"
	"path/filepath"
)

// Root is the persistent state directory ($LAZYFORK_ROOT, default /var/lib/lazyfork).
func Root() string {
	if r := os.Getenv("LAZYFORK_ROOT"); r != "" {
		return filepath.Clean(r)
	}
	return "/var/lib/lazyfork"
}

// Run is the tmpfs state directory ($LAZYFORK_RUN, default /dev/shm/lazyfork).
func Run() string {
	if r := os.Getenv("LAZYFORK_RUN"); r != "" {
		return filepath.Clean(r)
	}
	return "/dev/shm/lazyfork"
}

func Images() string     { return filepath.Join(Root(), "images") }
func Containers() string { return filepath.Join(Root(), "containers") }
func Snapshots() string  { return filepath.Join(Run(), "snapshots") }
func Families() string   { return filepath.Join(Run(), "families") }
