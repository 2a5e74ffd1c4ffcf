package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// socketHolder listens on a TCP port and holds an unconnected UDP socket, tells its parent
// on fd 3 that it is ready, then sleeps: what any networked program holds.
const socketHolder = `import os, socket, time
os.closerange(4, 65536)  # descriptors inherited without close-on-exec would be dumped too
t = socket.socket(socket.AF_INET, socket.SOCK_STREAM); t.bind(("127.0.0.1", 0)); t.listen(1)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
os.write(3, b"k"); os.close(3)
time.sleep(120)`

// ProbeSocketDump dumps a process that holds TCP and UDP sockets, the way a container's
// workload would be dumped. CRIU 4.1 fails on kernels >= 6.16 ("Can't get 1:16 opt":
// those kernels refuse SO_PASSCRED on inet sockets); a CRIU that passes can fork
// programs that opened a socket. It needs root and python3. binary is as Version's.
func ProbeSocketDump(ctx context.Context, binary, scratch string) error {
	py, err := exec.LookPath("python3")
	if err != nil {
		return errors.New("python3 not found (the socket probe runs a python3 process): apt-get install python3")
	}
	ctx, cancel := withDeadline(ctx, 30*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp(scratch, "socket-probe-")
	if err != nil {
		return fmt.Errorf("socket probe: %w", err)
	}
	defer os.RemoveAll(dir)
	ready, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("socket probe: %w", err)
	}
	defer ready.Close()
	cmd := exec.Command(py, "-I", "-S", "-c", socketHolder)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Dir = "/"
	cmd.ExtraFiles = []*os.File{w}
	// Its own session: CRIU dumps a session leader without --shell-job.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("socket probe: start python3: %w", err)
	}
	w.Close()
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	_ = ready.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := ready.Read(make([]byte, 1)); err != nil {
		return fmt.Errorf("socket probe: python3 did not open its sockets: %w", err)
	}
	_, err = Dump(ctx, DumpOptions{Pid: cmd.Process.Pid, CheckpointDir: dir, NetworkLock: NetworkLockSkip, Binary: binary})
	if err != nil {
		return fmt.Errorf("dump a process holding TCP and UDP sockets: %w", err)
	}
	return nil
}
