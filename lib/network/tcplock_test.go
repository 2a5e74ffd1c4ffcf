package network_test

import (
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/testutil/priv"
)

// inNetNS runs f on a thread moved into the namespace at path (and back).
func inNetNS(t *testing.T, path string, f func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	ns, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			panic(err) // a thread left in another namespace must not run anything else
		}
	}()
	f()
}

// LockTCP drops TCP in a namespace (a connection attempt gets no answer, not even a
// reset) until it is unlocked; then connections work again.
func TestLockTCP(t *testing.T) {
	priv.Root(t, "network namespaces, nftables")
	ns, err := network.NewNetNS()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Release()
	var ln net.Listener
	inNetNS(t, ns.Path, func() {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	})
	defer ln.Close()
	unlock, err := network.LockTCP(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	inNetNS(t, ns.Path, func() {
		if c, err := net.DialTimeout("tcp", ln.Addr().String(), 300*time.Millisecond); err == nil {
			c.Close()
			t.Error("a connection got through the lock")
		} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			t.Errorf("dial through the lock: %v, want a timeout (packets dropped, no reset)", err)
		}
	})
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	inNetNS(t, ns.Path, func() {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 2*time.Second)
		if err != nil {
			t.Fatalf("dial after the unlock: %v", err)
		}
		c.Close()
	})
}
