package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	"golang.org/x/sys/unix"
)

// Bounds for state changes. Freezing takes milliseconds unless a task is stuck in the
// kernel; a caller must never hang on one.
const (
	freezeTimeout = 5 * time.Second
	killTimeout   = 5 * time.Second
)

// AddProc moves the whole process pid (all its threads) into the group in every hierarchy.
func (c *Cgroup) AddProc(pid int) error {
	var err error
	if c.V2 {
		err = c.v2.AddProc(uint64(pid))
	} else {
		err = c.v1.AddProc(uint64(pid))
	}
	if err != nil {
		return fmt.Errorf("add process %d to cgroup %s: %w", pid, c.Name, err)
	}
	return nil
}

// ThreadJoinFiles lists, on v1, the group's `tasks` file in every hierarchy (nil on v2):
// a thread that writes "0" to each (lib/helper's JoinThread) moves itself into the group. A thread
// moving itself is the one migration the kernel makes without taking its global
// threadgroup lock, whose write side waits for an RCU grace period (moving another
// process through cgroup.procs: 8-15 ms on these hosts). After an execve from that
// thread the whole process is in the group: execve ends every other thread.
func (c *Cgroup) ThreadJoinFiles() []string {
	if c.V2 {
		return nil
	}
	var out []string
	for _, k := range c.keys() {
		if dir, err := c.dir(k); err == nil {
			out = append(out, filepath.Join(dir, "tasks"))
		}
	}
	return out
}

// Procs lists the processes in the group and its child groups, in any hierarchy, sorted.
func (c *Cgroup) Procs() ([]int, error) {
	var pids []int
	if c.V2 {
		ps, err := c.v2.Procs(true)
		if err != nil {
			return nil, fmt.Errorf("list processes of cgroup %s: %w", c.Name, err)
		}
		for _, p := range ps {
			pids = append(pids, int(p))
		}
	} else {
		for _, k := range c.keys() {
			ps, err := c.v1.Processes(cgroup1.Name(k), true)
			if err != nil {
				return nil, fmt.Errorf("list processes of cgroup %s:%s: %w", k, c.Paths[k], err)
			}
			for _, p := range ps {
				pids = append(pids, p.Pid)
			}
		}
	}
	slices.Sort(pids)
	return slices.Compact(pids), nil
}

// Stats is a group's accounting. On v1, MemoryBytes is rss + cache + kmem (memory.stat
// total_* plus memory.kmem.usage_in_bytes): memory.usage_in_bytes is off by up to 256 kB
// per group from per-CPU charge batching. On v2 it is memory.current.
type Stats struct {
	MemoryBytes uint64 `json:"memory_bytes"`
	Rss         uint64 `json:"rss"`         // anonymous memory (v2: anon)
	Cache       uint64 `json:"cache"`       // page cache (v2: file)
	Kmem        uint64 `json:"kmem"`        // kernel memory: page tables, stacks, slab
	MappedFile  uint64 `json:"mapped_file"` // page cache mapped by the group's tasks
	Pids        int    `json:"pids"`        // processes (thread groups) in the group
	Tasks       int    `json:"tasks"`       // pids.current: threads, what pids.max limits
	Frozen      bool   `json:"frozen"`
}

// Stats reads the group's memory and pids accounting and freezer state.
func (c *Cgroup) Stats() (Stats, error) {
	var s Stats
	procs, err := c.Procs()
	if err != nil {
		return s, err
	}
	s.Pids = len(procs)
	if s.Frozen, err = c.Frozen(); err != nil {
		return s, err
	}
	if c.V2 {
		return s, c.statsV2(&s)
	}
	m, err := c.v1.Stat()
	if err != nil {
		return s, fmt.Errorf("read stats of cgroup %s: %w", c.Name, err)
	}
	if m.Memory != nil {
		s.Rss, s.Cache, s.MappedFile = m.Memory.TotalRSS, m.Memory.TotalCache, m.Memory.TotalMappedFile
	}
	if m.Pids != nil {
		s.Tasks = int(m.Pids.Current)
	}
	dir, _ := c.dir("memory")
	if s.Kmem, err = readUint(filepath.Join(dir, "memory.kmem.usage_in_bytes")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return s, fmt.Errorf("read stats of cgroup %s: %w", c.Name, err)
	}
	s.MemoryBytes = s.Rss + s.Cache + s.Kmem
	return s, nil
}

