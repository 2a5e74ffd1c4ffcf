package cgroup

import (
	"fmt"

	"github.com/lazyfork/lazyfork/lib/cgroup/owned"
)

// ErrForeign marks a cgroup outside LazyFork's own subtree (see owned.Check).
var ErrForeign = owned.ErrForeign

// CheckOwned reports whether every path in p is a group LazyFork would create (owned.Check).
func CheckOwned(p Paths) error { return owned.Check(p) }

// CheckParent refuses a parent that would put groups outside that subtree.
func CheckParent(parent string) error { return owned.CheckParent(parent) }

// LoadOwned is Load for paths that come from outside this process (stage JSON, records):
// it refuses groups outside LazyFork's subtree before opening anything.
func LoadOwned(p Paths) (*Cgroup, error) {
	if err := CheckOwned(p); err != nil {
		return nil, fmt.Errorf("load cgroup: %w", err)
	}
	return Load(p)
}
