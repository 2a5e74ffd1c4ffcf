package network_test

import (
	"net"
	"path/filepath"
	"testing"

	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/testutil/priv"
)

// TestTCPInUse: a fresh namespace holds no TCP socket; a listener in it, IPv4 or IPv6, is
// one; an unreadable directory reads as in use.
func TestTCPInUse(t *testing.T) {
	priv.Root(t, "network namespaces")
	ns, err := network.NewNetNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Release)
	for _, l := range []struct{ network, addr string }{{}, {"tcp4", "0.0.0.0:0"}, {"tcp6", "[::]:0"}} {
		inNetNS(t, ns.Path, func() {
			if l.network != "" {
				ln, err := net.Listen(l.network, l.addr)
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
			}
			if got := network.TCPInUse("/proc/thread-self/net"); got != (l.network != "") {
				t.Errorf("listener %q: TCPInUse = %v", l.network, got)
			}
		})
	}
	if !network.TCPInUse(filepath.Join(t.TempDir(), "nosuch")) {
		t.Error("a missing directory reads as no socket")
	}
}
