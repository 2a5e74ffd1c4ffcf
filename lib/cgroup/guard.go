package cgroup

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ErrForeign marks a cgroup outside LazyFork's own subtree: stage input (lf-cgroup's
// JSON, a container record) may only name groups LazyFork creates, so a forged document
// cannot make it kill, freeze or remove /system.slice.
var ErrForeign = errors.New("not a LazyFork cgroup")

// CheckOwned reports whether every path in p is a group LazyFork would create: a valid
// group name directly under either a directory called `lazyfork` (the default parent,
// `<caller's cgroup>/lazyfork/<name>`; the caller differs between the daemon, porcelain
// and stages, so any such directory counts) or the parent set in $LAZYFORK_CGROUP_PARENT
// (the operator's configuration, not stage input). Paths must be absolute and clean, with
// no "..". It never touches the file system.
func CheckOwned(p Paths) error {
	if len(p) == 0 {
		return fmt.Errorf("cgroup has no paths: %w", ErrForeign)
	}
	envParent := os.Getenv(ParentEnv)
	for _, k := range slices.Sorted(maps.Keys(p)) {
		if err := checkOwnedPath(k, p[k], envParent); err != nil {
			return err
		}
	}
	return nil
}

func checkOwnedPath(k, v, envParent string) error {
	fix := fmt.Sprintf("only groups under a %q directory or under $%s can be named", parentDir, ParentEnv)
	if !filepath.IsAbs(v) || slices.Contains(strings.Split(v, "/"), "..") || filepath.Clean(v) != v {
		return fmt.Errorf("cgroup %s:%q must be an absolute clean path without \"..\": %w", k, v, ErrForeign)
	}
	name, parent := filepath.Base(v), filepath.Dir(v)
	if !validName.MatchString(name) {
		return fmt.Errorf("cgroup %s:%s: invalid group name %q: %w", k, v, name, ErrForeign)
	}
	if parent != "/" && filepath.Base(parent) == parentDir {
		return nil
	}
	if envParent != "" && parent != "/" && filepath.Clean(envParent) == parent {
		return nil
	}
	return fmt.Errorf("cgroup %s:%s is %w (%s)", k, v, ErrForeign, fix)
}

// CheckParent refuses a parent for Create/Resolve that would put groups outside the
// subtree CheckOwned accepts ("" is the default and always fine).
func CheckParent(parent string) error {
	if parent == "" {
		return nil
	}
	if err := checkOwnedPath("parent", filepath.Join(parent, "x"), os.Getenv(ParentEnv)); err != nil {
		return fmt.Errorf("cgroup parent %q would put groups outside the project's subtree: %w (use a directory named %q, or set $%s)",
			parent, ErrForeign, parentDir, ParentEnv)
	}
	return nil
}

// LoadOwned is Load for paths that come from outside this process (stage JSON, records):
// it refuses groups outside LazyFork's subtree before opening anything.
func LoadOwned(p Paths) (*Cgroup, error) {
	if err := CheckOwned(p); err != nil {
		return nil, fmt.Errorf("load cgroup: %w", err)
	}
	return Load(p)
}
