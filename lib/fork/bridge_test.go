package fork_test

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// counterServer answers every GET with how many requests it has served: state in memory
// that forks inherit and then change on their own.
const counterServer = `import http.server
n = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global n
        n += 1
        b = b"%d" % n
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", 8080), H).serve_forever()
`

// bridgeRuntime is a runtime whose bridge and subnet are the test's own (a /24 picked at
// random in 10.213.0.0/16, or the prefix length given), and that checks, after every
// container is deleted, that no veth, bridge or NAT rule of it is left.
func bridgeRuntime(t *testing.T, bits int) *container.Runtime {
	t.Helper()
	br := fmt.Sprintf("lfbrt%05d", rand.IntN(100000))
	subnet := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 213, byte(rand.IntN(256)), 0}), bits).Masked()
	t.Cleanup(func() { checkNoNetworkLeft(t, br) }) // runs after the runtime's clean-up
	rt := testutil.NewRuntime(t)
	rt.Network = network.Config{Bridge: br, Subnet: subnet.String()}
	return rt
}

func checkNoNetworkLeft(t *testing.T, bridge string) {
	t.Helper()
	out, _ := exec.Command("ip", "-o", "link", "show").CombinedOutput()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, bridge) {
			t.Errorf("left behind: %s", l)
		}
	}
	rules, err := network.NATRules()
	if err != nil {
		t.Errorf("list NAT rules: %v", err)
	}
	// The rules are the machine's: another test's bridge (another helper's run) has its
	// own, and then per-container rules cannot be told apart; this bridge's never may.
	others := false
	for _, r := range rules {
		if b, ok := strings.CutPrefix(r, "lazyfork bridge "); ok && b != bridge {
			others = true
		}
	}
	for _, r := range rules {
		if strings.HasSuffix(r, " "+bridge) || !others {
			t.Errorf("NAT rules left behind: %q", rules)
			break
		}
	}
}

// bridgeClient talks to addresses on the test's bridge only: its sockets are bound to
// the bridge device, so no request can leave the machine whatever the routes say.
func bridgeClient(bridge string) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), bridge) })
		return errors.Join(err, serr)
	}}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

func addrOf(t *testing.T, c *store.Container) string {
	t.Helper()
	p, err := netip.ParsePrefix(c.Addr)
	if err != nil {
		t.Fatalf("%s has no address: %q", c.ID, c.Addr)
	}
	return p.Addr().String()
}

// get asks the counter server at c's address, retrying while it is not yet listening.
func get(t *testing.T, cl *http.Client, c *store.Container) int {
	t.Helper()
	url := "http://" + addrOf(t, c) + ":8080/"
	var last error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := cl.Get(url)
		if err != nil {
			last = err
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			last = err
			continue
		}
		n, err := strconv.Atoi(string(b))
		if err != nil {
			t.Fatalf("%s answered %q", url, b)
		}
		return n
	}
	t.Fatalf("%s (%s) does not answer: %v", url, c.ID, last)
	return 0
}

func hostLinkExists(id string) bool {
	return exec.Command("ip", "link", "show", network.HostLink(id)).Run() == nil
}

