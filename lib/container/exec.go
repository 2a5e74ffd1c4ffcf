package container

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/confine"
	"github.com/lazyfork/lazyfork/lib/guard"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// ExecHelperArg is the hidden first argument with which the lazyfork binary re-executes
// itself to become a command inside a container. The caller starts it with an empty
// environment (the container's never reaches a host binary) from a thread that has
// joined the pid namespace of the container's init (through a pidfd), so the helper is
// born inside that namespace; it is put into the container's cgroup before it reads its
// config. The helper then joins the init's other namespaces through the same pidfd, takes
// the container's root, resolves the command with the container's PATH inside that root,
// confines itself as the container's processes are (lib/confine), and execve's the
// command with the container's environment. Nothing of the image runs before the command
// itself, and that runs inside, confined.
const ExecHelperArg = "__lazyfork_exec"

// MaxExecOutput bounds what Exec captures of each of stdout and stderr when the caller
// gives no writer (the --json output and the daemon's exec route): 16 MiB each. A command
// that writes more is killed and Exec returns an error wrapping ErrExecOutputLimit.
const MaxExecOutput = 16 << 20

// ErrExecOutputLimit is wrapped by Exec's error when captured output went over the bound.
var ErrExecOutputLimit = errors.New("exec output over the bound")

// The exec helper's descriptors, in the order of the parent's ExtraFiles.
const (
	execFdPidfd  = 3
	execFdConfig = 4
	execFdErr    = 5
)

// execConfig is what the parent sends the exec helper on execFdConfig, once the helper
// is in the container's cgroup.
type execConfig struct {
	Pid  int      `json:"pid"`
	Args []string `json:"args"`
	Env  []string `json:"env"` // for the final execve only
	Cwd  string   `json:"cwd"` // inside the container; "" = /
	// Confine is the container's confinement (its record's), applied to the command.
	Confine confine.Profile `json:"confine"`
	// JoinTasks are the container's v1 `tasks` files: the helper's thread moves itself in
	// first thing (cgroup.JoinThread), cheaper than the parent moving it; empty when the
	// parent moved it (v2).
	JoinTasks []string `json:"join_tasks,omitempty"`
	// Filters are Confine's seccomp programs, compiled by the parent (once per daemon,
	// confine.Profile.Filters) rather than by every helper.
	Filters [][]unix.SockFilter `json:"filters,omitempty"`
}

// MaybeCgexec runs the exec helper and never returns if this process was started as one.
// Call it first thing in main (and TestMain). (The name is historical: the helper used to
// only join the cgroup and run nsenter.)
func MaybeCgexec() {
	if len(os.Args) < 2 || os.Args[1] != ExecHelperArg {
		return
	}
	// Namespaces, root and capabilities are per thread: all of it, and the execve, on
	// this one.
	runtime.LockOSThread()
	err := execHelper()
	errPipe := os.NewFile(execFdErr, "errpipe")
	fmt.Fprint(errPipe, oneLineErr(err))
	os.Exit(126)
}

func oneLineErr(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// execHelper enters the container and execs the command; it returns only on failure.
func execHelper() error {
	for fd := execFdPidfd; fd <= execFdErr; fd++ {
		unix.CloseOnExec(fd)
	}
	// Until the execve, this process runs as host root inside the container's pid
	// namespace: not dumpable, so no process in the container may ptrace it or open its
	// /proc files.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("set not dumpable: %w", err)
	}
	cf := os.NewFile(execFdConfig, "config")
	var cfg execConfig
	err := json.NewDecoder(io.LimitReader(cf, 4<<20)).Decode(&cfg)
	cf.Close()
	if err != nil {
		return fmt.Errorf("read exec config: %w", err)
	}
	if len(cfg.Args) == 0 || cfg.Pid <= 0 {
		return errors.New("exec config without a command or a pid")
	}
	// This thread execs the command: in the container's cgroup before anything else.
	if err := cgroup.JoinThread(cfg.JoinTasks); err != nil {
		return err
	}
	pidfd := execFdPidfd

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
	if err := confineExec(&cfg); err != nil {
		return err
	}
	err = unix.Exec(path, cfg.Args, cfg.Env)
	return fmt.Errorf("exec %s in the container: %w", cfg.Args[0], err)
}

