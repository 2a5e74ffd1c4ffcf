package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/daemon"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// probeHTTP (in a child, as another user) sends GET /v1/ping and prints the raw answer.
func probeHTTP(sock string) int {
	c, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Printf("connect: %v\n", err)
		return 2
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET /v1/ping HTTP/1.1\r\nHost: lazyfork\r\nConnection: close\r\n\r\n")
	b, _ := io.ReadAll(c)
	os.Stdout.Write(b)
	return 0
}

// lockedBuffer is a log sink the daemon's goroutines write to while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runDaemon serves rt with cfg (its socket in a fresh /tmp dir, 0755 so another user may
// reach it) until the test ends.
func runDaemon(t *testing.T, rt *container.Runtime, cfg daemon.Config) *client.Client {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "lfp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.Socket = filepath.Join(dir, "run", "lazyfork.sock")
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() { done <- daemon.Run(ctx, rt, cfg) }()
	stop := sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon: %v", err)
		}
	})
	t.Cleanup(stop)
	cl := client.New(cfg.Socket)
	testutil.Eventually(t, 10*time.Second, "daemon to answer", func() bool { _, err := cl.Ping(bg); return err == nil })
	return cl
}

// probeCmd is this test binary, copied where any user may run it, as cred with env: a
// client of the daemon that is not root.
func probeCmd(t *testing.T, env string, cred *syscall.Credential) *exec.Cmd {
	t.Helper()
	self, _ := os.Executable()
	bin, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "lfd-probe-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	if err := os.WriteFile(filepath.Join(dir, "probe"), bin, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(dir, "probe"))
	cmd.Env = []string{env}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	return cmd
}

// probeAs runs probeHTTP as cred against socket and returns what it printed.
func probeAs(t *testing.T, socket string, cred *syscall.Credential) string {
	t.Helper()
	out, err := probeCmd(t, "LF_TEST_HTTP="+socket, cred).CombinedOutput()
	if err != nil {
		t.Logf("probe as %d: %v", cred.Uid, err)
	}
	return string(out)
}

// openToAll defeats the socket's file mode, so only the daemon's own check stands.
func openToAll(t *testing.T, socket string) {
	t.Helper()
	if err := os.Chmod(filepath.Dir(socket), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(socket, 0o666); err != nil {
		t.Fatal(err)
	}
}

func TestPeerCredentials(t *testing.T) {
	rt := testutil.NewRuntime(t)
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}

	// No such group: root only, whatever the socket's mode.
	logs := &lockedBuffer{}
	cl := runDaemon(t, rt, daemon.Config{Group: "lazyfork-test-nosuch", Log: slog.New(slog.NewTextHandler(logs, nil))})
	socket := cl.Socket
	openToAll(t, socket)
	out := probeAs(t, socket, nobody)
	if !strings.HasPrefix(out, "HTTP/1.1 403") || !strings.Contains(out, `"code":"forbidden"`) || !strings.Contains(out, "uid 65534") {
		t.Errorf("user nobody, not in the group: %q (want a JSON 403)", out)
	}
	if l := logs.String(); !strings.Contains(l, "refused client") || !strings.Contains(l, "uid=65534") {
		t.Errorf("no log line for the refused client: %q", l)
	}
	if _, err := cl.Ping(bg); err != nil {
		t.Errorf("root refused: %v", err)
	}
	// "none": root only even for a group that exists.
	cl = runDaemon(t, rt, daemon.Config{Group: "none"})
	openToAll(t, cl.Socket)
	if out := probeAs(t, cl.Socket, nobody); !strings.HasPrefix(out, "HTTP/1.1 403") {
		t.Errorf("group none, user nobody: %q", out)
	}

	// The allowed group: its members get in by primary or supplementary group; the socket
	// is theirs (0660) and the directory the daemon made lets them through (0710).
	g, err := user.LookupGroup("nogroup")
	if err != nil {
		t.Fatalf("this test needs the nogroup group: %v", err)
	}
	gid, _ := strconv.Atoi(g.Gid)
	cl = runDaemon(t, rt, daemon.Config{Group: "nogroup"})
	socket = cl.Socket
	for p, want := range map[string]os.FileMode{socket: 0o660, filepath.Dir(socket): 0o710} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != want || int(st.Gid) != gid || st.Uid != 0 {
			t.Errorf("%s: mode %v owner %d:%d, want %v root:%d", p, fi.Mode().Perm(), st.Uid, st.Gid, want, gid)
		}
	}
	if out := probeAs(t, socket, &syscall.Credential{Uid: 65534, Gid: uint32(gid)}); !strings.HasPrefix(out, "HTTP/1.1 200") {
		t.Errorf("member by primary group: %q", out)
	}
	if out := probeAs(t, socket, &syscall.Credential{Uid: 65534, Gid: 4242, Groups: []uint32{uint32(gid)}}); !strings.HasPrefix(out, "HTTP/1.1 200") {
		t.Errorf("member by supplementary group: %q", out)
	}
	if out := probeAs(t, socket, &syscall.Credential{Uid: 65534, Gid: 4242}); !strings.Contains(out, "permission denied") {
		t.Errorf("non-member through the socket's mode: %q (want permission denied)", out)
	}
	openToAll(t, socket)
	if out := probeAs(t, socket, &syscall.Credential{Uid: 65534, Gid: 4242}); !strings.HasPrefix(out, "HTTP/1.1 403") {
		t.Errorf("non-member past the socket's mode: %q (want a JSON 403)", out)
	}
}

