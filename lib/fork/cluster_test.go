package fork_test

import (
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/runtime"
	"github.com/lazyfork/lazyfork/lib/testutil"
	"github.com/lazyfork/lazyfork/lib/tree"
)

const loopbackServer = `import socket, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 8080)); srv.listen(8)
def serve(c):
    while True:
        d = c.recv(64)
        if not d:
            return
        c.sendall(b"pong " + d)
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
`

// loopbackClient keeps one connection to the server on 127.0.0.1:8080 and prints, per
// round trip, its own port (which connection) and the answer.
const loopbackClient = `import socket, time, itertools
while True:
    try:
        cl = socket.create_connection(("127.0.0.1", 8080))
        break
    except OSError:
        time.sleep(0.1)
port = cl.getsockname()[1]
for i in itertools.count():
    cl.sendall(b"%d" % i)
    r = cl.recv(64)
    if not r:
        print("closed", flush=True)
        break
    print(port, r.decode(), flush=True)
    time.sleep(0.1)
time.sleep(1000000)
`

// A server and a client in one cluster (two containers sharing a network namespace) with
// an open TCP connection over loopback, forked 3 times as one cut: in every fork the pair
// goes on talking over the same connection, and so does the source pair.
func TestClusterForkKeepsLoopbackConnection(t *testing.T) {
	rt := testutil.NewRuntime(t)
	srv := create(t, rt, "srv", "python3", "-c", loopbackServer)
	cl, err := rt.Create(ctx, runtime.CreateOptions{Image: testutil.DefaultImage, Name: "cl", Join: "srv", Command: []string{"python3", "-c", loopbackClient}})
	if err != nil {
		t.Fatal(err)
	}
	if cl.Cluster != srv.ID {
		t.Fatalf("client's cluster %q, want %s", cl.Cluster, srv.ID)
	}
	testutil.Eventually(t, 15*time.Second, "the pair to talk", func() bool { return len(lines(cl)) > 3 })
	port := strings.Fields(lines(cl)[0])[0]

	res, err := fork.ForkCluster(ctx, rt, mustGet(t, rt, srv.ID), fork.ClusterOptions{N: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Members) != 2 || len(res.Leaders) != 3 {
		t.Fatalf("%d members, %d forks", len(res.Members), len(res.Leaders))
	}
	for _, m := range res.Members {
		if m.PauseMs <= 0 || m.PauseMs < m.FrozenMs {
			t.Errorf("member %s: pause %.1f ms, criu frozen %.1f ms", m.ID, m.PauseMs, m.FrozenMs)
		}
		t.Logf("member %s paused %.1f ms (criu frozen %.1f ms)", m.ID, m.PauseMs, m.FrozenMs)
	}
	clients := []*tree.Container{mustGet(t, rt, cl.ID)}
	for i := 0; i < 3; i++ {
		s, c := mustGet(t, rt, res.Members[0].Forks[i].ID), mustGet(t, rt, res.Members[1].Forks[i].ID)
		if s.Cluster != s.ID || c.Cluster != s.ID {
			t.Errorf("fork %d: clusters %q and %q, want %s", i, s.Cluster, c.Cluster, s.ID)
		}
		clients = append(clients, c)
	}
	for _, c := range clients {
		c := c
		n := len(lines(c))
		testutil.Eventually(t, 15*time.Second, c.ID+"'s pair to go on talking", func() bool { return len(lines(c)) > n+5 })
		for _, l := range lines(c)[n:] {
			if f := strings.Fields(l); len(f) < 3 || f[0] != port || f[1] != "pong" {
				t.Errorf("%s: %q (want the same connection, port %s, answered)", c.ID, l, port)
				break
			}
		}
	}
	// Each fork's pair lives in its own namespace: the forks' servers are distinct.
	got := execOut(t, rt, clients[1], "python3", "-c", `import socket; s = socket.create_connection(("127.0.0.1", 8080)); s.sendall(b"new"); print(s.recv(64).decode())`)
	if got != "pong new" {
		t.Errorf("a new client in fork 0's namespace: %q", got)
	}
}

// A member forked alone is copied, not moved: the source pair keeps its connection; stop
// and --share, which would take it out of the cluster's namespace, are refused.
func TestClusterMemberAlone(t *testing.T) {
	rt := testutil.NewRuntime(t)
	srv := create(t, rt, "srv", "python3", "-c", loopbackServer)
	cl, err := rt.Create(ctx, runtime.CreateOptions{Image: testutil.DefaultImage, Join: srv.ID, Command: []string{"python3", "-c", loopbackClient}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 15*time.Second, "the pair to talk", func() bool { return len(lines(cl)) > 3 })
	if _, err := fork.Stop(ctx, rt, cl, hook.Options{}); err == nil || !strings.Contains(err.Error(), "member of cluster") {
		t.Errorf("stop of a member: %v", err)
	}
	if _, _, err := fork.Fork(ctx, rt, cl, fork.Options{Share: true, RestoreOptions: fork.RestoreOptions{N: 1}}); err == nil || !strings.Contains(err.Error(), "--share") {
		t.Errorf("--share of a member: %v", err)
	}
	doFork(t, rt, cl, 1)
	n := len(lines(cl))
	testutil.Eventually(t, 10*time.Second, "the source pair to go on", func() bool { return len(lines(cl)) > n+5 })
	if l := lines(cl); !strings.Contains(l[len(l)-1], "pong") {
		t.Errorf("source client: %q", l[len(l)-1])
	}
}
