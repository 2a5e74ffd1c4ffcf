package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/checkpoint-restore/go-criu/v8/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// KdatHelperArg is the hidden first argument with which a binary re-executes itself to
// start criu inside a new mount namespace where the probe cache directory is bound over
// /run. Doing this in a fresh process, not on a thread of the caller, keeps every thread of
// a long-lived caller (daemon, tests) in the host's mount namespace.
const KdatHelperArg = "__lazyfork_criu_kdat"

var helperReady bool

// MaybeKdatHelper must be called first thing in main (and TestMain) of every binary that
// runs criu: in the helper it never returns; otherwise it enables the helper. The helper
// optionally joins cgroups (cgroup.procs files, ':'-separated) and enters the probe-cache
// mount namespace, then execs criu.
func MaybeKdatHelper() {
	if len(os.Args) < 5 || os.Args[1] != KdatHelperArg {
		helperReady = true
		return
	}
	runtime.LockOSThread()
	dir, procs, criu := os.Args[2], os.Args[3], os.Args[4]
	if procs != "" {
		for _, f := range strings.Split(procs, ":") {
			if err := os.WriteFile(f, []byte("0"), 0); err != nil {
				fmt.Fprintf(os.Stderr, "lazyfork: join cgroup %s: %v\n", f, err)
				os.Exit(127)
			}
		}
	}
	if dir == slaveNSArg {
		// A criu service of its own mount namespace (see Service): mounts made after it
		// started still reach it; what it unmounts stays mounted for everyone else.
		if err := enterSlaveNS(); err != nil {
			fmt.Fprintf(os.Stderr, "lazyfork: criu service namespace: %v\n", err)
			os.Exit(127)
		}
	} else if dir != "" {
		if err := enterKdatNS(dir); err != nil {
			// Only an optimisation: criu still works, it just probes the kernel again.
			fmt.Fprintf(os.Stderr, "lazyfork: criu probe cache unavailable: %v\n", err)
		}
	}
	err := unix.Exec(criu, os.Args[4:], os.Environ())
	fmt.Fprintf(os.Stderr, "lazyfork: exec %s: %v\n", criu, err)
	os.Exit(127)
}

// start starts cmd from the calling thread, which is locked and is thrown away once criu
// is reaped (never unlocked: it may have changed namespaces). When kdatDir is usable, criu
// is born in a mount namespace of its own where the cache directory is bound over /run:
// with no cgroups to join, this thread enters that namespace itself (a re-exec of a Go
// binary, as the helper, cost ~9 ms of CPU per dump); to join cgroups (joinProcs, whole
// processes) it goes through the helper, which joins them and the namespace, then execs
// criu. It reports whether the cache namespace was used.
func start(cmd *exec.Cmd, kdatDir string, joinProcs []string) (bool, error) {
	dir := ""
	if kdatDir != "" {
		if d, err := kdatCacheDir(kdatDir, cmd.Path); err == nil {
			dir = d
		}
	}
	if len(joinProcs) == 0 {
		if dir != "" && enterKdatNS(dir) != nil {
			// Only an optimisation: criu still works, it just probes the kernel again
			// (a half-made namespace goes with this thread).
			dir = ""
		}
		return dir != "", cmd.Start()
	}
	if !helperReady {
		return false, cmd.Start()
	}
	self, err := os.Executable()
	if err != nil {
		return false, cmd.Start()
	}
	cmd.Args = append([]string{self, KdatHelperArg, dir, strings.Join(joinProcs, ":"), cmd.Path}, cmd.Args[1:]...)
	cmd.Path = self
	return dir != "", cmd.Start()
}

// slaveNSArg, in place of the cache directory, asks the helper for a mount namespace of
// criu's own that is a slave of the caller's (enterSlaveNS).
const slaveNSArg = "+slave-ns"

// enterSlaveNS moves the calling (locked) thread into a new mount namespace whose mounts
// are slaves of the host's.
func enterSlaveNS() error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make mounts slaves: %w", err)
	}
	return nil
}

// enterKdatNS moves the calling (locked) thread into a new mount namespace whose mounts are
// slaves of the host's, so that nothing mounted in it (our /run bind, criu's cgroup yard or
// mount-namespace roots) propagates back, and bind-mounts dir over /run. Unsharing the
// mount namespace gives the thread a file-system context (root, cwd) of its own too.
func enterKdatNS(dir string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make mounts slaves: %w", err)
	}
	if err := unix.Mount(dir, "/run", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s over /run: %w", dir, err)
	}
	return nil
}

