// Package cgroup gives each LazyFork container its own cgroup with memory and pids
// accounting and a freezer: cgroup v2 where the host's v2 hierarchy offers memory and
// pids, otherwise the v1 memory, pids and freezer hierarchies (hybrid hosts). Groups
// live under a parent directory called `lazyfork`: on v1 inside the caller's own cgroup
// of each hierarchy, on v2 at the top of the hierarchy (see DefaultParentV2);
// $LAZYFORK_CGROUP_PARENT overrides. Nothing outside that subtree is created or removed.
package cgroup

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	cgroups "github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/lazyfork/lazyfork/lib/cgroup/owned"
	"golang.org/x/sys/unix"
)

// ParentEnv names the operator's setting of the parent Create/Resolve use when given
// parent "" (the mains read it and pass it to owned.SetParent).
const ParentEnv = owned.ParentEnv

// parentDir is the directory the default parent adds under the caller's own cgroup.
const parentDir = owned.ParentDir

// ErrExists is returned by Create when the group exists in some hierarchy: a group that
// may hold processes or be frozen must never be reused.
var ErrExists = errors.New("cgroup already exists")

// Paths maps a hierarchy ("memory", "pids", "freezer" on v1; "unified" on v2) to the
// group's path relative to that hierarchy's mount, e.g. "/process_api/x/lazyfork/abc".
type Paths map[string]string

// Cgroup is one container's group. Its JSON form (name, paths, v2) is enough to Load it
// again in another process.
type Cgroup struct {
	Name  string `json:"name"`
	Paths Paths  `json:"paths"`
	V2    bool   `json:"v2"`

	mounts map[string]mount
	v1     cgroup1.Cgroup
	v2     *cgroup2.Manager
}

// Resolve computes the paths a group called name would have under parent ("" = the
// operator's parent (SetParent), or else the default: `lazyfork` under the caller's own cgroups on v1, DefaultParentV2 on
// v2) without touching the filesystem.
func Resolve(name, parent string) (*Cgroup, error) {
	h, err := detectHost()
	if err != nil {
		return nil, err
	}
	v2, err := h.backend()
	if err != nil {
		return nil, err
	}
	return resolve(h, v2, name, parent)
}

func resolve(h host, v2 bool, name, parent string) (*Cgroup, error) {
	if !owned.ValidName(name) {
		return nil, fmt.Errorf("resolve cgroup: invalid name %q", name)
	}
	if parent == "" {
		parent = owned.Parent()
	}
	keys := slices.Clone(v1Controllers)
	if _, ok := h.mounts[v1Devices]; ok {
		keys = append(keys, v1Devices)
	}
	if v2 {
		keys = []string{unified}
	}
	c := &Cgroup{Name: name, Paths: Paths{}, V2: v2, mounts: h.mounts}
	if pp, ok, err := parentPaths(parent); ok {
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			if pp[k] == "" {
				return nil, fmt.Errorf("resolve cgroup: parent has no %s path", k)
			}
			c.Paths[k] = filepath.Join(pp[k], name)
		}
		return c, nil
	}
	if parent != "" {
		if !filepath.IsAbs(parent) || slices.Contains(strings.Split(parent, "/"), "..") {
			return nil, fmt.Errorf("resolve cgroup: parent %q must be an absolute path without ..", parent)
		}
		for _, k := range keys {
			c.Paths[k] = filepath.Join(parent, name)
		}
		return c, nil
	}
	self, err := h.selfPaths()
	if err != nil {
		return nil, fmt.Errorf("resolve cgroup: %w", err)
	}
	for _, k := range keys {
		p, ok := self[k]
		if !ok {
			return nil, fmt.Errorf("resolve cgroup: caller is in no %s cgroup", k)
		}
		if k == unified {
			c.Paths[k] = filepath.Join(DefaultParentV2(p), name)
		} else {
			c.Paths[k] = filepath.Join(p, parentDir, name)
		}
	}
	return c, nil
}

