package fork_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
	"github.com/lazyfork/lazyfork/lib/testutil/timescale"
)

// A server and a client in one cluster (two containers sharing a network namespace) with
// an open TCP connection over loopback, forked 3 times as one cut: in every fork the pair
// goes on talking over the same connection, and so does the source pair.
func TestClusterForkKeepsLoopbackConnection(t *testing.T) {
	rt := testutil.NewRuntime(t)
	srv := create(t, rt, "srv", "python3", "-c", testutil.LoopbackServer)
	cl, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "cl", Join: "srv", Command: []string{"python3", "-c", testutil.PortClient}})
	if err != nil {
		t.Fatal(err)
	}
	if cl.Cluster != srv.ID {
		t.Fatalf("client's cluster %q, want %s", cl.Cluster, srv.ID)
	}
	testutil.Eventually(t, 15*time.Second, "the pair to talk", func() bool { return len(lines(cl)) > 3 })
	port := strings.Fields(lines(cl)[0])[0]

	res, err := fork.ForkCluster(ctx, rt, testutil.MustGet(t, rt, srv.ID), fork.ClusterOptions{N: 3})
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
	clients := []*store.Container{testutil.MustGet(t, rt, cl.ID)}
	for i := 0; i < 3; i++ {
		s, c := testutil.MustGet(t, rt, res.Members[0].Forks[i].ID), testutil.MustGet(t, rt, res.Members[1].Forks[i].ID)
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
	srv := create(t, rt, "srv", "python3", "-c", testutil.LoopbackServer)
	cl, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Join: srv.ID, Command: []string{"python3", "-c", testutil.PortClient}})
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

// askFromHost sends msg to addr:8080 over a socket bound to the test's bridge (nothing
// can leave the machine) and returns the answer, retrying until deadline.
func askFromHost(t *testing.T, bridge, addr, msg string) string {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), bridge) })
		return errors.Join(err, serr)
	}}
	var last error
	for deadline := time.Now().Add(timescale.Scale(15 * time.Second)); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		c, err := d.Dial("tcp", net.JoinHostPort(addr, "8080"))
		if err != nil {
			last = err
			continue
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Write([]byte(msg))
		b := make([]byte, 64)
		n, rerr := c.Read(b)
		c.Close()
		if err = errors.Join(err, rerr); err != nil {
			last = err
			continue
		}
		return string(b[:n])
	}
	t.Fatalf("%s:8080 does not answer from the host: %v", addr, last)
	return ""
}

// netnsOf is the network namespace (its /proc link text) pid is in.
func netnsOf(t *testing.T, pid int) string {
	t.Helper()
	l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// netnsHeld says whether any task on the machine is still in namespace ns.
func netnsHeld(ns string) bool { return len(netnsHolders(ns)) > 0 }

// netnsHolders are the tasks in namespace ns, as "pid/tid comm".
func netnsHolders(ns string) []string {
	links, _ := filepath.Glob("/proc/[0-9]*/task/[0-9]*/ns/net")
	var out []string
	for _, p := range links {
		if l, err := os.Readlink(p); err == nil && l == ns {
			comm, _ := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(p)), "comm"))
			out = append(out, strings.TrimPrefix(filepath.Dir(filepath.Dir(p)), "/proc/")+" "+strings.TrimSpace(string(comm)))
		}
	}
	return out
}

