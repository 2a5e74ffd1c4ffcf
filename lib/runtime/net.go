package runtime

import (
	"fmt"
	"net/netip"

	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/tree"
)

// AddressAllocator returns a step that gives each container reserved in one ReserveN an
// address of subnet. It must be called from ReserveN's fill (under the store lock): it
// reads every record once, on first use, and the addresses it hands out are taken once
// the reserved records are written, before the lock is released.
func (r *Runtime) AddressAllocator(subnet netip.Prefix) func() (string, error) {
	var a *network.Allocator
	return func() (string, error) {
		if a == nil {
			all, err := r.Tree.List()
			if err != nil {
				return "", err
			}
			var used []string
			for _, c := range all {
				if c.Addr != "" {
					used = append(used, c.Addr)
				}
			}
			a = network.NewAllocator(subnet, used)
		}
		return a.Next()
	}
}

// releaseNetwork undoes what bridge mode made for c once its record is gone: its veth
// (usually gone with its namespace already) and, when no record uses the bridge any
// more, the bridge and its NAT rules.
func (r *Runtime) releaseNetwork(c *tree.Container) error {
	if err := network.Detach(c.ID); err != nil {
		return err
	}
	if c.Bridge == "" {
		return nil
	}
	if err := network.RemoveNAT(c.ID); err != nil {
		return err
	}
	// Under the lock that reservations take: a create that reserves after this check
	// makes the bridge again (it attaches only after reserving).
	unlock, err := r.Tree.Lock()
	if err != nil {
		return err
	}
	defer unlock()
	all, err := r.Tree.List()
	if err != nil {
		return err
	}
	for _, o := range all {
		if o.Bridge == c.Bridge && o.ID != c.ID {
			return nil
		}
	}
	return network.RemoveBridge(c.Bridge)
}

// attachment is what a container in bridge mode is given (parent: the address of the
// container it was forked from, "" for itself).
func attachment(c *tree.Container, parent string) network.Attachment {
	return network.Attachment{Bridge: c.Bridge, Addr: c.Addr, ParentAddr: parent, DefaultRoute: c.NAT}
}

// AttachNetwork prepares the network namespace of pid for c (bridge mode; nothing for the
// others): see network.Attach. parent is the address of the container c is a fork of,
// whose sockets c inherits ("" when c is that container itself).
func AttachNetwork(pid int, c *tree.Container, parent string) error {
	if c.Net != NetBridge {
		return nil
	}
	if err := network.Attach(pid, c.ID, attachment(c, parent)); err != nil {
		return err
	}
	if c.NAT {
		if err := network.AddNAT(c.ID, c.Bridge, c.Addr); err != nil {
			return fmt.Errorf("nat %s: %w", c.ID, err)
		}
	}
	return nil
}
