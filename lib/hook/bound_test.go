package hook_test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/hook"
)

// serveOnce answers one connection on root/agent.sock with answer, then closes it.
func serveOnce(t *testing.T, root string, answer []byte) {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(root, "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64)
		_, _ = c.Read(buf)
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.Write(answer)
	}()
}

// A runtime that answers without end (or keeps writing after OK) gets a clear error, and
// the host reads only a bounded amount.
func TestHookAnswerBounded(t *testing.T) {
	for name, tc := range map[string]struct {
		answer []byte
		ok     bool
	}{
		"ok":                  {[]byte("OK\n"), true},
		"ok with words":       {[]byte("OK ready\n"), true},
		"no newline, 8 KiB":   {bytes.Repeat([]byte("x"), 8<<10), false},
		"OK then 1 MiB":       {append([]byte("OK\n"), bytes.Repeat([]byte("y"), 1<<20)...), false},
		"long answer line":    {append(bytes.Repeat([]byte("E"), hook.MaxAnswer+10), '\n'), false},
		"answer at the limit": {append([]byte("OK "), append(bytes.Repeat([]byte("z"), hook.MaxAnswer-4), '\n')...), true},
	} {
		t.Run(name, func(t *testing.T) {
			root, err := shortTempDir(t)
			if err != nil {
				t.Fatal(err)
			}
			serveOnce(t, root, tc.answer)
			err = hook.Send(ctx, root, "/agent.sock", "QUIESCE", 3*time.Second)
			if tc.ok {
				if err != nil {
					t.Fatalf("Send: %v", err)
				}
				return
			}
			if !errors.Is(err, hook.ErrAnswerTooLong) {
				t.Fatalf("Send = %v, want ErrAnswerTooLong", err)
			}
			if strings.Contains(err.Error(), "\n") || len(err.Error()) > 400 {
				t.Errorf("error is not one short line: %q", err)
			}
		})
	}
}

// shortTempDir keeps the socket path under sun_path's 108 bytes.
func shortTempDir(t *testing.T) (string, error) {
	d, err := os.MkdirTemp("/tmp", "lfh-")
	if err == nil {
		t.Cleanup(func() { _ = os.RemoveAll(d) })
	}
	return d, err
}
