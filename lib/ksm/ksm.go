// Package ksm reads the kernel's same-page merging (KSM) state: ksmd's switch and
// counters, and how many pages of a container's processes it merged. LazyFork never
// starts ksmd; a tree created with KSM only marks its forks' memory mergeable
// (memfile.Options.KSM), and an operator runs ksmd on a same-tenant host
// (docs/security.md).
package ksm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/lazyfork/lazyfork/lib/cgroup"
)

// SysDir is where the kernel exposes ksmd's state.
const SysDir = "/sys/kernel/mm/ksm"

// Status is ksmd's state (Documentation/admin-guide/mm/ksm.rst).
type Status struct {
	Available bool `json:"available"` // the kernel has KSM (CONFIG_KSM)
	// Run: 0 stopped (merged pages stay merged), 1 running, 2 stopped and unmerging.
	Run           int   `json:"run"`
	PagesShared   int64 `json:"pages_shared"`  // distinct merged pages in use
	PagesSharing  int64 `json:"pages_sharing"` // mappings of them: the pages saved
	PagesUnshared int64 `json:"pages_unshared"`
	FullScans     int64 `json:"full_scans"`
	PagesToScan   int64 `json:"pages_to_scan"`
	SleepMillis   int64 `json:"sleep_millisecs"`
}

// ErrUnavailable: the kernel was built without KSM.
var ErrUnavailable = errors.New("this kernel has no KSM (" + SysDir + " is missing; CONFIG_KSM)")

// Read returns ksmd's state. A kernel without KSM gives Available false and no error.
func Read() (Status, error) { return readDir(SysDir) }

func readDir(dir string) (Status, error) {
	var s Status
	if _, err := os.Stat(filepath.Join(dir, "run")); errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	s.Available = true
	var run int64
	for _, f := range []struct {
		name string
		dst  *int64
	}{
		{"run", &run}, {"pages_shared", &s.PagesShared}, {"pages_sharing", &s.PagesSharing},
		{"pages_unshared", &s.PagesUnshared}, {"full_scans", &s.FullScans},
		{"pages_to_scan", &s.PagesToScan}, {"sleep_millisecs", &s.SleepMillis},
	} {
		v, err := readInt(filepath.Join(dir, f.name))
		if err != nil {
			return s, fmt.Errorf("read ksm state: %w", err)
		}
		*f.dst = v
	}
	s.Run = int(run)
	return s, nil
}

// Available returns ErrUnavailable on a kernel without KSM: a tree that asks for KSM
// checks it first, since CRIU's restore of a MADV_MERGEABLE mapping fails there.
func Available() error {
	if _, err := os.Stat(filepath.Join(SysDir, "run")); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return ErrUnavailable
		}
		return fmt.Errorf("check ksm: %w", err)
	}
	return nil
}

// Summary is a one-line account of s for `lazyfork doctor`, with the fix when ksmd does
// not run.
func (s Status) Summary() (detail, fix string) {
	const hint = "echo 1 > " + SysDir + "/run, on a same-tenant host only (docs/security.md)"
	switch {
	case !s.Available:
		return "not in this kernel: trees cannot use ksm", ""
	case s.Run == 1:
		return fmt.Sprintf("ksmd running: %d pages sharing %d merged pages (%s saved); trees opt in with ksm",
			s.PagesSharing, s.PagesShared, mib(s.PagesSharing)), ""
	case s.Run == 2:
		return "ksmd stopped and unmerging (run=2): ksm trees' forks are marked mergeable but nothing merges", hint
	}
	return fmt.Sprintf("ksmd stopped (run=%d): ksm trees' forks are marked mergeable but nothing merges", s.Run), hint
}

func mib(pages int64) string {
	return fmt.Sprintf("%.1f MiB", float64(pages*int64(os.Getpagesize()))/(1<<20))
}

// ProcessMergingPages is how many of process pid's pages KSM merged
// (/proc/<pid>/ksm_merging_pages, Linux 5.16+).
func ProcessMergingPages(pid int) (int64, error) {
	v, err := readInt(fmt.Sprintf("/proc/%d/ksm_merging_pages", pid))
	if err != nil {
		return 0, fmt.Errorf("ksm pages of process %d: %w", pid, err)
	}
	return v, nil
}

// MergingPages sums ProcessMergingPages over pids. A process that exited meanwhile
// counts 0.
func MergingPages(pids []int) (int64, error) {
	var sum int64
	for _, pid := range pids {
		n, err := ProcessMergingPages(pid)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue
		}
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// CgroupMergingPages sums the merged pages of every process in a container's cgroup
// (its record's paths; groups outside LazyFork's subtree are refused).
func CgroupMergingPages(p cgroup.Paths) (int64, error) {
	cg, err := cgroup.LoadOwned(p)
	if err != nil {
		return 0, fmt.Errorf("ksm pages: %w", err)
	}
	pids, err := cg.Procs()
	if err != nil {
		return 0, fmt.Errorf("ksm pages: %w", err)
	}
	return MergingPages(pids)
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// MergeableVMAs counts the mappings of pids that KSM may merge (MADV_MERGEABLE: "mg" in
// smaps' VmFlags). A process that exited meanwhile counts 0.
func MergeableVMAs(pids []int) int {
	n := 0
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "VmFlags:") && strings.Contains(l+" ", " mg ") {
				n++
			}
		}
	}
	return n
}
