package daemon_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// Bridge mode and clusters through the HTTP API: Info carries net, address, bridge and
// cluster; a bridge fork has its own address; cluster-fork answers each member's pause and
// copies, with the fork's client still talking to its server over loopback.
func TestNetworkThroughDaemon(t *testing.T) {
	br := fmt.Sprintf("lfbrd%05d", rand.IntN(100000))
	t.Cleanup(func() { // after the daemon's runtime deleted its containers
		if out, err := exec.Command("ip", "link", "show", br).CombinedOutput(); err == nil {
			t.Errorf("bridge left: %s", out)
		}
	})
	d := newDaemon(t)
	d.rt.Network = network.Config{Bridge: br, Subnet: fmt.Sprintf("10.213.%d.0/24", rand.IntN(256))}

	web, err := d.cl.Create(bg, client.CreateRequest{Image: image, Name: "web", Net: "bridge",
		Command: []string{"python3", "-m", "http.server", "8080", "--bind", "0.0.0.0"}})
	if err != nil {
		t.Fatal(err)
	}
	if web.Net != "bridge" || web.Bridge != br || !netip.MustParsePrefix(d.rt.Network.Subnet).Contains(netip.MustParseAddr(web.Address)) {
		t.Fatalf("created %+v", web)
	}
	fr, err := d.cl.Fork(bg, "web", client.ForkRequest{N: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := d.cl.Get(bg, fr.Forks[0].ID)
	if err != nil || f.Address == "" || f.Address == web.Address || fr.Forks[0].Address != f.Address {
		t.Fatalf("fork %+v (line %+v), %v", f, fr.Forks[0], err)
	}
	// The fork reaches its parent's server over the bridge.
	get := fmt.Sprintf(`import urllib.request; print(urllib.request.urlopen("http://%s:8080/", timeout=5).status)`, web.Address)
	testutil.Eventually(t, 15*time.Second, "the fork to reach web", func() bool {
		res, err := d.cl.Exec(bg, f.ID, client.ExecRequest{Argv: []string{"python3", "-c", get}, Timeout: 20})
		return err == nil && strings.TrimSpace(res.Stdout) == "200"
	})

	srv, cl := d.pair()
	if cl.Cluster != srv.ID {
		t.Fatalf("member %+v, want cluster %s", cl, srv.ID)
	}
	res, err := d.cl.ClusterFork(bg, "cl", client.ClusterForkRequest{N: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Kind != "lazyfork.cluster-fork" || res.Cluster != srv.ID || len(res.Leaders) != 2 || len(res.Members) != 2 || res.Members[0].PauseMs <= 0 {
		t.Fatalf("cluster fork %+v", res)
	}
	for _, fc := range res.Members[1].Forks {
		in, err := d.cl.Get(bg, fc.ID)
		if err != nil || in.Cluster == "" || in.Cluster == srv.ID {
			t.Errorf("forked member %+v, %v", in, err)
		}
		n := -1
		testutil.Eventually(t, 15*time.Second, fc.ID+" to go on talking", func() bool {
			out := d.exec(fc.ID, "sh", "-c", "grep -c pong /var/log/lazyfork/output.log || true")
			var c int
			fmt.Sscan(out, &c)
			if n < 0 {
				n = c
			}
			return c > n+5
		})
	}
	_, err = d.cl.ClusterFork(bg, "nope", client.ClusterForkRequest{})
	wantCode(t, err, client.CodeNotFound)
	_, err = d.cl.Create(bg, client.CreateRequest{Image: image, Net: "wifi", Command: []string{"true"}})
	wantCode(t, err, client.CodeBadRequest)
	_, err = d.cl.Create(bg, client.CreateRequest{Image: image, NAT: true, Command: []string{"true"}})
	wantCode(t, err, client.CodeBadRequest)
}