// kdatCacheDir returns the cache directory for the criu binary at bin: one per binary
// (size and mtime), because criu validates a cache only by its size and magic numbers. It
// fails when the cache cannot help or cannot be trusted: /run is already a tmpfs (criu caches
// there by itself) or base is not on a tmpfs (a cache must not outlive a reboot).
func kdatCacheDir(base, bin string) (string, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs("/run", &fs); err == nil && fs.Type == unix.TMPFS_MAGIC {
		return "", errors.New("/run is a tmpfs already")
	}
	var st unix.Stat_t
	if err := unix.Stat(bin, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", bin, err)
	}
	dir := filepath.Join(base, fmt.Sprintf("kdat-%d-%d", st.Size, st.Mtim.Nano()))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("create kdat cache dir: %w", err)
	}
	if err := unix.Statfs(dir, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		return "", fmt.Errorf("kdat cache dir %s is not on a tmpfs", dir)
	}
	removeStaleKdatTmp(dir)
	return dir, nil
}

// removeStaleKdatTmp removes a temporary cache file left by a criu killed while saving it:
// criu creates it O_EXCL, so while it exists no criu would ever save the cache.
func removeStaleKdatTmp(dir string) {
	if _, err := os.Stat(filepath.Join(dir, kdatCacheName)); err == nil {
		return
	}
	for _, name := range []string{"criu.kdat.tmp", ".criu.kdat"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && time.Since(fi.ModTime()) > time.Minute {
			_ = os.Remove(p)
		}
	}
}

// sharesMountNS reports whether pid is in the caller's mount namespace. Such a tree must
// not be dumped by a criu in another mount namespace: criu would take the caller's
// namespace for the tree's own.
func sharesMountNS(pid int) bool {
	var a, b unix.Stat_t
	if unix.Stat(fmt.Sprintf("/proc/%d/ns/mnt", pid), &a) != nil || unix.Stat("/proc/self/ns/mnt", &b) != nil {
		return true // unknown: take the safe path
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// checkpointHasMountNS reports whether the checkpoint holds a mount namespace (criu writes
// mountpoints-<id>.img only then). Without one the restored tree would live in criu's own
// mount namespace, which must then be the caller's.
func checkpointHasMountNS(checkpointDir string) bool {
	return checkpointHas(checkpointDir, "mountpoints-*.img")
}

// CheckpointHasNetNS reports whether the checkpoint holds a network namespace of its own
// (criu writes netns-<id>.img only then, empty or not). Without one the restored tree
// lives in criu's network namespace, or in the one it is told to join.
func CheckpointHasNetNS(checkpointDir string) bool {
	return checkpointHas(checkpointDir, "netns-*.img")
}

// CheckpointHasTCP reports whether the checkpoint holds a TCP connection (CRIU writes a
// tcp-stream image for each).
func CheckpointHasTCP(checkpointDir string) bool {
	return checkpointHas(checkpointDir, "tcp-stream-*.img")
}

func checkpointHas(checkpointDir, pattern string) bool {
	names, err := os.ReadDir(checkpointDir)
	if err != nil {
		return false
	}
	for _, n := range names {
		if m, _ := filepath.Match(pattern, n.Name()); m {
			return true
		}
	}
	return false
}

// kdatCacheName is the file name criu keeps its probe cache under (in /run, or in
// $XDG_RUNTIME_DIR for unprivileged requests).
const kdatCacheName = "criu.kdat"

// primeKdat returns the probe cache of the criu binary bin, saved by a privileged criu; when
// there is none yet it has criu probe the kernel once (a feature check) to make it.
func primeKdat(ctx context.Context, kdatDir, bin string) (string, error) {
	dir, err := kdatCacheDir(kdatDir, bin)
	if err != nil {
		var fs unix.Statfs_t
		if unix.Statfs("/run", &fs) != nil || fs.Type != unix.TMPFS_MAGIC {
			return "", err
		}
		dir = "/run" // criu keeps its own cache there
	}
	cache := filepath.Join(dir, kdatCacheName)
	if _, err := os.Stat(cache); err == nil {
		return cache, nil
	}
	t := rpc.CriuReqType_FEATURE_CHECK
	req := &rpc.CriuReq{Type: &t, Features: &rpc.CriuFeatures{MemTrack: proto.Bool(false)}}
	ctx, cancel := withDeadline(ctx, time.Minute)
	defer cancel()
	if _, err := swrk(ctx, bin, req, kdatDir, nil, nil, nil, nil); err != nil {
		return "", fmt.Errorf("probe the kernel: %w", err)
	}
	if _, err := os.Stat(cache); err != nil {
		return "", fmt.Errorf("criu saved no probe cache: %w", err)
	}
	return cache, nil
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o600)
}
