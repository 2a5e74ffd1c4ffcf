package fork_test

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// tcpPair is a TCP server on 127.0.0.1:8080 with a client connected to it, in one process:
// what a web app and its own health checker, or a database and its client, hold.
const tcpPair = `import socket, threading, time, itertools
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 8080)); srv.listen(8)
def serve():
    while True:
        c, _ = srv.accept()
        threading.Thread(target=lambda c=c: [c.sendall(b"pong " + c.recv(64)) for _ in iter(int, 1)], daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
cl = socket.create_connection(("127.0.0.1", 8080))
for i in itertools.count():
    cl.sendall(b"%d" % i)
    print(cl.recv(64).decode(), [n for _, n in socket.if_nameindex()], flush=True)
    time.sleep(0.1)
`

// By default a container has a network namespace of its own with loopback only, and so
// does each fork: a server listening in the source listens at the same port in every
// fork, its established connection goes on in every fork, and new clients reach each
// fork's own server. The first fork moves the source onto its snapshot, the second
// dumps it as it runs: both from inside its namespace (the checkpoint holds none), and
// every fork and the moved source get a namespace of their own, never the host's.
func TestForkServerWithItsOwnNetwork(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src := create(t, rt, "server", "python3", "-c", tcpPair)
	if src.Net != container.NetNone {
		t.Fatalf("default network mode %q, want none", src.Net)
	}
	testutil.Eventually(t, 10*time.Second, "the pair to talk", func() bool { return len(lines(src)) > 3 })
	if l := lines(src); !strings.HasSuffix(l[len(l)-1], "['lo']") {
		t.Fatalf("the container sees interfaces %q, want only lo", l[len(l)-1])
	}
	forks := doFork(t, rt, src, 2)
	forks = append(forks, doFork(t, rt, testutil.MustGet(t, rt, src.ID), 1)...)
	seen := map[string]string{netnsOf(t, os.Getpid()): "the host"}
	for _, f := range append(forks, testutil.MustGet(t, rt, src.ID)) {
		f := f
		if other, ok := seen[netnsOf(t, f.Pid)]; ok {
			t.Errorf("%s is in %s's network namespace", f.ID, other)
		}
		seen[netnsOf(t, f.Pid)] = f.ID
		n := len(lines(f))
		testutil.Eventually(t, 10*time.Second, f.ID+"'s pair to go on talking", func() bool { return len(lines(f)) > n+5 })
		l := lines(f)
		if !strings.HasPrefix(l[len(l)-1], "pong ") || !strings.HasSuffix(l[len(l)-1], "['lo']") {
			t.Errorf("%s: last line %q, want a pong and only lo", f.ID, l[len(l)-1])
		}
		got := execOut(t, rt, f, "python3", "-c", `import socket; s = socket.create_connection(("127.0.0.1", 8080)); s.sendall(b"new"); print(s.recv(64).decode())`)
		if got != "pong new" {
			t.Errorf("%s: a new client got %q", f.ID, got)
		}
	}
	s, err := fork.Dump(ctx, rt, testutil.MustGet(t, rt, src.ID), fork.DumpOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fork.RemoveSnapshot(s); _ = fork.Collect(rt) })
	if m, _ := filepath.Glob(filepath.Join(s.CheckpointDir, "netns-*.img")); len(m) > 0 {
		t.Errorf("the checkpoint holds the container's network namespace: %v", m)
	}
}

// --net host keeps the host's network (what containers had before).
func TestNetHost(t *testing.T) {
	rt := testutil.NewRuntime(t)
	c, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "hostnet", Net: container.NetHost,
		Command: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	ifs, _ := net.Interfaces()
	host := len(ifs)
	got := execOut(t, rt, c, "python3", "-c", "import socket; print(len(socket.if_nameindex()))")
	if got != strconv.Itoa(host) {
		t.Errorf("--net host sees %s interfaces, the host has %d", got, host)
	}
	if _, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Net: "wifi", Command: []string{"true"}}); err == nil || !strings.Contains(err.Error(), "use none") {
		t.Errorf("unknown mode: %v", err)
	}
}
