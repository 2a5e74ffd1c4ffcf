package criu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/checkpoint-restore/go-criu/v8/rpc"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/procfs"
	"github.com/lazyfork/lazyfork/lib/trace"
	"golang.org/x/sys/unix"
)

// DefaultKdatDir is where LazyFork keeps criu's kernel probe cache: on the tmpfs state root,
// so it never outlives a reboot (or a kernel).
func DefaultKdatDir() string { return filepath.Join(paths.Run(), "criu") }

// DumpResult is what a dump measured. Times come from CRIU's stats-dump.
type DumpResult struct {
	LogPath            string        `json:"log_path"`
	Wall               time.Duration `json:"wall_ns"`     // whole call, criu start to exit
	Freezing           time.Duration `json:"freezing_ns"` // stopping the tasks
	Frozen             time.Duration `json:"frozen_ns"`   // tasks stopped (the pause they see)
	Memdump            time.Duration `json:"memdump_ns"`
	Memwrite           time.Duration `json:"memwrite_ns"`
	PagesScanned       uint64        `json:"pages_scanned"`
	PagesSkippedParent uint64        `json:"pages_skipped_parent"`
	PagesWritten       uint64        `json:"pages_written"`
	KdatCache          bool          `json:"kdat_cache"` // criu ran with the probe cache
	// FrozenBy says how the tree was stopped: "cgroup" (the freezer) or "ptrace" (CRIU
	// seizing each task; used when a task was already stopped, which the freezer cannot take).
	FrozenBy string `json:"frozen_by"`
}

// RestoreResult is the restored tree's root and what the restore measured. Times come from
// CRIU's stats-restore.
type RestoreResult struct {
	Pid int `json:"pid"` // host PID of the restored root task
	// Process is the restored root, a child of the caller (see the package doc): Wait on it
	// to collect its exit status.
	Process       *os.Process   `json:"-"`
	LogPath       string        `json:"log_path"`
	Wall          time.Duration `json:"wall_ns"`
	Forking       time.Duration `json:"forking_ns"`
	Restore       time.Duration `json:"restore_ns"`
	PagesRestored uint64        `json:"pages_restored"`
	KdatCache     bool          `json:"kdat_cache"`
}