// onTerminal reports whether any of the streams is a terminal.
func onTerminal(streams ...any) bool {
	for _, s := range streams {
		if f, ok := s.(*os.File); ok && f != nil {
			if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err == nil {
				return true
			}
		}
	}
	return false
}

// confineExec confines the calling thread as the container's own processes are (the
// profile in its record: capabilities, no_new_privs, seccomp, user), right before the
// command starts: the command inherits it through fork and execve. The one place exec'd
// processes get their confinement.
func confineExec(cfg *execConfig) error {
	if err := cfg.Confine.ApplyFilters(cfg.Filters); err != nil {
		return fmt.Errorf("confine the command: %w", err)
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

func sizeText(n int) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
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

// startInPidNS starts cmd from a thread that has joined the pid namespace of pidfd's
// process, so cmd is born inside it. The thread is never given back to the Go scheduler:
// it ends with its goroutine.
func startInPidNS(cmd *exec.Cmd, pidfd int) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // no Unlock: the thread's namespace stays changed
		if err := unix.Setns(pidfd, unix.CLONE_NEWPID); err != nil {
			done <- fmt.Errorf("enter the container's pid namespace: %w", err)
			return
		}
		if err := cmd.Start(); err != nil {
			done <- fmt.Errorf("start the exec helper: %w", err)
			return
		}
		done <- nil
	}()
	return <-done
}

// boundedBuffer keeps the first max bytes written to it and calls over once when more
// arrive; it never fails a write, so the command is not told (it is killed instead).
type boundedBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	max  int
	over bool
	hit  func()
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); len(p) > room {
		b.buf.Write(p[:max(0, room)])
		if !b.over {
			b.over = true
			b.hit()
		}
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *boundedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *boundedBuffer) exceeded() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.over
}

