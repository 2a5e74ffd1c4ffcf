package snaptree

import (
	"path/filepath"
	"strings"
	"time"

	"github.com/lazyfork/lazyfork/lib/budget"
	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/ksm"
	"github.com/lazyfork/lazyfork/lib/memfile"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/procfs"
	"github.com/lazyfork/lazyfork/lib/store"
)

// refresh brings every node's live figures up to date: state (a live node whose
// processes are gone is exited), RAM (its cgroup's charge), CPU time and, when that
// changed, last-active; disk shares; and the tree's usage.
func refresh(t *Tree, rt *container.Runtime) {
	now := time.Now().UTC()
	for _, n := range t.Nodes {
		if n.Kind == NodeKindCluster {
			if n.State != StateSuspended {
				refreshCluster(t, n, rt, now)
			}
			continue
		}
		c, err := rt.Containers.Get(n.ID)
		if n.State == StateSuspended {
			// RAMBytes stays what it was at suspend: a resume is planned with it.
			continue
		}
		if err != nil || rt.State(c) == store.StateExited || c.State == store.StateStopped {
			n.State, n.RAMBytes = StateExited, 0
			continue
		}
		n.State = StateLive
		if cg, err := container.Cgroup(c); err == nil {
			if st, err := cg.Stats(); err == nil {
				n.RAMBytes = int64(st.MemoryBytes)
			}
			if t.KSM {
				n.KSMMergingPages, _ = ksm.CgroupMergingPages(cg.Paths)
			}
			if ticks, ok := cpuTicks(cg); ok && ticks != n.CPUTicks {
				// CPU time used since the last look: the node did something.
				n.CPUTicks, n.LastActive = ticks, now
			}
		}
	}
	sharedRAM(t, rt)
	// Disk: each node's packed dirs plus an equal share of every packed file it needs.
	refs := map[string]int{}
	for _, n := range t.Nodes {
		for _, p := range n.Packed {
			for _, f := range p.Files {
				refs[filepath.Join(p.Family, f)]++
			}
		}
	}
	for _, n := range t.Nodes {
		n.DiskBytes = 0
		for _, p := range n.Packed {
			n.DiskBytes += p.Bytes
			for _, f := range p.Files {
				k := filepath.Join(p.Family, f)
				n.DiskBytes += familyFileBytes(t.StoreDir(p.Family), []string{f, f + ".map"}) / int64(refs[k])
			}
		}
	}
	t.Usage = usage(t)
	t.Usage.TmpfsBytes = tmpfsBytes(t, rt)
}

// usage measures the tree: live members, the tree cgroup's charge and the directory's
// physical size (refresh adds the families' tmpfs bytes).
func usage(t *Tree) Usage {
	var u Usage
	for _, n := range t.Nodes {
		if n.State == StateLive {
			u.Live++
			u.RAMBytes += n.RAMBytes
		}
	}
	if cg, err := cgroup.LoadOwned(t.Cgroup); err == nil {
		if st, err := cg.Stats(); err == nil {
			u.RAMBytes = int64(st.MemoryBytes)
		}
	}
	u.DiskBytes = diskBytes(t.Dir())
	return u
}

