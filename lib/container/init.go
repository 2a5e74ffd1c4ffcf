package container

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/confine"
	"github.com/lazyfork/lazyfork/lib/confine/filters"
)

// InitArg is the hidden first argument with which the lazyfork binary re-executes itself
// as a container's set-up helper. The helper prepares mounts inside the new namespaces
// and then execs the user's command, so no Go runtime stays in the container (as runc
// init does, without C).
const InitArg = "__lazyfork_init"

// initConfig is what the parent sends the helper on fd 3 once the helper's cgroups are
// in place.
type initConfig struct {
	RootFS     string          `json:"rootfs"`
	Hostname   string          `json:"hostname"`
	Args       []string        `json:"args"`
	Env        []string        `json:"env"`
	WorkingDir string          `json:"working_dir"`
	MemDir     string          `json:"mem_dir"`
	Confine    confine.Profile `json:"confine"`
	OwnNet     bool            `json:"own_net"`  // a new network namespace: bring loopback up
	JoinNet    bool            `json:"join_net"` // join the network namespace open on fd 5
}

// Paths inside every container.
const (
	MemMount      = "/.lazyfork/mem"
	OvercommitDir = "/.lazyfork"
	OutputLog     = "/var/log/lazyfork/output.log"
	// emptyDir is bound read-only over masked /proc directories: a directory of the root
	// file system, not a tmpfs, which CRIU would archive into every checkpoint.
	emptyDir = "/.lazyfork/empty"
)

// MaskedPaths are hidden from a confined container as runc does: files under /dev/null,
// directories under an empty read-only directory. Paths the kernel lacks are skipped.
// No sysfs is mounted in a container, so runc's /sys entries have nothing to hide.
var MaskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
}

// ReadonlyPaths are bound read-only onto themselves in a confined container, as runc does.
var ReadonlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

// MaybeInit runs the container set-up helper and never returns if this process was
// started as one. Call it first thing in main (and TestMain).
func MaybeInit() {
	if len(os.Args) < 2 || os.Args[1] != InitArg {
		return
	}
	errPipe := os.NewFile(4, "errpipe")
	if err := containerInit(); err != nil {
		fmt.Fprintf(errPipe, "%v", err)
		os.Exit(127)
	}
	os.Exit(0) // unreachable: containerInit execs
}

func containerInit() error {
	// Capabilities and no_new_privs are per thread: set them on the thread that execs.
	runtime.LockOSThread()
	unix.CloseOnExec(4)
	cfgFile := os.NewFile(3, "config")
	var cfg initConfig
	if err := json.NewDecoder(cfgFile).Decode(&cfg); err != nil {
		return fmt.Errorf("container init: read config: %w", err)
	}
	cfgFile.Close()

	if cfg.JoinNet {
		// A cluster member's leader's namespace, or a --net none container's own (made by
		// the caller), before anything of the user's runs.
		if err := unix.Setns(5, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("join the network namespace: %w", err)
		}
		unix.Close(5)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	// The family memory directory is the one host object the container sees: take it as
	// a detached read-only mount now, by its host path, and attach it after pivot_root.
	mem, err := cloneReadOnly(cfg.MemDir)
	if err != nil {
		return fmt.Errorf("bind %s: %w", MemMount, err)
	}
	defer unix.Close(mem)
	// Every path below is resolved after pivot_root, inside the container's root: an
	// image's symlink (/.lazyfork -> /host/dir, /proc -> /etc, ...) can at worst point
	// at another place of the container itself, never at the host.
	if err := pivot(cfg.RootFS); err != nil {
		return err
	}
	if err := setupMounts(mem, !cfg.Confine.Privileged); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	if cfg.OwnNet {
		if err := loopbackUp(); err != nil {
			return err
		}
	}
	wd := cfg.WorkingDir
	if wd == "" {
		wd = "/"
	}
	if err := os.Chdir(wd); err != nil {
		return fmt.Errorf("working directory %s does not exist in the image", wd)
	}
	for _, e := range cfg.Env {
		if k, v, ok := strings.Cut(e, "="); ok {
			os.Setenv(k, v)
		}
	}
	path, err := exec.LookPath(cfg.Args[0])
	if err != nil {
		return fmt.Errorf("command %q not found in the image", cfg.Args[0])
	}
	if err := redirectOutput(); err != nil {
		return err
	}
	// Leaked host fds would end up in every checkpoint; mark them all close-on-exec.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("close inherited fds: %w", err)
	}
	if err := filters.Apply(cfg.Confine); err != nil {
		return err
	}
	err = unix.Exec(path, cfg.Args, cfg.Env)
	return fmt.Errorf("exec %s: %w", cfg.Args[0], err)
}

