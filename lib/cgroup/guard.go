package cgroup

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/lazyfork/lazyfork/lib/cgroup/owned"
	"golang.org/x/sys/unix"
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

// RemoveOwned removes what is left of a LazyFork group whose paths come from a record, in
// every hierarchy where its directory exists: also a group in only some of them, which
// Load refuses, left by a creation cut short between two hierarchies' mkdirs (a process
// killed there: memory is made first, so a bare memory group) or by a removal that failed
// in one. A directory holding processes is not removed (an error says so); nothing is
// killed. Missing everywhere is success.
func RemoveOwned(p Paths) error {
	if err := CheckOwned(p); err != nil {
		return fmt.Errorf("remove cgroup: %w", err)
	}
	h, err := detectHost()
	if err != nil {
		return err
	}
	c := &Cgroup{Paths: p, mounts: h.mounts, V2: len(p) == 1 && p[unified] != ""}
	for _, v := range p {
		if c.Name != "" && c.Name != filepath.Base(v) {
			return fmt.Errorf("remove cgroup: paths name different groups %v: %w", p, ErrForeign)
		}
		c.Name = filepath.Base(v)
	}
	var errs []error
	for k := range p {
		if _, ok := h.mounts[k]; !ok {
			continue // a hierarchy this host does not mount holds nothing
		}
		dir, err := c.dir(k)
		if err == nil {
			err = removeTree(dir)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s:%s: %w", k, p[k], err))
		} else if parent := filepath.Dir(dir); filepath.Base(parent) == parentDir {
			_ = unix.Rmdir(parent) // fails harmlessly while other groups live there
		}
	}
	return errors.Join(errs...)
}