// SelfLeaf is the group a process sits in to let LazyFork use its delegated group on
// cgroup v2: a process in <group>/lazyfork-self gets its containers in <group>/lazyfork
// (for the daemon under systemd >= 254: DelegateSubgroup=lazyfork-self).
const SelfLeaf = "lazyfork-self"

// DefaultParentV2 is the default parent on cgroup v2 for a caller in group self
// (relative to the v2 mount). v2 lets a group that holds processes enable no controllers
// for its children, and the caller's own group always holds the caller (a login shell's
// session scope holds the shell too; a service's group its main process), so the v1 rule
// `<self>/lazyfork` cannot work there. The default is instead `/lazyfork` at the top of
// the hierarchy the caller sees (the root cgroup may hold processes and still delegate),
// or `<group>/lazyfork` when the caller sits in `<group>/lazyfork-self`, a leaf of a
// group delegated to it. LazyFork never moves processes it did not start.
func DefaultParentV2(self string) string {
	if filepath.Base(self) == SelfLeaf {
		return filepath.Join(filepath.Dir(self), parentDir)
	}
	return "/" + parentDir
}

// Create makes a new group called name under parent (see Resolve). It fails with
// ErrExists if the group exists in any hierarchy.
func Create(name, parent string) (*Cgroup, error) {
	c, err := Resolve(name, parent)
	if err != nil {
		return nil, err
	}
	var need []string
	if c.V2 {
		need = v2Required
	}
	if err := c.create(need); err != nil {
		return nil, err
	}
	return c, nil
}

// create makes the group's directory in every hierarchy, parents as needed, and on v2
// enables the controllers in need for it. On failure it removes what it made.
func (c *Cgroup) create(need []string) (retErr error) {
	var made []string // dirs made here, deepest last
	defer func() {
		if retErr != nil {
			for _, d := range slices.Backward(made) {
				_ = unix.Rmdir(d)
			}
		}
	}()
	for _, k := range c.keys() {
		dir, err := c.dir(k)
		if err != nil {
			return err
		}
		// A concurrent Remove may rmdir an empty parent between our mkdirs: retry.
		for attempt := 0; ; attempt++ {
			parents, err := mkdirAll(filepath.Dir(dir))
			made = append(made, parents...)
			if err != nil {
				return fmt.Errorf("create cgroup parent %s: %w", filepath.Dir(dir), err)
			}
			if c.V2 {
				err = enableControllers(c.mounts[k].dir, filepath.Dir(c.Paths[k]), need)
			}
			if err == nil {
				err = os.Mkdir(dir, 0o755)
			}
			if err == nil {
				made = append(made, dir)
				break
			}
			if errors.Is(err, os.ErrExist) {
				return fmt.Errorf("create cgroup %s:%s: %w", k, c.Paths[k], ErrExists)
			}
			if !errors.Is(err, os.ErrNotExist) || attempt == 2 {
				if c.V2 && errors.Is(err, unix.EBUSY) {
					return err // enableControllers' error names the problem and the fix
				}
				return fmt.Errorf("create cgroup %s: %w", dir, err)
			}
		}
	}
	return c.open()
}

// mkdirAll is os.MkdirAll that reports which directories it made, outermost first.
func mkdirAll(dir string) ([]string, error) {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) || d == "/" {
			return nil, err
		}
		missing = append(missing, d)
	}
	var made []string
	for _, d := range slices.Backward(missing) {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return made, err
		} else if err == nil {
			made = append(made, d)
		}
	}
	return made, nil
}

