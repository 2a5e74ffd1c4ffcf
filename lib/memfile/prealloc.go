package memfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Preallocation: a source's first dump for a swap writes its whole heap twice while it is
// frozen (CRIU into pages-*.img, the rewrite into memory files), and writing into tmpfs
// pages allocated beforehand is about twice as fast on this machine kind as into fresh
// ones. So before the freeze, while the source runs, each process's memory file is created
// and the pages it will hold are allocated (fallocate at offset = address, as the rewrite
// places them), from the process's present anonymous pages. The rewrite then writes into
// them (Options.Prealloc) and punches out whatever the checkpoint does not hold (pages
// freed between the scan and the freeze, zero pages), so the file ends as a fresh one
// would. Pages the process gained in between are allocated by the write as before.

// PreallocRun is a range of addresses [Start, End) whose pages get allocated.
type PreallocRun struct{ Start, End uint64 }

// Pages is the run's length in pages.
func (r PreallocRun) Pages() int64 { return int64(r.End-r.Start) / pageSize }

// preallocGap: present runs this close (pages) are allocated as one, gap included: fewer
// fallocate calls; the gap is punched out again by the rewrite.
const preallocGap = 8

// PAGEMAP_SCAN (linux/fs.h, kernel >= 6.7): the page-table walk reports present ranges
// without reading one pagemap entry per page of a VMA, however large the VMA.
const (
	pageIsFile      = 1 << 2
	pageIsPresent   = 1 << 3
	pageIsSwapped   = 1 << 4
	pageIsPFNZero   = 1 << 5
	pmScanVecLen    = 512
	pagemapScanIoct = 0xc0606610 // _IOWR('f', 16, struct pm_scan_arg)
)

type pmScanArg struct {
	Size, Flags, Start, End, WalkEnd, Vec, VecLen, MaxPages       uint64
	CategoryInverted, CategoryMask, CategoryAnyofMask, ReturnMask uint64
}

type pageRegion struct{ Start, End, Categories uint64 }

// AnonRuns returns the ranges of host process pid's anonymous pages that are present or
// swapped (not the shared zero page, not page cache: what CRIU dumps of private memory),
// below AnonFileSize, merged across gaps of a few pages, holding at most maxPages pages
// in all (the caller's cap: the sizes come from a process it does not trust). It returns
// the pages they hold.
func AnonRuns(pid int, maxPages int64) ([]PreallocRun, int64, error) {
	if maxPages <= 0 {
		return nil, 0, nil
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	var runs []PreallocRun
	var total int64
	// The kernel takes [start, end) below TASK_SIZE_MAX (x86-64: 2^47 - one page).
	end := uint64(AnonFileSize - pageSize)
	vec := make([]pageRegion, pmScanVecLen)
scan:
	for start := uint64(0); start < end && total < maxPages; {
		arg := pmScanArg{
			Start: start, End: end,
			Vec: uint64(uintptr(unsafe.Pointer(&vec[0]))), VecLen: uint64(len(vec)),
			MaxPages: uint64(maxPages - total),
			// Not page cache (a file page, or a shared anonymous one) and not the zero page;
			// present or swapped.
			CategoryInverted: pageIsFile | pageIsPFNZero, CategoryMask: pageIsFile | pageIsPFNZero,
			CategoryAnyofMask: pageIsPresent | pageIsSwapped, ReturnMask: pageIsPresent | pageIsSwapped,
		}
		arg.Size = uint64(unsafe.Sizeof(arg))
		n, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), pagemapScanIoct, uintptr(unsafe.Pointer(&arg)))
		runtime.KeepAlive(vec)
		if errno != 0 {
			return nil, 0, fmt.Errorf("scan /proc/%d/pagemap: %w", pid, errno)
		}
		for _, r := range vec[:n] {
			if r.End <= r.Start || r.Start%uint64(pageSize) != 0 {
				continue
			}
			pages := int64(r.End-r.Start) / pageSize
			if k := len(runs); k > 0 && r.Start >= runs[k-1].End && r.Start-runs[k-1].End <= preallocGap*uint64(pageSize) {
				gap := int64(r.Start-runs[k-1].End) / pageSize
				if total+gap+pages > maxPages {
					break scan
				}
				runs[k-1].End = r.End
				total += gap + pages
				continue
			}
			if total+pages > maxPages {
				r.End = r.Start + uint64(maxPages-total)*uint64(pageSize)
				pages = maxPages - total
			}
			runs = append(runs, PreallocRun{r.Start, r.End})
			total += pages
		}
		// The walk stopped at WalkEnd: the vector was full, max_pages was reached, or the
		// end.
		if arg.WalkEnd <= start || arg.WalkEnd >= end {
			break
		}
		start = arg.WalkEnd
	}
	return runs, total, nil
}