// statsV2 reads the v2 files directly: the kernel's "kernel" total and pagetables are
// not in containerd's v2 stats. A controller that is not enabled reads as zero.
func (c *Cgroup) statsV2(s *Stats) error {
	dir, _ := c.dir(unified)
	kv, err := readKV(filepath.Join(dir, "memory.stat"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read stats of cgroup %s: %w", c.Name, err)
	}
	s.Rss, s.Cache, s.MappedFile = kv["anon"], kv["file"], kv["file_mapped"]
	s.Kmem = kv["kernel"]
	if _, ok := kv["kernel"]; !ok { // kernels before 5.18
		s.Kmem = kv["kernel_stack"] + kv["pagetables"] + kv["percpu"] + kv["sock"] + kv["slab"]
	}
	if s.MemoryBytes, err = readUint(filepath.Join(dir, "memory.current")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read stats of cgroup %s: %w", c.Name, err)
	}
	tasks, err := readUint(filepath.Join(dir, "pids.current"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read stats of cgroup %s: %w", c.Name, err)
	}
	s.Tasks = int(tasks)
	return nil
}

// Freeze stops every task in the group and waits until the kernel reports it frozen.
// On timeout the group is thawed again and an error returned.
func (c *Cgroup) Freeze() error {
	if err := c.setFrozen(true); err != nil {
		_ = c.setFrozen(false)
		return fmt.Errorf("freeze cgroup %s: %w", c.Name, err)
	}
	return nil
}

// Thaw resumes the group and waits until the kernel reports it thawed.
func (c *Cgroup) Thaw() error {
	if err := c.setFrozen(false); err != nil {
		return fmt.Errorf("thaw cgroup %s: %w", c.Name, err)
	}
	return nil
}

// setFrozen is containerd's freeze loop with a deadline: containerd's waits forever.
func (c *Cgroup) setFrozen(want bool) error {
	file, value := "freezer.state", "THAWED"
	if want {
		value = "FROZEN"
	}
	if c.V2 {
		file, value = "cgroup.freeze", "0"
		if want {
			value = "1"
		}
	}
	dir := c.FreezerDir()
	deadline := time.Now().Add(freezeTimeout)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		// v1 needs the write repeated: a task forked while FREEZING can escape it.
		if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
			return err
		}
		got, err := c.Frozen()
		if err != nil {
			return err
		}
		if got == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", freezeTimeout)
		}
		time.Sleep(delay)
	}
}

// Frozen reports whether the group is completely frozen (v1 FROZEN, v2 "frozen 1").
func (c *Cgroup) Frozen() (bool, error) {
	dir := c.FreezerDir()
	if c.V2 {
		kv, err := readKV(filepath.Join(dir, "cgroup.events"))
		if err != nil {
			return false, fmt.Errorf("read freezer state of %s: %w", dir, err)
		}
		return kv["frozen"] == 1, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
	if err != nil {
		return false, fmt.Errorf("read freezer state of %s: %w", dir, err)
	}
	return strings.TrimSpace(string(b)) == "FROZEN", nil
}

// Kill SIGKILLs every process in the group and waits until it is empty. The group is
// frozen first, so no task can fork and no listed pid can exit and be reused before its
// signal; then thawed so the signals are delivered.
// A group already removed has nothing to kill.
func (c *Cgroup) Kill() error {
	if _, err := os.Stat(c.FreezerDir()); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if c.V2 {
		dir, _ := c.dir(unified)
		// cgroup.kill (Linux 5.14) kills the whole subtree atomically.
		if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err == nil {
			return c.waitEmpty()
		}
	}
	frozenErr := c.Freeze() // best effort: a task stuck in the kernel may refuse
	pids, err := c.Procs()
	if err != nil {
		return fmt.Errorf("kill cgroup %s: %w", c.Name, err)
	}
	for _, p := range pids {
		if err := unix.Kill(p, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("kill cgroup %s: pid %d: %w", c.Name, p, err)
		}
	}
	if err := c.Thaw(); err != nil {
		return fmt.Errorf("kill cgroup %s: %w", c.Name, errors.Join(frozenErr, err))
	}
	return c.waitEmpty()
}

// waitEmpty waits until no process is left, killing newcomers (children forked while
// the group could not be frozen).
func (c *Cgroup) waitEmpty() error {
	deadline := time.Now().Add(killTimeout)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		pids, err := c.Procs()
		if err != nil {
			return fmt.Errorf("kill cgroup %s: %w", c.Name, err)
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kill cgroup %s: processes %v still alive after %s", c.Name, pids, killTimeout)
		}
		for _, p := range pids {
			_ = unix.Kill(p, unix.SIGKILL)
		}
		time.Sleep(delay)
	}
}

// readProcs reads one group's cgroup.procs (not its children).
func readProcs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := string(bytes.TrimSpace(b))
	if s == "max" {
		return 0, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return v, nil
}

// readKV parses a flat "key value" file such as memory.stat or cgroup.events.
func readKV(path string) (map[string]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	kv := map[string]uint64{}
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseUint(f[1], 10, 64); err == nil {
			kv[f[0]] = v
		}
	}
	return kv, nil
}
