package network

import (
	"fmt"
	"os"
	goruntime "runtime"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NetNS is a new network namespace with loopback up, held by an OS thread of this process
// until Release (no mount, nothing to clean up after a crash: the namespace dies with the
// thread once no process is in it).
type NetNS struct {
	Path    string // /proc/<pid>/task/<tid>/ns/net: open it, or join it, while held
	release chan struct{}
	done    chan struct{}
}

// NewNetNS makes the namespace.
func NewNetNS() (*NetNS, error) {
	n := &NetNS{release: make(chan struct{}), done: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		defer close(n.done)
		goruntime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("new network namespace: %w", err)
			return
		}
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			errc <- err
			return
		}
		err = linkUp(h, "lo")
		h.Close()
		if err != nil {
			errc <- fmt.Errorf("new network namespace: loopback up: %w", err)
			return
		}
		n.Path = fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		errc <- nil
		<-n.release
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	return n, nil
}

// Release lets the holding thread go.
func (n *NetNS) Release() {
	select {
	case <-n.release:
	default:
		close(n.release)
	}
	<-n.done
}

const holdTable = "lazyfork_hold"

// HoldTraffic drops every packet sent inside the namespace at path until the returned
// release runs: the members of a cluster are restored one after the other, and the first
// ones back must not reset their connections to members not restored yet (a dropped
// segment is retransmitted; a segment to a closed port would be answered with a reset).
func HoldTraffic(path string) (release func() error, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("hold traffic: %w", err)
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: holdTable})
	drop := nftables.ChainPolicyDrop
	c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	if err := c.Flush(); err != nil {
		f.Close()
		return nil, fmt.Errorf("hold traffic: %w", err)
	}
	return func() error {
		defer f.Close()
		c.DelTable(t)
		if err := c.Flush(); err != nil {
			return fmt.Errorf("release traffic: %w", err)
		}
		return nil
	}, nil
}
