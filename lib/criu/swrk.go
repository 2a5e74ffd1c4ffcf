package criu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/checkpoint-restore/go-criu/v8/rpc"
	"github.com/lazyfork/lazyfork/lib/trace"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// criuEnv is the environment of every criu child: ours, with CRIU_FAULT=130 (compel stops
// tasks with PTRACE_SYSCALL instead of a hardware breakpoint, which hangs criu in VMs
// without working debug registers).
func criuEnv() []string {
	env := make([]string, 0, len(os.Environ())+1)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "CRIU_FAULT=") {
			env = append(env, e)
		}
	}
	return append(env, "CRIU_FAULT=130")
}

// withDeadline applies timeout, or DefaultTimeout when ctx has no deadline either.
func withDeadline(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout > 0 {
		return context.WithTimeout(ctx, timeout)
	}
	if _, ok := ctx.Deadline(); !ok {
		return context.WithTimeout(ctx, DefaultTimeout)
	}
	return context.WithCancel(ctx)
}

// result is what one conversation with criu (swrk or a service worker) produced.
type result struct {
	resp    *rpc.CriuResp // final response; nil if criu never answered
	rootPid int           // root task PID from the last notification that carried one
	stderr  string        // criu's stdout+stderr, capped
	kdat    bool          // criu had the probe cache
	// isolated: criu ran in a private mount namespace, which takes whatever a killed criu
	// left mounted with it.
	isolated bool
}

// swrk starts `criu swrk 3` of binary (FindBinary's explicit path, "" = the default; with hold, if any, as fd 4), sends req, answers notifications and returns the final
// response. It returns an error when criu could not be run, failed (resp.success false), did
// not answer, or the deadline passed; criu is SIGKILLed on deadline or cancel and always
// reaped before swrk returns.
func swrk(ctx context.Context, binary string, req *rpc.CriuReq, kdatDir string, joinProcs []string, notify NotifyFunc, hold, pageServer *os.File, netns ...string) (res result, retErr error) {
	if err := ctx.Err(); err != nil {
		return res, err
	}
	bin, err := binaryPath(binary)
	if err != nil {
		return res, fmt.Errorf("find criu: %w", err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return res, fmt.Errorf("socketpair: %w", err)
	}
	client := os.NewFile(uintptr(fds[0]), "criu-client")
	server := os.NewFile(uintptr(fds[1]), "criu-server")
	defer server.Close()
	fc, err := net.FileConn(client)
	client.Close()
	if err != nil {
		return res, fmt.Errorf("criu socket: %w", err)
	}
	conn := fc.(*net.UnixConn)
	defer conn.Close()

	// A memfd, not a pipe: no copying goroutine, and nothing to hang on if a descendant of
	// criu kept the write end open.
	outFd, err := unix.MemfdCreate("criu-output", unix.MFD_CLOEXEC)
	if err != nil {
		return res, fmt.Errorf("memfd: %w", err)
	}
	out := os.NewFile(uintptr(outFd), "criu-output")
	defer out.Close()
	defer func() { res.stderr = readCapped(out, 4096) }()

	cmd := exec.Command(bin, "swrk", "3")
	cmd.ExtraFiles = []*os.File{server}
	if hold != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, hold) // fd 4, unused by criu
	}
	if pageServer != nil && req.Opts != nil {
		req.Opts.Ps = &rpc.CriuPageServerInfo{Fd: proto.Int32(int32(3 + len(cmd.ExtraFiles)))}
		cmd.ExtraFiles = append(cmd.ExtraFiles, pageServer)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = criuEnv()
	// criu leads a process group of its own, so that what it forks (namespace helpers, tar,
	// a half-restored tree) can be killed with it: killed alone, its children lived on as
	// orphan "criu swrk" processes. Pdeathsig ends criu if we die without cancelling (a
	// SIGKILLed lazyfork); it fires when the forking thread exits, so criu is started from
	// a thread that stays locked until criu is reaped.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	type started struct {
		kdat bool
		err  error
	}
	startedCh, reaped := make(chan started, 1), make(chan struct{})
	go func() {
		// criu is born in the namespaces this thread joins (a network namespace here, the
		// probe cache's mount namespace in start): the thread is thrown away once criu is
		// reaped (never unlocked).
		runtime.LockOSThread()
		if len(netns) > 0 && netns[0] != "" {
			if err := joinNetNS(netns[0]); err != nil {
				startedCh <- started{false, err}
				return
			}
		}
		kdat, err := start(cmd, kdatDir, joinProcs)
		startedCh <- started{kdat, err}
		if err == nil {
			<-reaped
		}
	}()
	endStart := trace.Step(ctx, "criu: start swrk")
	st := <-startedCh
	endStart()
	if st.err != nil {
		return res, fmt.Errorf("start criu: %w", st.err)
	}
	res.kdat = st.kdat
	res.isolated = res.kdat
	// Our copy of criu's end must go, so that a crashed criu reads as EOF, not a hang.
	server.Close()

	pid := cmd.Process.Pid
	var mu sync.Mutex
	exited := false
	// killGroup kills criu and whatever it forked that is still in its group; never once
	// criu is reaped (its pid, the group's id, could then be another's).
	killGroup := func() {
		mu.Lock()
		defer mu.Unlock()
		if !exited {
			_ = unix.Kill(-pid, unix.SIGKILL)
		}
	}
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-ctx.Done():
			killGroup()
			_ = conn.SetDeadline(time.Now())
		case <-stop:
		}
	}()
	defer func() {
		_ = conn.Close()
		// Wait for criu's exit without reaping it, kill what it left in its group (nothing
		// after a clean run), then reap.
		endExit := trace.Step(ctx, "criu: its exit")
		var si unix.Siginfo
		for unix.Waitid(unix.P_PID, pid, &si, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
		}
		endExit()
		killGroup()
		mu.Lock()
		exited = true
		mu.Unlock()
		waitErr := cmd.Wait()
		close(reaped)
		close(stop)
		<-watched
		// A criu killed at the deadline after it answered did its work: not an error.
		if retErr == nil && waitErr != nil && ctx.Err() == nil && res.resp.GetSuccess() {
			retErr = fmt.Errorf("criu exited after answering: %w", waitErr)
		}
	}()

	res.resp, res.rootPid, err = converse(ctx, conn, req, notify)
	if ctxErr := ctx.Err(); ctxErr != nil && !(err == nil && res.resp.GetSuccess()) {
		// Whatever converse saw (EOF, i/o timeout) is a consequence of the kill.
		return res, ctxErr
	}
	return res, err
}