// Slow and idle clients are cut off; long operations and streams are not.
func TestSlowClientsTimeOut(t *testing.T) {
	rt := testutil.NewRuntime(t)
	cl := runDaemon(t, rt, daemon.Config{ReadHeaderTimeout: 300 * time.Millisecond, ReadTimeout: time.Second, IdleTimeout: time.Second})
	socket := cl.Socket
	dial := func() net.Conn {
		c, err := net.Dial("unix", socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		return c
	}
	closedWithin := func(what string, c net.Conn, lo, hi time.Duration) string {
		t.Helper()
		begin := time.Now()
		b, err := io.ReadAll(c)
		d := time.Since(begin)
		if err != nil {
			t.Errorf("%s: %v after %v (want the daemon to close)", what, err, d)
		}
		if d < lo || d > hi {
			t.Errorf("%s: closed after %v, want %v..%v", what, d, lo, hi)
		}
		return string(b)
	}

	// Headers that never end.
	c := dial()
	fmt.Fprintf(c, "GET /v1/ping HTTP/1.1\r\nHost: lazyfork\r\nX-Slow: ")
	closedWithin("slow headers", c, 200*time.Millisecond, 3*time.Second)

	// A body that never arrives.
	c = dial()
	fmt.Fprintf(c, "POST /v1/gc HTTP/1.1\r\nHost: lazyfork\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	out := closedWithin("slow body", c, 800*time.Millisecond, 4*time.Second)
	if !strings.HasPrefix(out, "HTTP/1.1 408") || !strings.Contains(out, `"code":"request_timeout"`) {
		t.Errorf("slow body: answer %q (want a JSON 408)", out)
	}

	// A kept-alive connection left idle.
	c = dial()
	fmt.Fprintf(c, "GET /v1/ping HTTP/1.1\r\nHost: lazyfork\r\n\r\n")
	buf := make([]byte, 4096)
	if n, err := c.Read(buf); err != nil || !strings.HasPrefix(string(buf[:n]), "HTTP/1.1 200") {
		t.Fatalf("ping: %q %v", buf[:n], err)
	}
	closedWithin("idle connection", c, 500*time.Millisecond, 4*time.Second)

	// Streams outlive every timeout: events, and a streamed exec.
	events := make(chan client.Event, 16)
	ectx, cancel := context.WithCancel(bg)
	defer cancel()
	go func() {
		_ = cl.Events(ectx, func(e client.Event) error { events <- e; return nil })
	}()
	time.Sleep(2500 * time.Millisecond) // past ReadTimeout and IdleTimeout
	in, err := cl.Create(bg, client.CreateRequest{Image: image, Name: "slowtest", Command: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-events:
		if e.ID != in.ID {
			t.Errorf("event %+v, want one for %s", e, in.ID)
		}
	case <-time.After(10 * time.Second):
		t.Error("no event on a stream older than the timeouts")
	}
	var stdout bytes.Buffer
	code, err := cl.ExecStream(bg, in.ID, client.ExecRequest{Argv: []string{"sh", "-c", "sleep 2.5; echo done"}}, client.Stdio{Stdout: &stdout, Stderr: io.Discard})
	if err != nil || code != 0 || strings.TrimSpace(stdout.String()) != "done" {
		t.Errorf("exec stream longer than the timeouts: code %d err %v out %q", code, err, stdout.String())
	}
	if err := cl.Delete(bg, in.ID); err != nil {
		t.Error(err)
	}
}
