// Package owned decides, without touching the file system, whether a cgroup path is one
// LazyFork creates. It is lib/cgroup's check for stage input, apart so that the stages
// that only check records (lf-tree, through lib/stage) link no cgroup library.
package owned

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// ErrForeign marks a cgroup outside LazyFork's own subtree: stage input (lf-cgroup's
// JSON, a container record) may only name groups LazyFork creates, so a forged document
// cannot make it kill, freeze or remove /system.slice.
var ErrForeign = errors.New("not a LazyFork cgroup")

// ParentEnv names the operator's setting of the parent (the mains' --cgroup-parent flag
// reads it; messages name it as the fix).
const ParentEnv = "LAZYFORK_CGROUP_PARENT"

// operatorParent is the operator's parent, as SetParent recorded it.
var operatorParent string

// SetParent records the operator's cgroup parent: the value of the main's --cgroup-parent
// flag, which kong fills from $LAZYFORK_CGROUP_PARENT. Groups directly under it count as
// LazyFork's (Check), and Create/Resolve use it when given parent "". Like paths.Set, the
// mains call it once after parsing: nothing in lib reads the environment for it, and stage
// input never reaches it.
func SetParent(p string) { operatorParent = p }

// Parent is the operator's parent SetParent recorded ("" = the default).
func Parent() string { return operatorParent }

// ParentDir is the directory the default parent adds under the caller's own cgroup.
const ParentDir = "lazyfork"

// ValidName reports whether name is a group name LazyFork gives (a container id, or a
// name like one).
func ValidName(name string) bool { return validName().MatchString(name) }

// validName is compiled on first use: its bounded repetition made compiling it at init
// ~0.5 ms of every start of every binary (the exec and criu helpers included).
var validName = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)
})

// Check reports whether every path in p is a group LazyFork would create: a valid
// group name directly under either a directory called `lazyfork` (the default parent,
// `<caller's cgroup>/lazyfork/<name>`; the caller differs between the daemon, porcelain
// and stages, so any such directory counts) or the operator's parent (SetParent: the
// operator's configuration, not stage input). Paths must be absolute and clean, with
// no "..". It never touches the file system.
func Check(p map[string]string) error {
	if len(p) == 0 {
		return fmt.Errorf("cgroup has no paths: %w", ErrForeign)
	}
	for _, k := range slices.Sorted(maps.Keys(p)) {
		if err := checkOwnedPath(k, p[k], operatorParent); err != nil {
			return err
		}
	}
	return nil
}

func checkOwnedPath(k, v, opParent string) error {
	fix := fmt.Sprintf("only groups under a %q directory or under $%s can be named", ParentDir, ParentEnv)
	if !filepath.IsAbs(v) || slices.Contains(strings.Split(v, "/"), "..") || filepath.Clean(v) != v {
		return fmt.Errorf("cgroup %s:%q must be an absolute clean path without \"..\": %w", k, v, ErrForeign)
	}
	name, parent := filepath.Base(v), filepath.Dir(v)
	if !ValidName(name) {
		return fmt.Errorf("cgroup %s:%s: invalid group name %q: %w", k, v, name, ErrForeign)
	}
	if parent != "/" && filepath.Base(parent) == ParentDir {
		return nil
	}
	if opParent != "" && parent != "/" && filepath.Clean(opParent) == parent {
		return nil
	}
	return fmt.Errorf("cgroup %s:%s is %w (%s)", k, v, ErrForeign, fix)
}

// CheckParent refuses a parent for Create/Resolve that would put groups outside the
// subtree Check accepts ("" is the default and always fine).
func CheckParent(parent string) error {
	if parent == "" {
		return nil
	}
	if err := checkOwnedPath("parent", filepath.Join(parent, "x"), operatorParent); err != nil {
		return fmt.Errorf("cgroup parent %q would put groups outside the project's subtree: %w (use a directory named %q, or set $%s)",
			parent, ErrForeign, ParentDir, ParentEnv)
	}
	return nil
}
