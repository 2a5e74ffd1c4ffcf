package helper

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/confine"
)

// ExecArg is the hidden first argument with which lazyfork-helper becomes a command inside
// a container. The caller (lib/container's Exec) starts it with an empty environment (the
// container's never reaches a host binary) from a thread that has joined the pid namespace
// of the container's init (through a pidfd), so the helper is born inside that namespace;
// it is in the container's cgroup before it reads its config. The helper then joins the
// init's other namespaces through the same pidfd, takes the container's root, resolves the
// command with the container's PATH inside that root, confines itself as the container's
// processes are (lib/confine), and execve's the command with the container's environment.
// Nothing of the image runs before the command itself, and that runs inside, confined.
const ExecArg = "__lazyfork_exec"

// The exec helper's descriptors, in the order of the parent's ExtraFiles.
const (
	ExecFdPidfd  = 3 // a pidfd of the container's init
	ExecFdConfig = 4 // ExecConfig, JSON, read once
	ExecFdErr    = 5 // closed by the execve, or one line saying why it failed
)

// ExecConfig is what the parent sends the exec helper on ExecFdConfig, once the helper
// is in the container's cgroup.
type ExecConfig struct {
	Pid  int      `json:"pid"`
	Args []string `json:"args"`
	Env  []string `json:"env"` // for the final execve only
	Cwd  string   `json:"cwd"` // inside the container; "" = /
	// Confine is the container's confinement (its record's), applied to the command.
	Confine confine.Profile `json:"confine"`
	// JoinTasks are the container's v1 `tasks` files: the helper's thread moves itself in
	// first thing (JoinThread), cheaper than the parent moving it; empty when the parent
	// moved it (v2).
	JoinTasks []string `json:"join_tasks,omitempty"`
	// Filters are Confine's seccomp programs, compiled by the parent (once per daemon,
	// confine.Profile.Filters) rather than by every helper.
	Filters [][]unix.SockFilter `json:"filters,omitempty"`
}

// execMain enters the container and execs the command; it exits with 126 and the reason
// on ExecFdErr if it cannot.
func execMain() {
	err := execHelper()
	errPipe := os.NewFile(ExecFdErr, "errpipe")
	fmt.Fprint(errPipe, strings.Join(strings.Fields(err.Error()), " "))
	os.Exit(126)
}

// execHelper enters the container and execs the command; it returns only on failure.
func execHelper() error {
	for fd := ExecFdPidfd; fd <= ExecFdErr; fd++ {
		unix.CloseOnExec(fd)
	}
	// Until the execve, this process runs as host root inside the container's pid
	// namespace: not dumpable, so no process in the container may ptrace it or open its
	// /proc files.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("set not dumpable: %w", err)
	}
	cf := os.NewFile(ExecFdConfig, "config")
	var cfg ExecConfig
	err := json.NewDecoder(io.LimitReader(cf, 4<<20)).Decode(&cfg)
	cf.Close()
	if err != nil {
		return fmt.Errorf("read exec config: %w", err)
	}
	if len(cfg.Args) == 0 || cfg.Pid <= 0 {
		return errors.New("exec config without a command or a pid")
	}
	// This thread execs the command: in the container's cgroup before anything else.
	if err := JoinThread(cfg.JoinTasks); err != nil {
		return err
	}
	pidfd := ExecFdPidfd

	// /proc is still the host's here (only the pid namespace is the container's).
	flags, err := nsFlags(cfg.Pid)
	if err != nil {
		return err
	}
	// The container's root as its init sees it (as nsenter -r does).
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", cfg.Pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the container's root: %w", err)
	}
	// The pid read above is still the pidfd's process (a live process keeps its pid), so
	// the root and namespaces are the container's, not a process that reused its pid.
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		return fmt.Errorf("the container's init is gone: %w", err)
	}
	// setns into a mount namespace needs a private fs struct (Go threads share one).
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare fs: %w", err)
	}
	if flags != 0 {
		if err := unix.Setns(pidfd, flags); err != nil {
			return fmt.Errorf("enter the container's namespaces: %w", err)
		}
	}
	if err := unix.Fchdir(root); err != nil {
		return fmt.Errorf("enter the container's root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("enter the container's root: %w", err)
	}
	unix.Close(root)
	cwd := cfg.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if err := unix.Chdir(cwd); err != nil {
		return fmt.Errorf("working directory %s in the container: %w", cwd, err)
	}
	path, err := lookPathIn(cfg.Args[0], envValue(cfg.Env, "PATH"))
	if err != nil {
		return err
	}
	// Confined as the container's own processes are (capabilities, no_new_privs,
	// seccomp, user), right before the command starts: it inherits that through execve.
	if err := cfg.Confine.ApplyFilters(cfg.Filters); err != nil {
		return fmt.Errorf("confine the command: %w", err)
	}
	err = unix.Exec(path, cfg.Args, cfg.Env)
	return fmt.Errorf("exec %s in the container: %w", cfg.Args[0], err)
}