// A server and a client in one bridge-mode cluster (the client joined the server's
// namespace, which holds the cluster's address) with an open TCP connection over
// loopback, forked 3 times as one cut: every fork's namespace gets its own address with
// both members restored inside; each pair goes on talking over the same connection, and
// each fork's server answers the host at the fork's address; the parent's too. Deleting
// everything leaves no veth, bridge port, NAT rule or namespace.
func TestBridgeClusterFork(t *testing.T) {
	rt := bridgeRuntime(t, 24)
	br := rt.Network.Bridge
	srv := bridgeServer(t, rt)
	// A member takes the cluster's network: another mode, or NAT of its own, is refused.
	for _, o := range []container.CreateOptions{{Net: container.NetNone}, {Net: container.NetHost}, {NAT: true}} {
		o.Image, o.Join, o.Command = testutil.DefaultImage, "srv", []string{"true"}
		if _, err := rt.Create(ctx, o); err == nil || !strings.Contains(err.Error(), "leave") {
			t.Errorf("join with net %q nat %v: %v", o.Net, o.NAT, err)
		}
	}
	cl, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "cl", Join: "srv", Command: []string{"python3", "-c", testutil.PortClient}})
	if err != nil {
		t.Fatal(err)
	}
	srv = testutil.MustGet(t, rt, srv.ID)
	if cl.Cluster != srv.ID || cl.Net != container.NetBridge || cl.Addr != srv.Addr || cl.Bridge != br || hostLinkExists(cl.ID) {
		t.Fatalf("member: cluster %q net %q addr %q (leader's %q) bridge %q; own veth %v", cl.Cluster, cl.Net, cl.Addr, srv.Addr, cl.Bridge, hostLinkExists(cl.ID))
	}
	testutil.Eventually(t, timescale.Scale(15*time.Second), "the pair to talk", func() bool { return len(lines(cl)) > 3 })
	port := strings.Fields(lines(cl)[0])[0]
	if got := askFromHost(t, br, addrOf(t, srv), "host"); got != "pong host" {
		t.Fatalf("the cluster's server from the host: %q", got)
	}

	res, err := fork.ForkCluster(ctx, rt, testutil.MustGet(t, rt, cl.ID), fork.ClusterOptions{N: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Members) != 2 || len(res.Leaders) != 3 {
		t.Fatalf("%d members, %d forks", len(res.Members), len(res.Leaders))
	}
	leaders := []*store.Container{srv}
	clients := []*store.Container{testutil.MustGet(t, rt, cl.ID)}
	seen := map[string]string{srv.Addr: srv.ID}
	for i := 0; i < 3; i++ {
		s, c := testutil.MustGet(t, rt, res.Members[0].Forks[i].ID), testutil.MustGet(t, rt, res.Members[1].Forks[i].ID)
		if s.Cluster != s.ID || c.Cluster != s.ID || s.Net != container.NetBridge || c.Net != container.NetBridge {
			t.Errorf("fork %d: clusters %q and %q (want %s), nets %q %q", i, s.Cluster, c.Cluster, s.ID, s.Net, c.Net)
		}
		if other, ok := seen[s.Addr]; ok || s.Addr == "" {
			t.Fatalf("fork %d's leader %s has address %q, held by %s", i, s.ID, s.Addr, other)
		}
		seen[s.Addr] = s.ID
		if c.Addr != s.Addr || hostLinkExists(c.ID) || !hostLinkExists(s.ID) {
			t.Errorf("fork %d: member address %q (leader's %q), member veth %v, leader veth %v", i, c.Addr, s.Addr, hostLinkExists(c.ID), hostLinkExists(s.ID))
		}
		if netnsOf(t, s.Pid) != netnsOf(t, c.Pid) || netnsOf(t, s.Pid) == netnsOf(t, srv.Pid) {
			t.Errorf("fork %d: members in %s and %s, source in %s", i, netnsOf(t, s.Pid), netnsOf(t, c.Pid), netnsOf(t, srv.Pid))
		}
		if f := res.Members[1].Forks[i]; f.Address != addrOf(t, s) {
			t.Errorf("fork %d: member's reported address %q, want %s", i, f.Address, addrOf(t, s))
		}
		leaders, clients = append(leaders, s), append(clients, c)
	}
	for _, c := range clients {
		n := len(lines(c))
		testutil.Eventually(t, timescale.Scale(15*time.Second), c.ID+"'s pair to go on talking", func() bool { return len(lines(c)) > n+5 })
		for _, l := range lines(c)[n:] {
			if f := strings.Fields(l); len(f) < 3 || f[0] != port || f[1] != "pong" {
				t.Errorf("%s: %q (want the same connection, port %s, answered)", c.ID, l, port)
				break
			}
		}
	}
	for _, s := range leaders {
		if got := askFromHost(t, br, addrOf(t, s), "from-host"); got != "pong from-host" {
			t.Errorf("%s at %s from the host: %q", s.ID, addrOf(t, s), got)
		}
	}
	if in := rt.Inspect(clients[1]); in.Address != addrOf(t, leaders[1]) || in.Net != container.NetBridge {
		t.Errorf("inspect of a fork's member: net %q address %q, want bridge %s", in.Net, in.Address, addrOf(t, leaders[1]))
	}

	// Delete: the leader first (its member keeps the namespace, address and veth), then
	// the member; nothing of the fork is left.
	ns := netnsOf(t, leaders[1].Pid)
	if err := rt.Delete(leaders[1]); err != nil {
		t.Fatal(err)
	}
	if !hostLinkExists(leaders[1].ID) {
		t.Errorf("the veth of %s went with its leader while member %s lives in it", ns, clients[1].ID)
	}
	if got := execOut(t, rt, clients[1], "python3", "-c", `import socket; print(sorted(n for _, n in socket.if_nameindex()))`); got != "['eth0', 'lo']" {
		t.Errorf("interfaces left to the member: %s", got)
	}
	if err := rt.Delete(clients[1]); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timescale.Scale(10*time.Second), "the fork's namespace and veth to go", func() bool {
		return !netnsHeld(ns) && !hostLinkExists(leaders[1].ID)
	})
	// The others, member first this time; every namespace goes.
	var spaces []string
	for i := 2; i < 4; i++ {
		spaces = append(spaces, netnsOf(t, leaders[i].Pid))
		for _, c := range []*store.Container{clients[i], leaders[i]} {
			if err := rt.Delete(c); err != nil {
				t.Fatal(err)
			}
		}
	}
	spaces = append(spaces, netnsOf(t, srv.Pid))
	for _, c := range []*store.Container{clients[0], srv} {
		if err := rt.Delete(c); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, timescale.Scale(10*time.Second), "every namespace to go", func() bool {
		return !slices.ContainsFunc(spaces, netnsHeld)
	})
	if all, _ := rt.Containers.List(); len(all) != 0 {
		t.Errorf("%d records left", len(all))
	}
	// checkNoNetworkLeft (bridgeRuntime's clean-up) checks the bridge, veths and NAT rules.
}

