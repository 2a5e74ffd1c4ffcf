package container

import (
	"fmt"
	"net/netip"
	"os"

	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/store"
)

// AddressAllocator returns a step that gives each container reserved in one ReserveN an
// address of subnet. It must be called from ReserveN's fill (under the store lock): it
// reads every record once, on first use, and the addresses it hands out are taken once
// the reserved records are written, before the lock is released.
func (r *Runtime) AddressAllocator(subnet netip.Prefix) func() (string, error) {
	var a *network.Allocator
	return func() (string, error) {
		if a == nil {
			all, err := r.Containers.List()
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
// more, the bridge and its NAT rules. A cluster's veth and NAT rules are its leader's
// and belong to the namespace: they go with the cluster's last record, whichever that is
// (members outlive a deleted leader in its namespace).
func (r *Runtime) releaseNetwork(c *store.Container) error {
	owner := c.ID
	if c.Cluster != "" {
		owner = c.Cluster
		all, err := r.Containers.List()
		if err != nil {
			return err
		}
		for _, o := range all {
			if o.Cluster == c.Cluster && o.ID != c.ID {
				return nil
			}
		}
	}
	if err := network.Detach(owner); err != nil {
		return err
	}
	if c.Bridge == "" {
		return nil
	}
	if err := network.RemoveNAT(owner); err != nil {
		return err
	}
	// Under the lock that reservations take: a create that reserves after this check
	// makes the bridge again (it attaches only after reserving).
	unlock, err := r.Containers.Lock()
	if err != nil {
		return err
	}
	defer unlock()
	all, err := r.Containers.List()
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
func attachment(c *store.Container, parent string) network.Attachment {
	return network.Attachment{Bridge: c.Bridge, Addr: c.Addr, ParentAddr: parent, DefaultRoute: c.NAT}
}

// AttachNetwork prepares the network namespace of pid for c (bridge mode; nothing for the
// others): see network.Attach. parent is the address of the container c is a fork of,
// whose sockets c inherits ("" when c is that container itself).
func AttachNetwork(pid int, c *store.Container, parent string) error {
	if c.Net != NetBridge || IsMember(c) {
		return nil // a member's namespace is its leader's, attached with the leader
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

// IsMember says c shares its namespace with a cluster leader other than itself.
func IsMember(c *store.Container) bool { return c.Cluster != "" && c.Cluster != c.ID }

// joinable checks that ref can take a new cluster member (running, --net none or bridge,
// its own namespace) and opens its network namespace. net is the new member's mode: ""
// (or the leader's) takes the cluster's; a member has no address of its own, it shares
// the leader's.
func (r *Runtime) joinable(ref, net string, nat bool) (*store.Container, *os.File, error) {
	l, err := r.Containers.Resolve(ref)
	if err != nil {
		return nil, nil, fmt.Errorf("--join %s: %w", ref, err)
	}
	if IsMember(l) {
		// A member: the cluster is its leader's.
		if l, err = r.Containers.Get(l.Cluster); err != nil {
			return nil, nil, fmt.Errorf("--join %s: its cluster's leader: %w", ref, err)
		}
	}
	if l.Net != NetNone && l.Net != NetBridge {
		return nil, nil, fmt.Errorf("--join %s: it is --net %s; clusters share a --net none or --net bridge namespace", ref, l.Net)
	}
	if net != "" && net != l.Net {
		return nil, nil, fmt.Errorf("--join %s: the cluster is --net %s and the new member --net %s: leave --net out (a member takes the cluster's network)", ref, l.Net, net)
	}
	if nat {
		return nil, nil, fmt.Errorf("--join %s: --nat is the cluster's, set on its first container (%s); leave it out", ref, l.Display())
	}
	if st := r.State(l); st != store.StateRunning {
		return nil, nil, fmt.Errorf("--join %s: it is %s; a cluster grows around a running container", ref, st)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", l.Pid))
	if err != nil {
		return nil, nil, fmt.Errorf("--join %s: %w", ref, err)
	}
	// The namespace opened must still be that container's (its pid was not reused).
	if !Alive(l) {
		f.Close()
		return nil, nil, fmt.Errorf("--join %s: it exited", ref)
	}
	if l.Cluster == "" {
		l.Cluster = l.ID // the leader names itself once it has members
		if err := r.Containers.Put(l); err != nil {
			f.Close()
			return nil, nil, err
		}
	}
	return l, f, nil
}

// Members returns the cluster c belongs to, leader first, in creation order (c alone when
// it is in none).
func (r *Runtime) Members(c *store.Container) ([]*store.Container, error) {
	if c.Cluster == "" {
		return []*store.Container{c}, nil
	}
	all, err := r.Containers.List()
	if err != nil {
		return nil, err
	}
	var out []*store.Container
	for _, o := range all {
		if o.Cluster == c.Cluster {
			if o.ID == c.Cluster {
				out = append([]*store.Container{o}, out...)
			} else {
				out = append(out, o)
			}
		}
	}
	if len(out) == 0 || out[0].ID != c.Cluster {
		return nil, fmt.Errorf("cluster %s: its leader's record is gone", c.Cluster)
	}
	return out, nil
}