// A server in bridge mode, forked 10 times: every fork answers at its own address,
// starting from the parent's counter, then each counts on its own; a fork of a fork too.
// Addresses are unique, and freed (and their veths gone) on delete.
func TestForkHTTPServerInBridgeMode(t *testing.T) {
	rt := bridgeRuntime(t, 24)
	cl := bridgeClient(rt.Network.Bridge)
	src, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "web", Net: container.NetBridge,
		Command: []string{"python3", "-c", counterServer}})
	if err != nil {
		t.Fatal(err)
	}
	if src.Net != container.NetBridge || src.Bridge != rt.Network.Bridge || !hostLinkExists(src.ID) {
		t.Fatalf("record: net %q bridge %q addr %q; veth there: %v", src.Net, src.Bridge, src.Addr, hostLinkExists(src.ID))
	}
	for i := 1; i <= 3; i++ {
		if n := get(t, cl, src); n != i {
			t.Fatalf("request %d to the source: %d", i, n)
		}
	}
	forks := doFork(t, rt, src, 10)
	src = testutil.MustGet(t, rt, src.ID)
	seen := map[string]string{addrOf(t, src): src.ID}
	for _, f := range forks {
		a := addrOf(t, f)
		if other, ok := seen[a]; ok {
			t.Fatalf("%s and %s both hold %s", f.ID, other, a)
		}
		seen[a] = f.ID
		if f.Bridge != src.Bridge || f.Net != container.NetBridge {
			t.Errorf("fork %s: net %q bridge %q", f.ID, f.Net, f.Bridge)
		}
	}
	for _, f := range forks {
		if n := get(t, cl, f); n != 4 {
			t.Errorf("fork %s at %s: first answer %d, want 4 (the parent's 3, plus this request)", f.ID, f.Addr, n)
		}
	}
	// They diverge: the parent and one fork count on, each from its own state.
	if n := get(t, cl, forks[0]); n != 5 {
		t.Errorf("fork 0's second answer: %d, want 5", n)
	}
	if n := get(t, cl, src); n != 4 {
		t.Errorf("the source after the forks: %d, want 4", n)
	}
	// A fork of a fork: its own address again, continuing fork 0's count.
	grand := doFork(t, rt, forks[0], 1)[0]
	if _, ok := seen[addrOf(t, grand)]; ok {
		t.Fatalf("grandchild got an address in use: %s", grand.Addr)
	}
	if n := get(t, cl, grand); n != 6 {
		t.Errorf("grandchild: %d, want 6", n)
	}
	if in := rt.Inspect(grand); in.Net != container.NetBridge || in.Address != addrOf(t, grand) {
		t.Errorf("inspect: net %q address %q, want bridge %s", in.Net, in.Address, addrOf(t, grand))
	}
	// Without --nat the subnet is all there is: no default route inside (read, not tried),
	// and the bridge's forward drop rule in place on the host.
	routes := execOut(t, rt, grand, "cat", "/proc/net/route")
	for _, l := range strings.Split(routes, "\n")[1:] {
		if f := strings.Fields(l); len(f) > 1 && f[1] == "00000000" {
			t.Errorf("default route without --nat:\n%s", routes)
		}
	}
	if rs, err := network.NATRules(); err != nil || !slices.Contains(rs, "lazyfork bridge "+rt.Network.Bridge) {
		t.Errorf("no drop rule for the bridge: %q %v", rs, err)
	}
	// exec works in bridge mode and sees the container's own interface.
	if got := execOut(t, rt, grand, "python3", "-c", "import socket; print(sorted(n for _, n in socket.if_nameindex()))"); got != "['eth0', 'lo']" {
		t.Errorf("interfaces inside: %s", got)
	}

	// Delete frees the address and the veth: the next fork may get it again.
	freed := forks[9]
	if err := rt.Delete(freed); err != nil {
		t.Fatal(err)
	}
	if hostLinkExists(freed.ID) {
		t.Errorf("veth of deleted %s is still there", freed.ID)
	}
	again := doFork(t, rt, src, 1)[0]
	if again.Addr != freed.Addr {
		t.Errorf("the freed %s was not handed out again (got %s)", freed.Addr, again.Addr)
	}
	if n := get(t, cl, again); n != 5 {
		t.Errorf("new fork at a reused address: %d, want 5", n)
	}
	// Stopped (its namespace and veth go with its processes) and started again: the same
	// address, the same count.
	if _, err := fork.Stop(ctx, rt, again, hook.Options{}); err != nil {
		t.Fatal(err)
	}
	if hostLinkExists(again.ID) {
		t.Errorf("stopped %s still has its veth", again.ID)
	}
	again = testutil.MustGet(t, rt, again.ID)
	if err := fork.Start(ctx, rt, again); err != nil {
		t.Fatal(err)
	}
	if n := get(t, cl, testutil.MustGet(t, rt, again.ID)); n != 6 {
		t.Errorf("restarted at %s: %d, want 6", again.Addr, n)
	}
}

// Address exhaustion fails the whole batch with a clear error and leaves nothing: no
// record, no veth; the forks that fit work.
func TestBridgeAddressExhaustion(t *testing.T) {
	rt := bridgeRuntime(t, 29) // 5 addresses for containers
	src, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Net: container.NetBridge, Command: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = fork.Fork(ctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 5}})
	if !errors.Is(err, network.ErrExhausted) || !strings.Contains(err.Error(), "LAZYFORK_SUBNET") {
		t.Fatalf("fork of 5 into 4 free addresses: %v", err)
	}
	all, _ := rt.Containers.List()
	if len(all) != 1 {
		t.Fatalf("%d records after the refused batch, want the source only", len(all))
	}
	forks := doFork(t, rt, testutil.MustGet(t, rt, src.ID), 4)
	if len(forks) != 4 {
		t.Fatal("4 forks")
	}
	if _, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Net: container.NetBridge, Command: []string{"true"}}); !errors.Is(err, network.ErrExhausted) {
		t.Fatalf("create with the subnet full: %v", err)
	}
	if all, _ := rt.Containers.List(); len(all) != 5 {
		t.Fatalf("%d records after the refused create, want 5", len(all))
	}
}

// Bad settings are refused before anything is made, with the fix in one line.
func TestBridgeBadSettings(t *testing.T) {
	rt := bridgeRuntime(t, 24)
	for _, c := range []struct{ bridge, subnet, want string }{
		{"", "10.213.0.1/24", "host bits set: use 10.213.0.0/24"},
		{"", "10.213.0.0", "not in CIDR form"},
		{"", "fd00::/64", "not IPv4"},
		{"", "10.0.0.0/30", "/8 to /29"},
		{"", "127.0.0.0/16", "reserved"},
		{"eth0", "", "bridge name \"eth0\""},
	} {
		rt.Network = network.Config{Bridge: c.bridge, Subnet: c.subnet}
		if c.bridge == "" {
			rt.Network.Bridge = "lfbrtbad"
		}
		if c.subnet == "" {
			rt.Network.Subnet = "10.213.0.0/24"
		}
		_, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Net: container.NetBridge, Command: []string{"true"}})
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%+v: %v", c, err)
		}
	}
	if all, _ := rt.Containers.List(); len(all) != 0 {
		t.Errorf("%d records left", len(all))
	}
	if _, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, NAT: true, Command: []string{"true"}}); err == nil || !strings.Contains(err.Error(), "--net bridge") {
		t.Errorf("--nat without bridge: %v", err)
	}
}