// JoinThread moves the calling thread into the groups whose v1 `tasks` files are given
// (lib/cgroup's ThreadJoinFiles); the caller has locked its goroutine to the thread. A
// thread moving itself is the one migration the kernel makes without its global
// threadgroup lock, whose write side waits for an RCU grace period.
func JoinThread(files []string) error {
	for _, f := range files {
		if filepath.Base(f) != "tasks" {
			return fmt.Errorf("join cgroup: %s is not a tasks file", f)
		}
		if err := os.WriteFile(f, []byte("0"), 0); err != nil {
			return fmt.Errorf("join cgroup %s: %w", filepath.Dir(f), err)
		}
	}
	return nil
}

// nsFlags lists the namespaces of pid that differ from this process's, as setns flags
// (the pid namespace is joined by whoever starts the helper).
func nsFlags(pid int) (int, error) {
	var flags int
	for _, ns := range []struct {
		name string
		flag int
	}{{"mnt", unix.CLONE_NEWNS}, {"uts", unix.CLONE_NEWUTS}, {"ipc", unix.CLONE_NEWIPC},
		{"net", unix.CLONE_NEWNET}, {"cgroup", unix.CLONE_NEWCGROUP}, {"user", unix.CLONE_NEWUSER}} {
		var theirs, ours unix.Stat_t
		if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, ns.name), &theirs); err != nil {
			return 0, fmt.Errorf("read the container's %s namespace: %w", ns.name, err)
		}
		if err := unix.Stat("/proc/self/ns/"+ns.name, &ours); err != nil {
			return 0, fmt.Errorf("read own %s namespace: %w", ns.name, err)
		}
		if theirs.Ino == ours.Ino && theirs.Dev == ours.Dev {
			continue
		}
		if ns.flag == unix.CLONE_NEWUSER {
			// Joining a user namespace needs a single-threaded caller, which a Go
			// process is not.
			return 0, errors.New("exec into a container with its own user namespace is not supported")
		}
		flags |= ns.flag
	}
	if flags&unix.CLONE_NEWNS == 0 {
		return 0, errors.New("the process shares the host's mount namespace: not a container's init")
	}
	return flags, nil
}

// lookPathIn resolves a command as execvp would with the container's PATH, in the
// current root (the container's): never with the host's PATH or files.
func lookPathIn(name, pathEnv string) (string, error) {
	if name == "" {
		return "", errors.New("empty command name")
	}
	if strings.Contains(name, "/") {
		if err := isExecutable(name); err != nil {
			return "", fmt.Errorf("command %s in the container: %w", name, err)
		}
		return name, nil
	}
	if pathEnv == "" {
		pathEnv = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if isExecutable(p) == nil {
			if !filepath.IsAbs(p) {
				p = "./" + p
			}
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q not found in the container (PATH=%s)", name, pathEnv)
}

func isExecutable(p string) error {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return errors.New("not a regular file")
	}
	if st.Mode&0o111 == 0 {
		return errors.New("not executable")
	}
	return nil
}

// envValue is the value of key in env (KEY=VALUE entries; the last one wins).
func envValue(env []string, key string) string {
	v := ""
	for _, e := range env {
		if k, val, ok := strings.Cut(e, "="); ok && k == key {
			v = val
		}
	}
	return v
}
