package daemon

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// ttyWrap makes the terminal the command's controlling terminal (so Ctrl-C and job
// control work) where the image has util-linux setsid.
func ttyWrap(argv []string) []string {
	script := `command -v setsid >/dev/null 2>&1 && exec setsid -w -c "$@"; exec "$@"`
	return append([]string{"sh", "-c", script, "sh"}, argv...)
}

// execStream runs an exec over the hijacked connection with the frames of
// client.Frame*: stdin, stdout and stderr streamed, optionally on a terminal.
func (s *Server) execStream(w http.ResponseWriter, r *http.Request, req client.ExecRequest) {
	ref := r.PathValue("ref")
	// Errors found before switching protocols are ordinary JSON answers.
	if _, err := execOptions(req); err != nil {
		writeError(w, err)
		return
	}
	if _, err := s.svc.RT.Containers.Resolve(ref); err != nil {
		writeError(w, err)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		writeError(w, err)
		return
	}
	defer conn.Close()
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + client.UpgradeHeader + "\r\n\r\n")
	if brw.Flush() != nil {
		return
	}
	var wmu sync.Mutex
	send := func(typ byte, p []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		if err := client.WriteFrame(brw, typ, p); err != nil {
			return err
		}
		return brw.Flush()
	}
	// The command dies with the connection: a client that went away leaves nothing running.
	rec := trace.From(r.Context())
	ctx, cancel := context.WithCancel(trace.With(context.Background(), rec))
	defer cancel()

	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		s.sendError(send, err)
		return
	}
	defer stdinR.Close()
	var closeIn sync.Once
	closeStdin := func() { closeIn.Do(func() { stdinW.Close() }) }
	defer closeStdin()

	stdio := client.Stdio{Stdin: stdinR, Stdout: frameWriter{send, client.FrameStdout}, Stderr: frameWriter{send, client.FrameStderr}}
	var ptmx, pts *os.File
	ptyDone := make(chan struct{})
	if req.TTY {
		if ptmx, pts, err = openPty(); err != nil {
			s.sendError(send, err)
			return
		}
		defer ptmx.Close()
		if req.Rows > 0 && req.Cols > 0 {
			setSize(ptmx, req.Rows, req.Cols)
		}
		stdio = client.Stdio{Stdin: pts, Stdout: pts, Stderr: pts}
		req.Argv = ttyWrap(req.Argv)
		go func() {
			defer close(ptyDone)
			_, _ = io.Copy(frameWriter{send, client.FrameStdout}, ptmx)
		}()
	} else {
		close(ptyDone)
	}

	go readFrames(brw.Reader, cancel, func(typ byte, p []byte) {
		switch {
		case typ == client.FrameStdin && ptmx != nil:
			_, _ = ptmx.Write(p)
		case typ == client.FrameStdin:
			_, _ = stdinW.Write(p)
		case typ == client.FrameCloseIn && ptmx == nil:
			closeStdin()
		case typ == client.FrameResize && ptmx != nil && len(p) == 4:
			setSize(ptmx, binary.BigEndian.Uint16(p[:2]), binary.BigEndian.Uint16(p[2:]))
		}
	})

	code, err := s.svc.ExecStream(ctx, ref, req, stdio)
	if pts != nil {
		pts.Close()
		// The rest of the output; bounded, as a background process may keep the terminal.
		select {
		case <-ptyDone:
		case <-time.After(time.Second):
		}
	}
	if rec != nil {
		_ = send(client.FrameTrace, rec.JSON())
	}
	if err != nil {
		s.sendError(send, err)
		return
	}
	var p [4]byte
	binary.BigEndian.PutUint32(p[:], uint32(int32(code)))
	_ = send(client.FrameExit, p[:])
}

func (s *Server) sendError(send func(byte, []byte) error, err error) {
	b, _ := json.Marshal(APIError(err))
	_ = send(client.FrameError, b)
}

// readFrames hands every client frame to fn and cancels when the connection ends.
func readFrames(r *bufio.Reader, cancel context.CancelFunc, fn func(byte, []byte)) {
	defer cancel()
	for {
		typ, p, err := client.ReadFrame(r)
		if err != nil {
			return
		}
		fn(typ, p)
	}
}

// frameWriter sends what is written to it as frames of one type.
type frameWriter struct {
	send func(byte, []byte) error
	typ  byte
}

func (f frameWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += client.MaxFrame {
		end := min(off+client.MaxFrame, len(p))
		if err := f.send(f.typ, p[off:end]); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

// openPty opens a new pseudo-terminal pair: the controller stays here, the terminal goes
// to the command.
func openPty() (ptmx, pts *os.File, err error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	tfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("open pty peer: %w", errno)
	}
	return os.NewFile(uintptr(fd), "ptmx"), os.NewFile(tfd, "pts"), nil
}

func setSize(f *os.File, rows, cols uint16) {
	_ = unix.IoctlSetWinsize(int(f.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
}