// enableControllers makes the v2 controllers in need available to children of rel by
// writing cgroup.subtree_control from the mount down to rel, only where one is missing:
// v2 offers a controller to a group only if every ancestor enables it.
func enableControllers(mountDir, rel string, need []string) error {
	if len(need) == 0 {
		return nil
	}
	d := mountDir
	for _, part := range append([]string{""}, strings.Split(strings.Trim(rel, "/"), "/")...) {
		d = filepath.Join(d, part)
		b, err := os.ReadFile(filepath.Join(d, "cgroup.subtree_control"))
		if err != nil {
			return fmt.Errorf("enable controllers in %s: %w", d, err)
		}
		var add []string
		for _, n := range need {
			if !slices.Contains(strings.Fields(string(b)), n) {
				add = append(add, "+"+n)
			}
		}
		if len(add) == 0 {
			continue
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte(strings.Join(add, " ")), 0); err != nil {
			if errors.Is(err, unix.EBUSY) {
				return fmt.Errorf("enable controllers %v in %s: %w (cgroup v2 gives no controllers to the children of a group that holds processes: set %s to an empty delegated group, or run LazyFork in a %s leaf of one)",
					add, d, err, ParentEnv, SelfLeaf)
			}
			return fmt.Errorf("enable controllers %v in %s: %w", add, d, err)
		}
	}
	return nil
}

// Load opens an existing group from its paths (as printed by Create).
func Load(p Paths) (*Cgroup, error) {
	c := &Cgroup{Paths: p}
	keys := slices.Sorted(maps.Keys(p))
	switch {
	case slices.Equal(keys, []string{unified}):
		c.V2 = true
	case slices.Equal(keys, slices.Sorted(slices.Values(v1Controllers))):
	case slices.Equal(keys, slices.Sorted(slices.Values(append([]string{v1Devices}, v1Controllers...)))):
	default:
		return nil, fmt.Errorf("load cgroup: want paths for %v or [%s], got %v", v1Controllers, unified, keys)
	}
	for _, k := range keys {
		v := p[k]
		name := filepath.Base(v)
		if !filepath.IsAbs(v) || filepath.Clean(v) != v || !owned.ValidName(name) {
			return nil, fmt.Errorf("load cgroup: bad %s path %q", k, v)
		}
		if c.Name != "" && c.Name != name {
			return nil, fmt.Errorf("load cgroup: paths name different groups: %v", p)
		}
		c.Name = name
	}
	h, err := detectHost()
	if err != nil {
		return nil, err
	}
	c.mounts = h.mounts
	for _, k := range keys {
		dir, err := c.dir(k)
		if err != nil {
			return nil, err
		}
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("load cgroup: %w", err)
		}
	}
	return c, c.open()
}

// open attaches the containerd/cgroups handles, restricted to our hierarchies.
func (c *Cgroup) open() error {
	if c.V2 {
		m, err := cgroup2.Load(c.Paths[unified], cgroup2.WithMountpoint(c.mounts[unified].dir))
		if err != nil {
			return fmt.Errorf("open cgroup %s: %w", c.Name, err)
		}
		c.v2 = m
		return nil
	}
	// containerd places a v1 subsystem at <root>/<name>, so each mount must be named so.
	var subs []cgroup1.Subsystem
	for _, k := range c.keys() {
		dir := c.mounts[k].dir
		if filepath.Base(dir) != k {
			return fmt.Errorf("open cgroup %s: v1 %s hierarchy mounted at %s, want a dir named %s", c.Name, k, dir, k)
		}
		root := filepath.Dir(dir)
		switch k {
		case "memory":
			// kmem is read by hand: its limit files are gone on newer kernels.
			subs = append(subs, cgroup1.NewMemory(root, cgroup1.OptionalSwap(), cgroup1.IgnoreModules("kmem", "kmem.tcp")))
		case "pids":
			subs = append(subs, cgroup1.NewPids(root))
		case "freezer":
			subs = append(subs, cgroup1.NewFreezer(root))
		case v1Devices:
			subs = append(subs, cgroup1.NewDevices(root))
		}
	}
	path := func(n cgroup1.Name) (string, error) {
		if p, ok := c.Paths[string(n)]; ok {
			return p, nil
		}
		return "", cgroup1.ErrControllerNotActive
	}
	cg, err := cgroup1.Load(path, cgroup1.WithHierarchy(func() ([]cgroup1.Subsystem, error) { return subs, nil }))
	if err != nil {
		return fmt.Errorf("open cgroup %s: %w", c.Name, err)
	}
	c.v1 = cg
	return nil
}