// Dump checkpoints the tree rooted at o.Pid into o.CheckpointDir.
func Dump(ctx context.Context, o DumpOptions) (*DumpResult, error) {
	begin := time.Now()
	ctx, cancel := withDeadline(ctx, o.Timeout)
	defer cancel()
	workDir := orDefault(o.WorkDir, o.CheckpointDir)
	if o.CheckpointDir == "" {
		return nil, errors.New("dump: no checkpoint dir")
	}
	for _, d := range []string{o.CheckpointDir, workDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("dump: create %s: %w", d, err)
		}
	}
	img, err := openDir(o.CheckpointDir)
	if err != nil {
		return nil, fmt.Errorf("dump: %w", err)
	}
	defer img.Close()
	work, err := openDir(workDir)
	if err != nil {
		return nil, fmt.Errorf("dump: %w", err)
	}
	defer work.Close()
	opts, err := o.criuOpts(int(img.Fd()), int(work.Fd()))
	if err != nil {
		return nil, fmt.Errorf("dump: %w", err)
	}
	endHints := trace.Step(ctx, "criu: inotify path hints, stopped-task check")
	opts.IrmapScanPaths = irmapHints(treePids(o.Pid, o.FreezeCgroup))
	frozenBy := "cgroup"
	if o.FreezeCgroup == "" {
		frozenBy = "ptrace"
	} else if tid, comm := StoppedTask(o.FreezeCgroup); tid != 0 {
		// See StoppedTask: freezing the group would hang the dump on this task.
		opts.FreezeCgroup = nil
		frozenBy = fmt.Sprintf("ptrace (task %d %q is stopped)", tid, comm)
	}
	endHints()
	kdat := o.KdatDir
	if kdat != "" && sharesMountNS(o.Pid) {
		kdat = ""
	}
	if dir := opts.GetFreezeCgroup(); dir != "" {
		// A cancelled or timed-out dump must never leave the tree frozen, and criu can only
		// be killed once it leaves an uninterruptible wait on a frozen task: thaw at once,
		// not after criu exits.
		finished := make(chan struct{})
		defer close(finished)
		go func() {
			select {
			case <-ctx.Done():
				thaw(dir)
			case <-finished:
			}
		}()
	}
	t := rpc.CriuReqType_DUMP
	callBegin := time.Now()
	res, err := swrk(ctx, o.Binary, &rpc.CriuReq{Type: &t, Opts: opts}, kdat, nil, o.Notify, o.Hold, o.PageServer, o.NetNS)
	logPath := filepath.Join(workDir, opts.GetLogFile())
	keepLogs("dump", logPath, filepath.Join(workDir, "stats-dump"))
	if err != nil || !res.resp.GetSuccess() {
		if o.FreezeCgroup != "" && ctx.Err() != nil {
			// A killed criu cannot thaw the freezer it froze.
			thaw(o.FreezeCgroup)
		}
		return nil, callError("dump", res, logPath, err)
	}
	r := &DumpResult{LogPath: logPath, Wall: time.Since(begin), KdatCache: res.kdat, FrozenBy: frozenBy}
	if st, err := readStats(filepath.Join(workDir, "stats-dump")); err == nil && st.GetDump() != nil {
		d := st.GetDump()
		r.Freezing = usec(d.GetFreezingTime())
		r.Frozen = usec(d.GetFrozenTime())
		r.Memdump = usec(d.GetMemdumpTime())
		r.Memwrite = usec(d.GetMemwriteTime())
		r.PagesScanned = d.GetPagesScanned()
		r.PagesSkippedParent = d.GetPagesSkippedParent()
		r.PagesWritten = d.GetPagesWritten()
		// CRIU's own account of its run (stats-dump): where in the call is not known,
		// only how long; shown from the call's start.
		trace.Add(ctx, "criu stats: freezing the tasks", callBegin, r.Freezing)
		trace.Add(ctx, "criu stats: tasks frozen", callBegin, r.Frozen)
		trace.Add(ctx, "criu stats: memory dump", callBegin, r.Memdump)
		trace.Add(ctx, "criu stats: memory write", callBegin, r.Memwrite)
	}
	return r, nil
}

