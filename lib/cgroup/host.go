package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	cgroups "github.com/containerd/cgroups/v3"
	"github.com/moby/sys/mountinfo"
)

// v1Controllers are the v1 hierarchies LazyFork needs and creates groups in.
var v1Controllers = []string{"memory", "pids", "freezer"}

// v1Devices is the v1 hierarchy of the device allow-list: used where mounted. Records
// written before it was used have no "devices" path and keep working without one.
const v1Devices = "devices"

// isV1Key reports whether k is a v1 hierarchy LazyFork uses.
func isV1Key(k string) bool { return k == v1Devices || slices.Contains(v1Controllers, k) }

// v2Required are the controllers a v2 host must offer for LazyFork to use v2.
var v2Required = []string{"memory", "pids"}

// unified is the Paths key of the cgroup v2 hierarchy.
const unified = "unified"

// mount is one cgroup hierarchy as seen in /proc/self/mountinfo.
type mount struct {
	dir  string // where it is mounted, e.g. /sys/fs/cgroup/memory
	root string // which cgroup of the hierarchy is at dir (usually "/")
}

// host is what Create needs to know about the machine's cgroup layout.
type host struct {
	mounts        map[string]mount // controller (or "unified") -> mount
	v2Controllers []string         // controllers in the v2 root's cgroup.controllers
}

// hostMounts caches the cgroup mounts: they are set up at boot, and reading the whole
// mount table (which grows with every container) for each fork cost more than the rest of
// making its cgroup.
var hostMounts = sync.OnceValues(readCgroupMounts)

// detectHost returns the cgroup mounts of the calling process's mount namespace and the
// v2 controllers enabled now.
func detectHost() (host, error) {
	mounts, err := hostMounts()
	if err != nil {
		return host{}, err
	}
	h := host{mounts: mounts}
	if m, ok := h.mounts[unified]; ok {
		b, err := os.ReadFile(filepath.Join(m.dir, "cgroup.controllers"))
		if err == nil {
			h.v2Controllers = strings.Fields(string(b))
		}
	}
	return h, nil
}

func readCgroupMounts() (map[string]mount, error) {
	ms, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	mounts := map[string]mount{}
	for _, info := range ms {
		m := mount{dir: info.Mountpoint, root: info.Root}
		switch info.FSType {
		case "cgroup2":
			addMount(mounts, unified, m)
		case "cgroup":
			for _, opt := range strings.Split(info.VFSOptions, ",") { // the controllers
				if isV1Key(opt) {
					addMount(mounts, opt, m)
				}
			}
		}
	}
	return mounts, nil
}

// addMount keeps the first mount of a hierarchy that shows its whole tree: later ones
// are often bind mounts or leftover CRIU yards inside work dirs.
func addMount(ms map[string]mount, key string, m mount) {
	if old, ok := ms[key]; ok && (old.root == "/" || m.root != "/") {
		return
	}
	ms[key] = m
}

// backend says which hierarchy Create uses: v2 where the v2 hierarchy offers memory and
// pids, otherwise the v1 memory, pids and freezer hierarchies.
func (h host) backend() (v2 bool, err error) {
	if _, ok := h.mounts[unified]; ok && containsAll(h.v2Controllers, v2Required) {
		return true, nil
	}
	var missing []string
	for _, c := range v1Controllers {
		if _, ok := h.mounts[c]; !ok {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return false, nil
	}
	return false, fmt.Errorf("no usable cgroups: v2 offers %v (need %v), v1 lacks %v",
		h.v2Controllers, v2Required, missing)
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// selfPaths returns the calling process's cgroup per controller key ("unified" for v2),
// relative to each hierarchy's mount, from /proc/self/cgroup.
func (h host) selfPaths() (Paths, error) {
	v1, v2, err := cgroups.ParseCgroupFileUnified("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("read /proc/self/cgroup: %w", err)
	}
	all := map[string]string{}
	for k, p := range v1 {
		if isV1Key(k) {
			all[k] = p
		}
	}
	if _, ok := h.mounts[unified]; ok {
		all[unified] = v2
	}
	out := Paths{}
	for k, p := range all {
		m, ok := h.mounts[k]
		if !ok {
			continue
		}
		rel, err := filepath.Rel(m.root, p)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return nil, fmt.Errorf("own %s cgroup %s is outside the mount at %s (root %s)", k, p, m.dir, m.root)
		}
		out[k] = filepath.Join("/", rel)
	}
	return out, nil
}

// Mode names the host's cgroup layout for doctor: "v1", "hybrid", "v2" or "none".
func Mode() string {
	switch cgroups.Mode() {
	case cgroups.Legacy:
		return "v1"
	case cgroups.Hybrid:
		return "hybrid"
	case cgroups.Unified:
		return "v2"
	}
	return "none"
}

// Facts is what doctor reports about the host's cgroups.
type Facts struct {
	Mode          string            `json:"mode"`
	Backend       string            `json:"backend"`           // "v1" or "v2": what Create uses; "" if unusable
	Problem       string            `json:"problem,omitempty"` // why Create cannot work here
	V1Mounts      map[string]string `json:"v1_mounts"`         // memory/pids/freezer -> mount dir
	V2Mount       string            `json:"v2_mount,omitempty"`
	V2Controllers []string          `json:"v2_controllers"`
	Self          Paths             `json:"self"` // the caller's own cgroups (relative to mounts)
	// DefaultParent is where Create("", name) puts groups for this caller, per hierarchy
	// ($LAZYFORK_CGROUP_PARENT if set); empty if Create cannot work here.
	DefaultParent Paths `json:"default_parent"`
}

// HostFacts describes where the controllers LazyFork needs live on this host.
func HostFacts() (Facts, error) {
	h, err := detectHost()
	if err != nil {
		return Facts{}, err
	}
	f := Facts{Mode: Mode(), V1Mounts: map[string]string{}, V2Controllers: h.v2Controllers}
	if f.V2Controllers == nil {
		f.V2Controllers = []string{}
	}
	for k, m := range h.mounts {
		if k == unified {
			f.V2Mount = m.dir
		} else {
			f.V1Mounts[k] = m.dir
		}
	}
	v2, err := h.backend()
	if err != nil {
		f.Problem = err.Error()
	} else if v2 {
		f.Backend = "v2"
	} else {
		f.Backend = "v1"
	}
	if f.Self, err = h.selfPaths(); err != nil {
		return f, err
	}
	f.DefaultParent = Paths{}
	if f.Problem == "" {
		if c, err := resolve(h, v2, "x", ""); err == nil {
			for k, p := range c.Paths {
				f.DefaultParent[k] = filepath.Dir(p)
			}
		}
	}
	return f, nil
}
