package container_test

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/nsthread"
	"golang.org/x/sys/unix"
)

// TestNoneNetNSOwnTCPTable: a --net none container's network namespace has a TCP hash
// table of its own (made from the network nursery, not cloned from the host's), with
// loopback up, and it is not this process's.
func TestNoneNetNSOwnTCPTable(t *testing.T) {
	rt := newRuntime(t)
	c := create(t, rt, "ownnet", "sleep", "1000")
	if c.Net != container.NetNone {
		t.Fatalf("default network mode %q, want %q", c.Net, container.NetNone)
	}
	self, _ := os.Readlink("/proc/self/ns/net")
	theirs, err := os.Readlink("/proc/" + strconv.Itoa(c.Pid) + "/ns/net")
	if err != nil || theirs == self {
		t.Fatalf("the container's network namespace %q (%v) is this process's %q", theirs, err, self)
	}
	var ehash string
	var loUp bool
	err = nsthread.RunPid(c.Pid, "net", unix.CLONE_NEWNET, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_ehash_entries")
		ehash = strings.TrimSpace(string(b))
		if err != nil {
			return err
		}
		lo, err := net.InterfaceByName("lo")
		if err != nil {
			return err
		}
		loUp = lo.Flags&net.FlagUp != 0
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if ehash != strconv.Itoa(network.ChildEhashEntries) {
		t.Errorf("tcp_ehash_entries = %s in the container, want %d (a table of its own)", ehash, network.ChildEhashEntries)
	}
	if !loUp {
		t.Error("loopback is down in the container's namespace")
	}
}