// cloneReadOnly returns a detached copy of the mount at dir, read-only, nosuid and nodev
// (not noexec: forks map text pages and JIT code from the memory files).
func cloneReadOnly(dir string) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", dir, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mount_setattr %s: %w", dir, err)
	}
	return fd, nil
}

// setupMounts runs after pivot_root: "/" is the container's root.
func setupMounts(mem int, confined bool) error {
	// The runtime's own directories must be directories: an image's symlink or file in
	// their place is replaced (in the container's upper layer), as for /dev.
	for _, d := range []string{"/proc", "/dev", OvercommitDir, MemMount, emptyDir} {
		if err := ensureDir(d); err != nil {
			return fmt.Errorf("prepare %s: %w", d, err)
		}
		if d == "/tmp" {
			if err := unix.Chmod(d, 0o1777); err != nil {
				return fmt.Errorf("prepare /tmp: %w", err)
			}
		}
	}
	// These may stay links to directories of the image (/tmp -> /var/tmp); a link that
	// leads nowhere is replaced.
	if err := os.MkdirAll(filepath.Dir(filepath.Dir(OutputLog)), 0o755); err != nil {
		return fmt.Errorf("prepare %s: %w", filepath.Dir(OutputLog), err)
	}
	for _, d := range []string{filepath.Dir(OutputLog), "/tmp"} {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			continue
		}
		if err := ensureDir(d); err != nil {
			return fmt.Errorf("prepare %s: %w", d, err)
		}
		if d == "/tmp" {
			if err := unix.Chmod(d, 0o1777); err != nil {
				return fmt.Errorf("prepare /tmp: %w", err)
			}
		}
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if err := setupDev(); err != nil {
		return err
	}
	// glibc must see overcommit_memory=2 from its first trim on (see the spec's
	// Mechanism); the file lives inside the root so the bind survives dump/restore.
	oc := filepath.Join(OvercommitDir, "overcommit_memory")
	if err := writeNew(oc, "2\n", 0o444); err != nil {
		return fmt.Errorf("write overcommit file: %w", err)
	}
	if confined {
		if err := protectDev(); err != nil {
			return err
		}
		if err := protectProc(); err != nil {
			return err
		}
	}
	// A devpts of the container's own (newinstance): programs open pseudo-terminals
	// (terminals, expect, script, ssh) through /dev/ptmx, and see no host terminal.
	if err := unix.Mount("devpts", "/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	if err := os.Symlink("pts/ptmx", "/dev/ptmx"); err != nil {
		return fmt.Errorf("create /dev/ptmx: %w", err)
	}
	if err := bindReadOnly(oc, "/proc/sys/vm/overcommit_memory", 0); err != nil {
		return fmt.Errorf("bind overcommit_memory: %w", err)
	}
	if err := unix.MoveMount(mem, "", unix.AT_FDCWD, MemMount, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach %s: %w", MemMount, err)
	}
	return nil
}

// setupDev fills /dev. It is a plain directory of the root file system, not a tmpfs:
// CRIU would archive a tmpfs into every checkpoint and unpack it (tar, gzip) in every
// restore. Like a tmpfs it starts empty: the image's own nodes (console, ptmx) are hidden.
func setupDev() error {
	if err := clearDir("/dev"); err != nil {
		return fmt.Errorf("prepare /dev: %w", err)
	}
	// The device cgroup allows exactly these (cgroup.AllowedDevices).
	devs := []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}}
	for _, d := range devs {
		if err := unix.Mknod("/dev/"+d.name, unix.S_IFCHR|0o666, int(unix.Mkdev(d.major, d.minor))); err != nil {
			return fmt.Errorf("create /dev/%s: %w", d.name, err)
		}
		if err := unix.Fchmodat(unix.AT_FDCWD, "/dev/"+d.name, 0o666, 0); err != nil {
			return fmt.Errorf("create /dev/%s: %w", d.name, err)
		}
	}
	for _, l := range [][2]string{{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}} {
		_ = os.Symlink(l[0], "/dev/"+l[1])
	}
	if err := os.Mkdir("/dev/pts", 0o755); err != nil {
		return fmt.Errorf("create /dev/pts: %w", err)
	}
	// Everyone may create POSIX shared memory, as on a host's /dev/shm.
	if err := os.Mkdir("/dev/shm", 0o755); err != nil {
		return fmt.Errorf("create /dev/shm: %w", err)
	}
	if err := unix.Chmod("/dev/shm", 0o1777); err != nil {
		return fmt.Errorf("create /dev/shm: %w", err)
	}
	return nil
}