// echoServer echoes what it reads, on every address of the container.
var echoServer = testutil.TCPServer("0.0.0.0", 9000, "")

// echoClient keeps one connection to the echo server at argv[1] (retried until the server
// listens) and reports each round trip, or how the connection ended.
const echoClient = `import socket, sys, time, itertools
while True:
    try:
        s = socket.create_connection((sys.argv[1], 9000))
        break
    except OSError:
        time.sleep(0.1)
for i in itertools.count():
    try:
        s.sendall(b"%d" % i)
        if not s.recv(64):
            raise EOFError()
        print("ok", i, flush=True)
    except Exception as e:
        print("closed", type(e).__name__, flush=True)
        break
    time.sleep(0.1)
time.sleep(100000)
`

// A connection from a bridge-mode container to a peer outside its namespace (another
// container) goes on in the source after a fork; the fork's copy is closed before the
// fork runs (it would speak with the source's address), and the fork can connect anew.
func TestBridgeOutsideConnectionClosedInFork(t *testing.T) {
	rt := bridgeRuntime(t, 24)
	db, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "db", Net: container.NetBridge, Command: []string{"python3", "-c", echoServer}})
	if err != nil {
		t.Fatal(err)
	}
	dbAddr := addrOf(t, db)
	// One client, started once: it retries until the server listens (deleting and
	// recreating it every 0.5 s never let it connect in a slow guest).
	app, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "app", Net: container.NetBridge, Command: []string{"python3", "-c", echoClient, dbAddr}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 15*time.Second, "the client to connect", func() bool {
		l := lines(app)
		return strings.HasPrefix(l[len(l)-1], "ok")
	})
	f := doFork(t, rt, app, 1)[0]
	app = testutil.MustGet(t, rt, app.ID)
	testutil.Eventually(t, 10*time.Second, "the fork to see its copy closed", func() bool {
		l := lines(f)
		return l[len(l)-1] == "closed ConnectionAbortedError"
	})
	n := len(lines(app))
	testutil.Eventually(t, 10*time.Second, "the source's connection to go on", func() bool { return len(lines(app)) > n+5 })
	for _, l := range lines(app) {
		if !strings.HasPrefix(l, "ok") {
			t.Errorf("source: %q", l)
		}
	}
	got := execOut(t, rt, f, "python3", "-c", `import socket, sys; s = socket.create_connection((sys.argv[1], 9000)); s.sendall(b"again"); print(s.recv(64).decode())`, dbAddr)
	if got != "again" {
		t.Errorf("a new connection from the fork: %q", got)
	}
}

// --nat adds a masquerade rule (and a forward accept) per container, forks get their own,
// and every rule, then the table, goes with the containers. No packet is sent anywhere:
// the rules are read back from the kernel.
func TestBridgeNATRules(t *testing.T) {
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.WriteFile("/proc/sys/net/ipv4/ip_forward", fwd, 0o644) })
	rt := bridgeRuntime(t, 24)
	c, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Net: container.NetBridge, NAT: true, Command: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	rules := func() map[string]int {
		rs, err := network.NATRules()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int{}
		for _, r := range rs {
			m[r]++
		}
		return m
	}
	want := func(id string, n int) {
		t.Helper()
		if got := rules()["lazyfork nat "+id]; got != n {
			t.Errorf("%d rules for %s, want %d (all: %v)", got, id, n, rules())
		}
	}
	want(c.ID, 2) // masquerade + forward accept
	if rules()["lazyfork bridge "+rt.Network.Bridge] != 1 {
		t.Errorf("no forward drop rule for the bridge: %v", rules())
	}
	// Masquerading needs forwarding on; the test puts back what the host had.
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Errorf("ip_forward: %q %v", b, err)
	}
	f := doFork(t, rt, c, 1)[0]
	if !f.NAT || !testutil.MustGet(t, rt, c.ID).NAT {
		t.Fatal("fork or swapped source lost --nat")
	}
	want(f.ID, 2)
	want(c.ID, 2) // the swapped source keeps its rules, once
	if err := rt.Delete(f); err != nil {
		t.Fatal(err)
	}
	want(f.ID, 0)
	want(c.ID, 2)
	if err := rt.Delete(testutil.MustGet(t, rt, c.ID)); err != nil {
		t.Fatal(err)
	}
	if rs := rules(); len(rs) != 0 {
		t.Errorf("rules left: %v", rs)
	}
}