// Exec runs a command in the container's namespaces, root and cgroup (see ExecHelperArg).
// The container is targeted by a pidfd of its init, checked against the start time in
// its record, so a pid reused by another process is never entered.
func (r *Runtime) Exec(ctx context.Context, c *store.Container, o ExecOptions) (_ *ExecResult, retErr error) {
	if len(o.Args) == 0 || o.Args[0] == "" {
		return nil, errors.New("exec: no command given: add `-- COMMAND [ARGS...]`")
	}
	ctx, end := trace.Start(ctx, "exec "+c.Display())
	defer end()
	endCheck := trace.Step(ctx, "check its state")
	err := r.check(guard.OpExec, c)
	endCheck()
	if err != nil {
		return nil, err
	}
	if o.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	fail := func(err error) error { return fmt.Errorf("exec in %s: %w", c.Display(), err) }

	endPrep := trace.Step(ctx, "open its init, load its cgroup, pipes")
	defer func() { endPrep() }()
	pidfd, err := unix.PidfdOpen(c.Pid, 0)
	if err != nil {
		return nil, fail(fmt.Errorf("open its init (pid %d): %w", c.Pid, err))
	}
	pidf := os.NewFile(uintptr(pidfd), "pidfd")
	defer pidf.Close()
	if !Alive(c) { // the pidfd may name a process that reused the pid
		return nil, fail(fmt.Errorf("its init (pid %d) has exited", c.Pid))
	}
	cg, err := Cgroup(c)
	if err != nil {
		return nil, fail(err)
	}

	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return nil, fail(err)
	}
	defer cfgR.Close()
	defer cfgW.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		return nil, fail(err)
	}
	defer errR.Close()
	defer errW.Close()

	runCtx, kill := context.WithCancel(ctx)
	defer kill()
	exe := r.Exe
	if exe == "" {
		exe = "/proc/self/exe"
	}
	cmd := exec.CommandContext(runCtx, exe, ExecHelperArg)
	cmd.Env = []string{} // never the container's, never the caller's
	cmd.ExtraFiles = []*os.File{pidf, cfgR, errW}
	cmd.Stdin = o.Stdin
	limit := o.MaxOutput
	if limit <= 0 {
		limit = MaxExecOutput
	}
	stdout := &boundedBuffer{max: limit, hit: kill}
	stderr := &boundedBuffer{max: limit, hit: kill}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if o.Stdout != nil {
		cmd.Stdout = o.Stdout
	}
	if o.Stderr != nil {
		cmd.Stderr = o.Stderr
	}
	// Off a terminal, the command leads its own process group, so that ending it (a
	// timeout, the output bound, the caller gone) ends what it started too. On a terminal
	// it must stay in the foreground group, or reading the terminal would stop it.
	group := !onTerminal(cmd.Stdin, cmd.Stdout, cmd.Stderr)
	// No Pdeathsig: the helper's parent is outside its pid namespace, so Go's child code
	// would see getppid() == 0 and take the parent for dead.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: group}
	cmd.Cancel = func() error {
		if group {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		return cmd.Process.Kill()
	}
	cmd.WaitDelay = 2 * time.Second
	// What the helper needs, ready before it starts. On v1 the helper's thread that will
	// exec the command moves itself into the container's cgroup, first thing.
	cfg := execConfig{Pid: c.Pid, Args: o.Args, Env: mergeEnv(c.Env, o.Env), Cwd: o.Cwd, Confine: c.ConfineProfile(),
		JoinTasks: cg.ThreadJoinFiles()}
	if cfg.Cwd == "" {
		cfg.Cwd = c.WorkingDir
	}
	if err := cfg.Confine.Validate(); err != nil {
		return nil, fail(err)
	}
	if cfg.Filters, err = cfg.Confine.Filters(); err != nil {
		return nil, fail(err)
	}
	endPrep()
	endPrep = func() {}
	endStart := trace.Step(ctx, "start the exec helper in its pid namespace")
	err = startInPidNS(cmd, pidfd)
	endStart()
	if err != nil {
		return nil, fail(err)
	}
	cfgR.Close()
	errW.Close()
	abort := func(err error) (*ExecResult, error) {
		_ = cmd.Cancel()
		_ = cmd.Wait()
		if ctxErr := ctx.Err(); ctxErr != nil {
			// The deadline (or the caller) ended it: say so, not what the kill broke.
			return nil, fail(ctxErr)
		}
		return nil, fail(err)
	}
	// In the container's cgroup before it does anything: what it runs is accounted to
	// (and killed with) the container (on v1 it moves itself, see JoinTasks).
	if len(cfg.JoinTasks) == 0 {
		endJoin := trace.Step(ctx, "move the helper into its cgroup")
		err = cg.AddProc(cmd.Process.Pid)
		endJoin()
		if err != nil {
			return abort(err)
		}
	}
	if err := json.NewEncoder(cfgW).Encode(cfg); err != nil {
		return abort(fmt.Errorf("send exec config: %w", err))
	}
	cfgW.Close()
	// The error pipe closes when the helper execs the command, or carries why it could not.
	endEnter := trace.Step(ctx, "helper: enter the namespaces, confine, execve")
	msg, _ := io.ReadAll(io.LimitReader(errR, 64<<10))
	endEnter()
	if len(msg) > 0 {
		return abort(errors.New(string(msg)))
	}
	endRun := trace.Step(ctx, "the command runs")
	err = cmd.Wait()
	endRun()

	res := &ExecResult{Stdout: stdout.String(), Stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case stdout.exceeded() || stderr.exceeded():
		which := "stdout"
		if !stdout.exceeded() {
			which = "stderr"
		}
		return res, fail(fmt.Errorf("%w: the command wrote more than %s to %s and was killed; stream its output (lazyfork exec without --json) or write it to a file inside the container", ErrExecOutputLimit, sizeText(limit), which))
	case ctx.Err() != nil:
		return res, fail(ctx.Err())
	case errors.As(err, &exitErr):
		res.ExitCode = exitErr.ExitCode()
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.ExitCode = 128 + int(ws.Signal()) // as a shell reports it
		}
	case err != nil:
		return res, fail(err)
	}
	return res, nil
}