// NSPid returns host process pid's pid in its innermost pid namespace: the pid CRIU's
// images name it by (a container's processes are dumped from inside their namespace).
func NSPid(pid int) (uint32, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			n, err := strconv.ParseUint(f[len(f)-1], 10, 32)
			if err != nil {
				return 0, fmt.Errorf("read /proc/%d/status: NSpid %q: %w", pid, rest, err)
			}
			return uint32(n), nil
		}
	}
	return 0, fmt.Errorf("read /proc/%d/status: no NSpid line", pid)
}

// PreallocName is the name of the file Preallocate makes in a family directory for the
// process the checkpoint prefix will name nspid. It starts with the prefix, so that a
// family's generations (fork.pruneGenerations) count it as the snapshot's.
func PreallocName(prefix string, nspid uint32) string {
	return fmt.Sprintf("%s-prealloc-%d.mem", prefix, nspid)
}

// ParsePreallocName is PreallocName's inverse.
func ParsePreallocName(prefix, name string) (uint32, bool) {
	rest, ok := strings.CutPrefix(name, prefix+"-prealloc-")
	if !ok {
		return 0, false
	}
	rest, ok = strings.CutSuffix(rest, ".mem")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(rest, 10, 32)
	if err != nil || strconv.FormatUint(n, 10) != rest {
		return 0, false
	}
	return uint32(n), true
}

// Preallocated is what Preallocate allocated.
type Preallocated struct {
	Bytes     int64
	HugePages int
	// HugeSlow: fresh huge pages came too slowly (HugePagesWhileFast), and the stretches
	// after were allocated in small pages.
	HugeSlow bool
}

// Preallocate creates path (O_EXCL, a memory file's size and mode) and allocates the
// pages of runs in it at offset = address. As policy says, each 2 MiB stretch the runs
// cover densely becomes one huge page (makeHuge) where the kernel can: the dump is
// written into it faster than into small pages, and forks map it without page tables
// (huge.go); the rest, and any stretch the kernel cannot make huge, is allocated in small
// pages. A full tmpfs ends it early without an error: the pages not allocated are written
// into fresh pages by the rewrite, as without it.
func Preallocate(path string, runs []PreallocRun, policy HugePolicy) (Preallocated, error) {
	var res Preallocated
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o400)
	if err != nil {
		return res, fmt.Errorf("preallocate memory file: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(AnonFileSize); err != nil {
		return res, fmt.Errorf("preallocate memory file %s: %w", filepath.Base(path), err)
	}
	var valid []PreallocRun
	for _, r := range runs {
		if r.End <= uint64(AnonFileSize) && r.End > r.Start {
			valid = append(valid, r)
		}
	}
	valid = mergeRuns(valid)
	fd := int(f.Fd())
	made, slow := makeHuge(fd, denseStretches(valid), policy)
	res.HugePages, res.HugeSlow = len(made), slow
	res.Bytes = int64(len(made)) * hugeAlign
	for _, r := range valid {
		for at := r.Start; at < r.End; {
			b := int64(at) / hugeAlign * hugeAlign
			end := min(r.End, uint64(b+hugeAlign))
			if made[b] {
				at = end
				continue
			}
			err := unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, int64(at), int64(end-at))
			if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EINTR) {
				return res, nil
			}
			if err != nil {
				return res, fmt.Errorf("preallocate memory file %s at %#x: %w", filepath.Base(path), at, err)
			}
			// fallocate leaves small tmpfs pages untouched: the dump's writes would pay
			// their first touch (on this VM the host's faults; docs/how-it-works.md
			// section 11) while the source is frozen. Zeros written now pay it here, while
			// it runs; the file reads as before.
			if err := writeZeros(fd, int64(at), int64(end-at)); err != nil {
				return res, fmt.Errorf("preallocate memory file %s at %#x: %w", filepath.Base(path), at, err)
			}
			res.Bytes += int64(end - at)
			at = end
		}
	}
	return res, nil
}

// punchOutside punches every page of fd outside keep (sorted, disjoint ranges of file
// offsets) below AnonFileSize: what was preallocated but the checkpoint does not hold,
// except inside the 2 MiB stretches keep covers densely (keepDense).
func punchOutside(fd int, keep []PreallocRun) error {
	keep = keepDense(keep)
	at := uint64(0)
	for _, k := range keep {
		if k.Start > at {
			if err := punchHole(fd, int64(at), int64(k.Start-at)); err != nil {
				return err
			}
		}
		at = max(at, k.End)
	}
	if at < uint64(AnonFileSize) {
		return punchHole(fd, int64(at), AnonFileSize-int64(at))
	}
	return nil
}