// Restore restores the tree in o.CheckpointDir. On success the restored root is running and is
// a child of the caller; on failure no restored task is left behind.
func Restore(ctx context.Context, o RestoreOptions) (*RestoreResult, error) {
	begin := time.Now()
	ctx, cancel := withDeadline(ctx, o.Timeout)
	defer cancel()
	if o.CheckpointDir == "" || o.WorkDir == "" {
		return nil, errors.New("restore: checkpoint dir and work dir are required")
	}
	// Refused on every path, not only where the service would use it: a closed worker is
	// a caller's mistake, whichever criu this host runs the restore with.
	if o.Worker != nil && o.Worker.closed() {
		return nil, errors.New("restore: criu service worker closed before its request")
	}
	if err := os.MkdirAll(o.WorkDir, 0o700); err != nil {
		return nil, fmt.Errorf("restore: create %s: %w", o.WorkDir, err)
	}
	img, err := openDir(o.CheckpointDir)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	defer img.Close()
	work, err := openDir(o.WorkDir)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	defer work.Close()
	yard := o.CgroupYard
	if yard == "" {
		yard = defaultCgroupYard()
	}
	opts, err := o.criuOpts(int(img.Fd()), int(work.Fd()), yard)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	kdat, ownMountNS := o.KdatDir, checkpointHasMountNS(o.CheckpointDir)
	if !ownMountNS {
		kdat = ""
	}
	t := rpc.CriuReqType_RESTORE
	req := &rpc.CriuReq{Type: &t, Opts: opts}
	logPath := filepath.Join(o.WorkDir, opts.GetLogFile())
	// criu can hang after a fatal error (zdtm caps00: a restored task crashed, criu waits
	// for it forever "Killing processes because of failure on restore"): once the log
	// reports an error, criu gets ErrorGrace to exit before it is killed, not the deadline.
	ctx, stalled := watchErrors(ctx, logPath, ErrorGrace)
	var res result
	useService := o.Service != nil && ownMountNS && o.NetNS == ""
	if !useService {
		o.Worker.Close()
	}
	if useService {
		endAdopt := trace.Step(ctx, "criu service: give it the root mount")
		if err := o.Service.adopt(o.Root); err != nil {
			useService = false // a criu of its own sees our mounts
			o.Worker.Close()
		}
		endAdopt()
	}
	if useService {
		// A service restores detached under its worker (it refuses rst_sibling); the
		// worker's exit hands the root to us, the subreaper.
		opts.RstSibling = nil
		sc := ServiceCgroupsFor(o.CheckpointDir, o.JoinCgroup, o.JoinCgroupAll)
		if o.Worker != nil && !o.Worker.cgroups.equal(sc) {
			// Prepared for other groups (guessed before the dump): a worker of its own.
			o.Worker.Close()
			o.Worker = nil
		}
		if sc.Ignore {
			ignore := rpc.CriuCgMode_IGNORE
			opts.ManageCgroupsMode = &ignore
		}
		res, err = o.Service.call(ctx, req, o.Worker, sc, o.Notify)
		// Detached from the service's namespace after the answer, off this restore's path.
		o.Service.forgetLater(o.Root)
	} else {
		res, err = swrk(ctx, o.Binary, req, kdat, o.JoinCgroup, o.Notify, o.Hold, nil, o.NetNS)
	}
	keepLogs("restore", logPath, filepath.Join(o.WorkDir, "stats-restore"))
	if err != nil && stalled() {
		err = fmt.Errorf("criu reported an error and did not exit within %v: %w", ErrorGrace, err)
	}
	if err != nil || !res.resp.GetSuccess() {
		if !res.isolated {
			unmountYardLeftovers(o.WorkDir) // criu unmounts its yard itself unless killed
		}
		root := res.rootPid
		if root == 0 {
			root = rootPidFromLog(logPath)
		}
		reapRoot(root)
		return nil, callError("restore", res, logPath, err)
	}
	pid := int(res.resp.GetRestore().GetPid())
	proc, err := os.FindProcess(pid)
	if err != nil {
		return nil, fmt.Errorf("restore: find restored pid %d: %w", pid, err)
	}
	r := &RestoreResult{Pid: pid, Process: proc, LogPath: logPath, Wall: time.Since(begin), KdatCache: res.kdat}
	if st, err := readStats(filepath.Join(o.WorkDir, "stats-restore")); err == nil && st.GetRestore() != nil {
		s := st.GetRestore()
		r.Forking = usec(s.GetForkingTime())
		r.Restore = usec(s.GetRestoreTime())
		r.PagesRestored = s.GetPagesRestored()
		trace.Add(ctx, "criu stats: forking the tasks", begin, r.Forking)
		trace.Add(ctx, "criu stats: restore", begin, r.Restore)
	}
	return r, nil
}

// Version asks criu (binary: FindBinary's explicit path, "" = the default) for its
// version over RPC.
func Version(ctx context.Context, binary string) (major, minor, patch int, err error) {
	ctx, cancel := withDeadline(ctx, 0)
	defer cancel()
	t := rpc.CriuReqType_VERSION
	res, err := swrk(ctx, binary, &rpc.CriuReq{Type: &t}, "", nil, nil, nil, nil)
	if err != nil || !res.resp.GetSuccess() {
		return 0, 0, 0, callError("version", res, "", err)
	}
	v := res.resp.GetVersion()
	return int(v.GetMajorNumber()), int(v.GetMinorNumber()), int(v.GetSublevel()), nil
}