// bridgeServer creates "srv": a bridge-mode container answering "pong d" on port 8080 of
// every address it has (the cluster's leader, reached from the host).
func bridgeServer(t *testing.T, rt *container.Runtime) *store.Container {
	t.Helper()
	srv, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "srv", Net: container.NetBridge,
		Command: []string{"python3", "-c", testutil.TCPServer("0.0.0.0", 8080, "pong ")}})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// A bridge-mode cluster stopped as one cut and started again in place: every member is
// a stopped record while down (no process, no veth); starting one member starts the
// whole cluster, and the pair goes on over the same connection, the server answering the
// host at the cluster's own address.
func TestClusterStopStart(t *testing.T) {
	rt := bridgeRuntime(t, 24)
	br := rt.Network.Bridge
	srv := bridgeServer(t, rt)
	cl, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "cl", Join: "srv", Command: []string{"python3", "-c", testutil.PortClient}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timescale.Scale(15*time.Second), "the pair to talk", func() bool { return len(lines(cl)) > 3 })
	port := strings.Fields(lines(cl)[0])[0]
	if got := askFromHost(t, br, addrOf(t, srv), "a"); got != "pong a" {
		t.Fatalf("before: %q", got)
	}
	ns := netnsOf(t, srv.Pid)
	snaps, err := fork.StopCluster(ctx, rt, testutil.MustGet(t, rt, cl.ID), fork.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 2 || !snaps[0].SharedNetNS || snaps[0].Source.ID != srv.ID || snaps[1].Source.ID != cl.ID {
		t.Fatalf("snapshots %+v", snaps)
	}
	for _, id := range []string{srv.ID, cl.ID} {
		if c := testutil.MustGet(t, rt, id); c.State != store.StateStopped || rt.State(c) != store.StateStopped || c.Snapshot == "" {
			t.Errorf("%s after the stop: record %s, live %s, snapshot %q", id, c.State, rt.State(c), c.Snapshot)
		}
	}
	gone := func() bool { return !netnsHeld(ns) && !hostLinkExists(srv.ID) }
	for deadline := time.Now().Add(timescale.Scale(30 * time.Second)); !gone() && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	if !gone() {
		t.Fatalf("after the stop: namespace %s held by %v; veth there: %v", ns, netnsHolders(ns), hostLinkExists(srv.ID))
	}
	n := len(lines(cl))
	// Starting one member (lazyfork start, as after a tree drop) starts the whole cluster.
	if err := fork.Start(ctx, rt, testutil.MustGet(t, rt, cl.ID)); err != nil {
		t.Fatal(err)
	}
	s, c := testutil.MustGet(t, rt, srv.ID), testutil.MustGet(t, rt, cl.ID)
	if rt.State(s) != store.StateRunning || rt.State(c) != store.StateRunning || netnsOf(t, s.Pid) != netnsOf(t, c.Pid) || s.Addr != c.Addr {
		t.Fatalf("after the start: %s %s, namespaces %s %s, addresses %s %s", rt.State(s), rt.State(c), netnsOf(t, s.Pid), netnsOf(t, c.Pid), s.Addr, c.Addr)
	}
	testutil.Eventually(t, timescale.Scale(15*time.Second), "the pair to go on talking", func() bool { return len(lines(c)) > n+5 })
	for _, l := range lines(c)[n:] {
		if f := strings.Fields(l); len(f) < 3 || f[0] != port || f[1] != "pong" {
			t.Errorf("after the start: %q (want the same connection, port %s, answered)", l, port)
			break
		}
	}
	if got := askFromHost(t, br, addrOf(t, s), "b"); got != "pong b" {
		t.Errorf("after the start, from the host: %q", got)
	}
}
