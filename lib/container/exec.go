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
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/confine/filters"
	"github.com/lazyfork/lazyfork/lib/guard"
	"github.com/lazyfork/lazyfork/lib/helper"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// MaxExecOutput bounds what Exec captures of each of stdout and stderr when the caller
// gives no writer (the --json output and the daemon's exec route): 16 MiB each. A command
// that writes more is killed and Exec returns an error wrapping ErrExecOutputLimit.
const MaxExecOutput = 16 << 20

// ErrExecOutputLimit is wrapped by Exec's error when captured output went over the bound.
var ErrExecOutputLimit = errors.New("exec output over the bound")

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

func sizeText(n int) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
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

// Exec runs a command in the container's namespaces, root and cgroup: it starts
// r.Helper (lazyfork-helper, see lib/helper's ExecArg) inside the container's pid
// namespace, and the helper becomes the command.
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
	helperPath, err := r.helper()
	if err != nil {
		return nil, fail(err)
	}
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
	cmd := exec.CommandContext(runCtx, helperPath, helper.ExecArg)
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
	cfg := helper.ExecConfig{Pid: c.Pid, Args: o.Args, Env: mergeEnv(c.Env, o.Env), Cwd: o.Cwd, Confine: c.ConfineProfile(),
		JoinTasks: cg.ThreadJoinFiles()}
	if cfg.Cwd == "" {
		cfg.Cwd = c.WorkingDir
	}
	if err := cfg.Confine.Validate(); err != nil {
		return nil, fail(err)
	}
	if cfg.Filters, err = filters.For(cfg.Confine); err != nil {
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