// families are the memory-file families the tree's containers use.
func families(t *Tree, rt *container.Runtime) []string {
	seen := map[string]bool{}
	var out []string
	add := func(f string) {
		if f != "" && !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	for _, n := range t.NodeList() {
		if c, err := rt.Containers.Get(n.ID); err == nil {
			add(c.Family)
		}
		for _, m := range n.MemberIDs {
			if c, err := rt.Containers.Get(m); err == nil {
				add(c.Family)
			}
		}
		for _, p := range n.Packed {
			add(p.Family)
		}
	}
	return out
}

// tmpfsBytes is what the tree's families hold on tmpfs.
func tmpfsBytes(t *Tree, rt *container.Runtime) int64 {
	var n int64
	for _, f := range families(t, rt) {
		n += fork.FamilyBytes(f)
	}
	return n
}

// budgetTree is the tree as lib/budget sees it. An exited node holds nothing live and is
// not evictable: it counts as suspended with no RAM.
func budgetTree(t *Tree) *budget.Tree {
	bt := &budget.Tree{Budget: t.Budget.Lib(), Nodes: map[string]*budget.Node{}}
	for _, n := range t.Nodes {
		st, ram := budget.Live, n.RAMBytes
		if n.State != StateLive {
			st, ram = budget.Suspended, 0
		}
		// A cluster node restores from its own cut, a whole image of every member with
		// the memory files it needs: for the chain depth it is its own keyframe.
		bt.Nodes[n.ID] = &budget.Node{ID: n.ID, Parent: n.Parent, State: st, Protected: n.Protected,
			Keyframe: n.HasKeyframe || n.Kind == NodeKindCluster, RAMBytes: ram, SharedRAMBytes: n.SharedRAMBytes, DiskBytes: n.DiskBytes,
			SuspendBytes: suspendEstimate(n), LastActive: n.LastActive.UnixNano()}
	}
	return bt
}

// suspendEstimate is what suspending n would write to disk: its RAM (its private pages
// and what its dump captures) when live.
func suspendEstimate(n *Node) int64 {
	if n.State != StateLive {
		return 0
	}
	return n.RAMBytes
}

// cpuTicks is the CPU time (user+system, clock ticks) of every process in the group.
// cgroup v1 here has no cpuacct for containers, so it is summed from /proc/<pid>/stat.
func cpuTicks(cg *cgroup.Cgroup) (uint64, bool) {
	pids, err := cg.Procs()
	if err != nil {
		return 0, false
	}
	var sum uint64
	for _, pid := range pids {
		st, err := procfs.ReadStat(pid)
		if err != nil {
			continue
		}
		sum += st.UTime + st.STime
	}
	return sum, true
}

// sharedRAM sets every keyframe node's SharedRAMBytes: what the memory files its keyframe
// needs (memfile.ReferencedFiles: its own, and those of earlier generations and ancestors
// it maps for the pages it did not change) hold on tmpfs, each file counted once in the
// tree, for the oldest node that needs it (the root first). A refreshed node keeps mapping
// its earlier generations' files; counting only the files named after its current keyframe
// would leave them out of the budget. A keyframe not on tmpfs (packed) counts the files
// named after it.
func sharedRAM(t *Tree, rt *container.Runtime) {
	claimed := map[string]bool{}
	sizes := map[string]map[string]int64{} // family -> file -> tmpfs bytes
	for _, n := range t.NodeList() {
		n.SharedRAMBytes = 0
		if !n.HasKeyframe {
			continue
		}
		c, err := rt.Containers.Get(n.ID)
		if err != nil || c.Family == "" {
			continue
		}
		if sizes[c.Family] == nil {
			sizes[c.Family] = map[string]int64{}
			files, _ := memfile.FamilyFiles(filepath.Join(paths.Families(), c.Family))
			for _, f := range files {
				sizes[c.Family][f.Name] = f.Bytes
			}
		}
		var refs []string
		if s, err := fork.LoadSnapshot(n.Keyframe); err == nil {
			refs, _ = memfile.ReferencedFiles(s.CheckpointDir)
		}
		if refs == nil {
			for name := range sizes[c.Family] {
				if strings.HasPrefix(name, n.Keyframe+"-") {
					refs = append(refs, name)
				}
			}
		}
		for _, name := range refs {
			k := c.Family + "/" + name
			if !claimed[k] {
				claimed[k] = true
				n.SharedRAMBytes += sizes[c.Family][name]
			}
		}
	}
}

// keyframeTmpfsBytes is what the memory files written for keyframe (named after it) hold
// on tmpfs in family.
func keyframeTmpfsBytes(family, keyframe string) int64 {
	if family == "" || keyframe == "" {
		return 0
	}
	files, err := memfile.FamilyFiles(filepath.Join(paths.Families(), family))
	if err != nil {
		return 0
	}
	var n int64
	for _, f := range files {
		if strings.HasPrefix(f.Name, keyframe+"-") {
			n += f.Bytes
		}
	}
	return n
}
