package cgroup

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// parentPathsPrefix marks a parent given per hierarchy (see ParentFor).
const parentPathsPrefix = "paths:"

// ParentFor is the parent string (for Create, Resolve, container.Runtime.CgroupParent) that
// puts groups inside g, at <g's path>/lazyfork/<name> in each of g's hierarchies. A plain
// absolute parent is one path for every hierarchy; a group made under the caller's own
// cgroups sits at different paths in each (memory under the agent's group, pids at the
// root on a hybrid host), so the paths are carried as "paths:" + JSON.
func ParentFor(g *Cgroup) string {
	p := Paths{}
	for k, v := range g.Paths {
		p[k] = filepath.Join(v, parentDir)
	}
	b, _ := json.Marshal(p)
	return parentPathsPrefix + string(b)
}

// parentPaths decodes a ParentFor string; ok is false for any other parent.
func parentPaths(parent string) (p Paths, ok bool, err error) {
	rest, ok := strings.CutPrefix(parent, parentPathsPrefix)
	if !ok {
		return nil, false, nil
	}
	if err := json.Unmarshal([]byte(rest), &p); err != nil {
		return nil, true, fmt.Errorf("resolve cgroup: parent %q: %w", parent, err)
	}
	for k, v := range p {
		if !filepath.IsAbs(v) || filepath.Clean(v) != v || slices.Contains(strings.Split(v, "/"), "..") {
			return nil, true, fmt.Errorf("resolve cgroup: parent %s:%q must be an absolute clean path without ..", k, v)
		}
	}
	return p, true, nil
}

// ParentOf is the parent string that recreates the group at paths p (the same name under
// the same directories in each hierarchy), e.g. after a reboot removed it.
func ParentOf(p Paths) string {
	d := Paths{}
	for k, v := range p {
		d[k] = filepath.Dir(v)
	}
	b, _ := json.Marshal(d)
	return parentPathsPrefix + string(b)
}
