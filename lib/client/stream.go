package client

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/lazyfork/lazyfork/lib/trace"
)

// MaxFrame bounds one frame's payload.
const MaxFrame = 1 << 20

// WriteFrame writes one frame of a streamed exec.
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload) > MaxFrame {
		return fmt.Errorf("frame of %d bytes exceeds %d", len(payload), MaxFrame)
	}
	var h [5]byte
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], uint32(len(payload)))
	if _, err := w.Write(append(h[:], payload...)); err != nil {
		return err
	}
	return nil
}

// ReadFrame reads one frame of a streamed exec.
func ReadFrame(r io.Reader) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("frame of %d bytes exceeds %d", n, MaxFrame)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, err
	}
	return h[0], p, nil
}

// Stdio are the streams of a streamed exec.
type Stdio struct {
	Stdin  io.Reader // nil: the command's stdin is at EOF at once
	Stdout io.Writer
	Stderr io.Writer // with TTY both streams arrive on Stdout
	// Resize carries terminal sizes (rows, cols) while a TTY exec runs.
	Resize <-chan [2]uint16
}

// ExecStream runs a command inside ref with its stdin, stdout and stderr streamed (and
// on a terminal if req.TTY), and returns its exit code.
func (c *Client) ExecStream(ctx context.Context, ref string, req ExecRequest, s Stdio) (int, error) {
	ctx, end := trace.Start(ctx, "POST "+ctrPath(ref, "exec")+" (stream)")
	defer end()
	begin := time.Now()
	resp, err := c.send(ctx, "POST", ctrPath(ref, "exec"), req, UpgradeHeader)
	if err != nil {
		return -1, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if err := checkStatus(resp); err != nil {
			return -1, err
		}
		return -1, fmt.Errorf("exec %s: daemon did not switch to a stream (%s)", ref, resp.Status)
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return -1, fmt.Errorf("exec %s: stream is not writable", ref)
	}
	defer rwc.Close()
	stop := context.AfterFunc(ctx, func() { rwc.Close() })
	defer stop()

	var wmu sync.Mutex
	send := func(typ byte, p []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return WriteFrame(rwc, typ, p)
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		if s.Stdin != nil {
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Stdin.Read(buf)
				if n > 0 && send(FrameStdin, buf[:n]) != nil {
					return
				}
				if err != nil {
					break
				}
			}
		}
		_ = send(FrameCloseIn, nil)
	}()
	if s.Resize != nil {
		go func() {
			for {
				select {
				case sz := <-s.Resize:
					var p [4]byte
					binary.BigEndian.PutUint16(p[:2], sz[0])
					binary.BigEndian.PutUint16(p[2:], sz[1])
					if send(FrameResize, p[:]) != nil {
						return
					}
				case <-done:
					return
				}
			}
		}()
	}
	for {
		typ, p, err := ReadFrame(rwc)
		if err != nil {
			if ctx.Err() != nil {
				return -1, ctx.Err()
			}
			return -1, fmt.Errorf("exec %s: stream ended early: %w", ref, err)
		}
		switch typ {
		case FrameStdout:
			if s.Stdout != nil {
				_, _ = s.Stdout.Write(p)
			}
		case FrameStderr:
			if s.Stderr != nil {
				_, _ = s.Stderr.Write(p)
			}
		case FrameTrace:
			trace.Merge(ctx, begin, "daemon: ", trace.Decode(p))
		case FrameExit:
			if len(p) != 4 {
				return -1, fmt.Errorf("exec %s: bad exit frame", ref)
			}
			return int(int32(binary.BigEndian.Uint32(p))), nil
		case FrameError:
			e := &Error{}
			if err := json.Unmarshal(p, e); err != nil {
				return -1, fmt.Errorf("exec %s: bad error frame: %w", ref, err)
			}
			return -1, e
		}
	}
}