// keys are the hierarchies the group lives in: v1's required ones first, then devices
// if the group has it.
func (c *Cgroup) keys() []string {
	if c.V2 {
		return []string{unified}
	}
	keys := slices.Clone(v1Controllers)
	if _, ok := c.Paths[v1Devices]; ok {
		keys = append(keys, v1Devices)
	}
	return keys
}

// dir is the group's absolute directory in hierarchy k.
func (c *Cgroup) dir(k string) (string, error) {
	m, ok := c.mounts[k]
	if !ok {
		return "", fmt.Errorf("cgroup %s: no %s hierarchy mounted", c.Name, k)
	}
	return filepath.Join(m.dir, c.Paths[k]), nil
}

// Remove deletes the group (and any child groups) in every hierarchy, then the parent
// `lazyfork` dir where nothing else is left in it. It fails if processes remain.
func (c *Cgroup) Remove() error {
	var errs []error
	for _, k := range c.keys() {
		dir, err := c.dir(k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := removeTree(dir); err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s:%s: %w", k, c.Paths[k], err))
			continue
		}
		if parent := filepath.Dir(dir); filepath.Base(parent) == parentDir {
			_ = unix.Rmdir(parent) // fails harmlessly while other groups live there
		}
	}
	return errors.Join(errs...)
}

// removeTree rmdirs dir's child groups, deepest first, then dir. Missing is success.
func removeTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	// The kernel may still be tearing down a just-emptied group: retry EBUSY briefly.
	delay := 5 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if pids, _ := readProcs(dir); len(pids) > 0 {
			return fmt.Errorf("still holds processes %v: %w", pids, err)
		}
		if !errors.Is(err, unix.EBUSY) || attempt == 5 {
			return err
		}
		time.Sleep(delay)
		delay *= 2
	}
}

// CriuRootArgs are the values for criu restore's --cgroup-root, one per option, putting
// the restored tasks into this group (paths are relative to the hierarchy mounts, which is
// what CRIU expects with --cgroup-yard /sys/fs/cgroup). v1: "memory:/p", "pids:/p",
// "freezer:/p". v2: "/p" on a pure v2 host (applies to every hierarchy); ":/p" (the v2
// hierarchy only) when v1 hierarchies are mounted too.
func (c *Cgroup) CriuRootArgs() []string {
	if c.V2 {
		if cgroups.Mode() == cgroups.Unified {
			return []string{c.Paths[unified]}
		}
		return []string{":" + c.Paths[unified]}
	}
	var out []string
	for _, k := range c.keys() {
		out = append(out, k+":"+c.Paths[k])
	}
	return out
}

// FreezerDir is the absolute directory for criu dump --freeze-cgroup: the v1 freezer
// group, or the v2 group (CRIU picks freezer.state or cgroup.freeze by what it finds).
func (c *Cgroup) FreezerDir() string {
	k := "freezer"
	if c.V2 {
		k = unified
	}
	d, _ := c.dir(k)
	return d
}

// AllProcsFiles is ProcsFiles with the devices hierarchy's (v1) included: for a criu
// that clones the tree straight into the group and places it nowhere else
// (criu.RestoreOptions.JoinCgroupAll).
func (c *Cgroup) AllProcsFiles() []string {
	var out []string
	for _, k := range c.keys() {
		if dir, err := c.dir(k); err == nil {
			out = append(out, filepath.Join(dir, "cgroup.procs"))
		}
	}
	return out
}

// ProcsFiles lists the group's cgroup.procs file in every hierarchy: a process that
// writes "0" to each joins the group (how criu is put in a fork's group before it
// clones the fork's tasks, so their kernel allocations are charged to the fork).
//
// The devices hierarchy is left out: criu itself must not be bound by the allow-list.
func (c *Cgroup) ProcsFiles() []string {
	var out []string
	for _, k := range c.keys() {
		if k == v1Devices {
			continue
		}
		if dir, err := c.dir(k); err == nil {
			out = append(out, filepath.Join(dir, "cgroup.procs"))
		}
	}
	return out
}
