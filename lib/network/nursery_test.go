package network_test

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/testutil/priv"
	"golang.org/x/sys/unix"
)

func sysctl(t *testing.T, name string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/ipv4/" + name)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}

// TestNetNSOwnTCPTable: a namespace NewNetNS makes has a TCP hash table of its own
// (ChildEhashEntries buckets; a negative size is the host's, shared) with the time-wait
// and SYN backlog limits of a namespace sharing the host's table, and the host's sysctl
// is left as it was.
func TestNetNSOwnTCPTable(t *testing.T) {
	priv.Root(t, "network namespaces")
	hostChild := sysctl(t, "tcp_child_ehash_entries")
	// A namespace made from the host's, as the kernel makes one: the limits to keep.
	plain := map[string]int{}
	ns, err := network.NewNetNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Release)
	ns2, err := network.NewNetNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns2.Release)
	for _, n := range []string{"tcp_max_tw_buckets", "tcp_max_syn_backlog"} {
		plain[n] = hostDefault(t, n)
	}
	for _, p := range []string{ns.Path, ns2.Path} {
		inNetNS(t, p, func() {
			if got := sysctl(t, "tcp_ehash_entries"); got != network.ChildEhashEntries {
				t.Errorf("tcp_ehash_entries = %d, want %d (its own table)", got, network.ChildEhashEntries)
			}
			if got := sysctl(t, "tcp_child_ehash_entries"); got != hostChild {
				t.Errorf("tcp_child_ehash_entries = %d in the new namespace, want the host's %d", got, hostChild)
			}
			for n, want := range plain {
				if got := sysctl(t, n); got != want {
					t.Errorf("%s = %d, want %d (a namespace sharing the host's table)", n, got, want)
				}
			}
		})
	}
	if got := sysctl(t, "tcp_child_ehash_entries"); got != hostChild {
		t.Errorf("host tcp_child_ehash_entries = %d, was %d", got, hostChild)
	}
}

// hostDefault reads sysctl name in a namespace made from the host's (unshare in a thread
// of its own) rather than in the host's, whose limits an operator may have changed.
func hostDefault(t *testing.T, name string) int {
	t.Helper()
	var v int
	done := make(chan struct{})
	go func() {
		defer close(done)
		lockAndUnshareNet(t)
		v = sysctl(t, name)
	}()
	<-done
	return v
}

// lockAndUnshareNet moves the calling goroutine's thread into a new namespace for good:
// the thread exits with the goroutine (never unlocked).
func lockAndUnshareNet(t *testing.T) {
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		t.Error(err)
	}
}