// Threads started criu from a namespace they joined end with their goroutine; the main
// thread never ends (Go parks it, holding the namespace): locked to the main goroutine
// from init, it never runs one of them (lib/network does the same).
func init() { runtime.LockOSThread() }

// joinNetNS moves the calling (locked) thread into the network namespace at path.
func joinNetNS(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("join network namespace %s: %w", path, err)
	}
	return nil
}

// converse runs the request/notify/response exchange on conn.
func converse(ctx context.Context, conn *net.UnixConn, req *rpc.CriuReq, notify NotifyFunc) (*rpc.CriuResp, int, error) {
	defer trace.Step(ctx, "criu: request "+req.GetType().String()+" until the answer")()
	reqType := req.GetType()
	if err := send(conn, req); err != nil {
		return nil, 0, err
	}
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(16*4)+unix.CmsgSpace(unix.SizeofUcred))
	rootPid := 0
	var notifyErr error
	for {
		n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
		closeRights(oob[:oobn])
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, rootPid, errors.Join(errors.New("criu closed the connection without an answer"), notifyErr)
			}
			return nil, rootPid, fmt.Errorf("read from criu: %w", err)
		}
		if n == 0 {
			return nil, rootPid, errors.Join(errors.New("criu closed the connection without an answer"), notifyErr)
		}
		if flags&unix.MSG_TRUNC != 0 {
			return nil, rootPid, fmt.Errorf("criu message larger than %d bytes", len(buf))
		}
		resp := &rpc.CriuResp{}
		if err := resp.UnmarshalVT(buf[:n]); err != nil {
			return nil, rootPid, fmt.Errorf("decode criu message: %w", err)
		}
		if resp.GetType() != rpc.CriuReqType_NOTIFY {
			if resp.GetType() != reqType {
				return resp, rootPid, fmt.Errorf("criu answered %s to %s", resp.GetType(), reqType)
			}
			if !resp.GetSuccess() {
				return resp, rootPid, notifyErr
			}
			return resp, rootPid, nil
		}
		script, pid := resp.GetNotify().GetScript(), int(resp.GetNotify().GetPid())
		if pid > 0 {
			rootPid = pid
		}
		ok := true
		if notify != nil {
			endNotify := trace.Step(ctx, "criu notify: "+script)
			err := notify(script, pid)
			endNotify()
			if err != nil {
				notifyErr = fmt.Errorf("notify %s: %w", script, err)
				ok = false
			}
		}
		// A false answer makes criu fail the action cleanly (and roll back) instead of
		// seeing its socket vanish.
		t := rpc.CriuReqType_NOTIFY
		if err := send(conn, &rpc.CriuReq{Type: &t, NotifySuccess: proto.Bool(ok)}); err != nil {
			return nil, rootPid, errors.Join(err, notifyErr)
		}
	}
}

func send(conn *net.UnixConn, req *rpc.CriuReq) error {
	data, err := req.MarshalVT()
	if err != nil {
		return fmt.Errorf("encode criu request: %w", err)
	}
	if _, err := conn.Write(data); err != nil {
		return fmt.Errorf("write to criu: %w", err)
	}
	return nil
}

// closeRights closes fds criu passed along with a message (orphan-pts-master), which we do
// not use: they would leak otherwise.
func closeRights(oob []byte) {
	if len(oob) == 0 {
		return
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for i := range msgs {
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}
}

func readCapped(f *os.File, max int64) string {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(f, max))
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(l) != "" && !harmlessError(l) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