// Check runs `criu check` of binary (as Version's): nil if criu finds the kernel good
// enough to dump and restore.
func Check(ctx context.Context, binary string) error {
	ctx, cancel := withDeadline(ctx, 0)
	defer cancel()
	bin, err := binaryPath(binary)
	if err != nil {
		return &Error{Op: "check", Err: err}
	}
	fd, err := unix.MemfdCreate("criu-check", unix.MFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("check: memfd: %w", err)
	}
	out := os.NewFile(uintptr(fd), "criu-check")
	defer out.Close()
	cmd := exec.CommandContext(ctx, bin, "check") // killed with SIGKILL at the deadline
	cmd.Env = criuEnv()
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Run()
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	if err != nil {
		return &Error{Op: "check", Err: err, Output: readCapped(out, 8192)}
	}
	return nil
}

func callError(op string, res result, logPath string, err error) *Error {
	e := &Error{Op: op, Err: err, Output: res.stderr}
	if res.resp != nil {
		e.Errno = int(res.resp.GetCrErrno())
		// CRIU reports its first Error line, on these hosts often the harmless rlimit one.
		if msg := res.resp.GetCrErrmsg(); !harmlessError(msg) {
			e.Message = msg
		}
	}
	if logPath != "" {
		if _, statErr := os.Stat(logPath); statErr == nil {
			e.LogPath = logPath
			e.Excerpt = quoteLog(logPath, 5, 60)
		}
	}
	return e
}

func openDir(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

func usec(v uint32) time.Duration { return time.Duration(v) * time.Microsecond }

// defaultCgroupYard is /sys/fs/cgroup on v1 and hybrid hosts, where every hierarchy is
// mounted at /sys/fs/cgroup/<ctrl> (cgroup2 at .../unified), the layout criu expects of a
// yard. On a pure cgroup2 host there is no such layout: criu then makes its own yard.
func defaultCgroupYard() string {
	var fs unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &fs); err != nil || fs.Type == unix.CGROUP2_SUPER_MAGIC {
		return ""
	}
	return "/sys/fs/cgroup"
}

// unmountYardLeftovers detaches cgroup yards a SIGKILLed criu left mounted in the work dir,
// so that nobody ever deletes the work dir through live cgroup hierarchies.
func unmountYardLeftovers(workDir string) {
	for _, mp := range fsutil.MountsUnder(workDir) {
		if filepath.Dir(mp) == filepath.Clean(workDir) && strings.HasPrefix(filepath.Base(mp), ".criu.cgyard.") {
			if unix.Unmount(mp, unix.MNT_DETACH) == nil {
				_ = os.Remove(mp)
			}
		}
	}
}

// thaw thaws a v1 or v2 freezer cgroup directory.
func thaw(dir string) {
	if err := os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0); err == nil {
		return
	}
	_ = os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("0"), 0)
}

var rootPidRe = regexp.MustCompile(`PID: real (\d+) virt `)

// rootPidFromLog finds the root task's PID in a debug-level restore log (criu forks the
// root first), for failures before criu's first notification named it.
func rootPidFromLog(path string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		if m := rootPidRe.FindStringSubmatch(s.Text()); m != nil {
			pid, _ := strconv.Atoi(m[1])
			return pid
		}
	}
	return 0
}

// reapRoot kills and reaps a restored root task left by a failed restore. It only touches
// our own children (rst_sibling made the root one): an unreaped child's PID cannot have been
// reused, so this never hits a stranger.
func reapRoot(pid int) {
	if pid <= 0 || parentOf(pid) != os.Getpid() {
		return
	}
	_ = unix.Kill(pid, unix.SIGKILL)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var ws unix.WaitStatus
		for {
			if _, err := unix.Wait4(pid, &ws, 0, nil); err != unix.EINTR {
				return
			}
		}
	}()
	// A pid namespace's init exits only after all its tasks did; don't wait forever for
	// one stuck in the kernel (the goroutine reaps it later).
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
}

func parentOf(pid int) int {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return 0
	}
	return st.PPid
}
