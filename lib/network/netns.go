package network

import (
	"fmt"
	"net/netip"
	"os"
	goruntime "runtime"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The functions here move a locked OS thread into another namespace and let it end with
// its goroutine, which takes the namespace change with it. Go never ends the main thread:
// one left locked is parked for good, holding that namespace alive (a cluster's, long
// after its containers were deleted). Locked to the main goroutine from init, the main
// thread never runs another goroutine. (lib/criu does the same for its swrk threads.)
func init() { goruntime.LockOSThread() }

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
		// Made from the nursery, the namespace gets a TCP hash table of its own (see
		// ChildEhashEntries).
		nursed, err := enterNursery()
		if err != nil {
			errc <- fmt.Errorf("new network namespace: %w", err)
			return
		}
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("new network namespace: %w", err)
			return
		}
		if nursed {
			if err := copyTCPLimits(); err != nil {
				errc <- fmt.Errorf("new network namespace: %w", err)
				return
			}
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
//
// Packets to the addresses in pass go through: a bridge-mode cluster fork's parked parent
// address (see parkParentAddr), to which CRIU sends the FIN that puts a restored
// half-closed connection back in its state; every socket bound to that address is
// closed before the hold is released (CloseInheritedIn).
func HoldTraffic(path string, pass ...netip.Addr) (release func() error, err error) {
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
	out := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	for _, a := range pass {
		if !a.Is4() {
			f.Close()
			return nil, fmt.Errorf("hold traffic: %s is not IPv4", a)
		}
		daddr := a.As4()
		c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: daddr[:]},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}})
	}
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
