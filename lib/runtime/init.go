package runtime

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// InitArg is the hidden first argument with which the lazyfork binary re-executes itself
// as a container's set-up helper. The helper prepares mounts inside the new namespaces
// and then execs the user's command, so no Go runtime stays in the container (as runc
// init does, without C).
const InitArg = "__lazyfork_init"

// initConfig is what the parent sends the helper on fd 3 once the helper's cgroups are
// in place.
type initConfig struct {
	RootFS     string   `json:"rootfs"`
	Hostname   string   `json:"hostname"`
	Args       []string `json:"args"`
	Env        []string `json:"env"`
	WorkingDir string   `json:"working_dir"`
	MemDir     string   `json:"mem_dir"`
}

// Paths inside every container.
const (
	MemMount      = "/.lazyfork/mem"
	OvercommitDir = "/.lazyfork"
	OutputLog     = "/var/log/lazyfork/output.log"
)

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
	unix.CloseOnExec(4)
	cfgFile := os.NewFile(3, "config")
	var cfg initConfig
	if err := json.NewDecoder(cfgFile).Decode(&cfg); err != nil {
		return fmt.Errorf("container init: read config: %w", err)
	}
	cfgFile.Close()

	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	root := cfg.RootFS
	if err := setupMounts(root, cfg.MemDir); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	if err := pivot(root); err != nil {
		return err
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
	err = unix.Exec(path, cfg.Args, cfg.Env)
	return fmt.Errorf("exec %s: %w", cfg.Args[0], err)
}

func setupMounts(root, memDir string) error {
	j := func(p string) string { return filepath.Join(root, p) }
	// An image's /dev symlink would point the device nodes below at the host's tree.
	if fi, err := os.Lstat(j("dev")); err == nil && !fi.IsDir() {
		if err := os.Remove(j("dev")); err != nil {
			return fmt.Errorf("replace the image's /dev: %w", err)
		}
	}
	for _, d := range []string{"proc", "dev", OvercommitDir, MemMount, filepath.Dir(OutputLog), "tmp"} {
		if err := os.MkdirAll(j(d), 0o755); err != nil {
			return fmt.Errorf("prepare %s: %w", d, err)
		}
	}
	if err := unix.Mount("proc", j("proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	// /dev is a plain directory of the root file system, not a tmpfs: CRIU would archive a
	// tmpfs into every checkpoint and unpack it (tar, gzip) in every restore. Like a tmpfs
	// it starts empty: the image's own nodes (console, ptmx) are hidden.
	if err := clearDir(j("dev")); err != nil {
		return fmt.Errorf("prepare /dev: %w", err)
	}
	devs := []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}}
	for _, d := range devs {
		if err := unix.Mknod(j("dev/"+d.name), unix.S_IFCHR|0o666, int(unix.Mkdev(d.major, d.minor))); err != nil {
			return fmt.Errorf("create /dev/%s: %w", d.name, err)
		}
		_ = os.Chmod(j("dev/"+d.name), 0o666)
	}
	for _, l := range [][2]string{{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}} {
		_ = os.Symlink(l[0], j("dev/"+l[1]))
	}
	if err := os.Mkdir(j("dev/pts"), 0o755); err != nil {
		return fmt.Errorf("create /dev/pts: %w", err)
	}
	// Everyone may create POSIX shared memory, as on a host's /dev/shm.
	if err := os.Mkdir(j("dev/shm"), 0o755); err != nil {
		return fmt.Errorf("create /dev/shm: %w", err)
	}
	if err := unix.Chmod(j("dev/shm"), 0o1777); err != nil {
		return fmt.Errorf("create /dev/shm: %w", err)
	}
	// glibc must see overcommit_memory=2 from its first trim on (see the spec's
	// Mechanism); the file lives inside the root so the bind survives dump/restore.
	oc := j(filepath.Join(OvercommitDir, "overcommit_memory"))
	if err := os.WriteFile(oc, []byte("2\n"), 0o444); err != nil {
		return fmt.Errorf("write overcommit file: %w", err)
	}
	if err := bindReadOnly(oc, j("proc/sys/vm/overcommit_memory")); err != nil {
		return fmt.Errorf("bind overcommit_memory: %w", err)
	}
	if err := bindReadOnly(memDir, j(MemMount)); err != nil {
		return fmt.Errorf("bind %s: %w", MemMount, err)
	}
	return nil
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

func bindReadOnly(src, dst string) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, "")
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
	out, err := os.OpenFile(OutputLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
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