// protectDev gives /dev and /dev/shm runc's mount flags (/dev nosuid; /dev/shm nosuid,
// nodev, noexec) with binds onto themselves: they stay directories of the root file
// system, which CRIU restores without archiving anything.
func protectDev() error {
	for _, m := range []struct {
		dir   string
		flags uintptr
	}{{"/dev", unix.MS_NOSUID}, {"/dev/shm", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC}} {
		if err := unix.Mount(m.dir, m.dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s: %w", m.dir, err)
		}
		if err := unix.Mount("", m.dir, "", unix.MS_BIND|unix.MS_REMOUNT|m.flags, ""); err != nil {
			return fmt.Errorf("set the flags of %s: %w", m.dir, err)
		}
	}
	return nil
}

// protectProc masks and write-protects the parts of /proc that reach the host kernel, as
// runc's masked and read-only paths do.
func protectProc() error {
	const procFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	for _, p := range ReadonlyPaths {
		if err := bindReadOnly(p, p, procFlags); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("make %s read-only: %w", p, err)
		}
	}
	if err := unix.Chmod(emptyDir, 0o555); err != nil {
		return fmt.Errorf("prepare %s: %w", emptyDir, err)
	}
	for _, p := range MaskedPaths {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("mask %s: %w", p, err)
		}
		// Not nodev: /dev/null must stay readable there (reads give nothing).
		src, flags := "/dev/null", uintptr(unix.MS_NOSUID|unix.MS_NOEXEC)
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			src, flags = emptyDir, procFlags
		}
		if err := bindReadOnly(src, p, flags); err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	return nil
}

// ensureDir makes p a directory: anything else there (a symlink, a file) is removed.
func ensureDir(p string) error {
	var st unix.Stat_t
	err := unix.Lstat(p, &st)
	if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil
	}
	if err == nil {
		if err := os.Remove(p); err != nil {
			return err
		}
	} else if !errors.Is(err, unix.ENOENT) {
		return err
	}
	return os.Mkdir(p, 0o755)
}

// writeNew replaces p with a new regular file holding data, never following a symlink.
func writeNew(p, data string, mode uint32) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), p)
	_, err = f.WriteString(data)
	return errors.Join(err, f.Close())
}

func clearDir(dir string) error {
	names, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := os.RemoveAll(filepath.Join(dir, n.Name())); err != nil {
			return err
		}
	}
	return nil
}

// bindReadOnly binds src onto dst and makes the bind read-only, keeping extra flags
// (a remount of a bind resets the flags it is not given).
func bindReadOnly(src, dst string, extra uintptr) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	return unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|extra, "")
}

func pivot(root string) error {
	if err := os.Chdir(root); err != nil {
		return fmt.Errorf("enter root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return os.Chdir("/")
}

func redirectOutput() error {
	out, err := os.OpenFile(OutputLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return fmt.Errorf("open %s: %w", OutputLog, err)
	}
	null, err := os.Open("/dev/null")
	if err != nil {
		return fmt.Errorf("open /dev/null: %w", err)
	}
	for fd, f := range []*os.File{null, out, out} {
		if err := unix.Dup3(int(f.Fd()), fd, 0); err != nil {
			return fmt.Errorf("redirect fd %d: %w", fd, err)
		}
	}
	return nil
}

// loopbackUp brings up lo, the only interface of a new network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bring up loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("bring up loopback: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up loopback: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up loopback: %w", err)
	}
	return nil
}
