package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/nsthread"
)

// Attachment is what Attach gives a network namespace.
type Attachment struct {
	Bridge string // host bridge
	Addr   string // the container's address with the subnet's prefix, "10.88.0.2/16"
	// ParentAddr, for a fork, is the address of the container it was forked from: sockets
	// the fork inherits bound to it are parked, then closed (see CloseInherited).
	ParentAddr string
	// DefaultRoute routes everything beyond the subnet through the bridge (--nat).
	DefaultRoute bool
}

// Attach gives the network namespace of pid (a container's init, still waiting to exec,
// or the root of a restore before its sockets are restored) its network: loopback up, a
// veth pair with the host end lfv<id> on the bridge (made if missing) and "eth0" inside
// holding a.Addr, and with a.DefaultRoute a default route through the bridge. A host end left by an earlier
// namespace of the same container (a swapped source) is replaced. On failure nothing of
// it remains.
func Attach(pid int, id string, a Attachment) (retErr error) {
	addr, err := netip.ParsePrefix(a.Addr)
	if err != nil || !addr.Addr().Is4() {
		return fmt.Errorf("attach %s: bad address %q", id, a.Addr)
	}
	br, err := EnsureBridge(a.Bridge, addr.Masked())
	if err != nil {
		return fmt.Errorf("attach %s: %w", id, err)
	}
	nsf, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return fmt.Errorf("attach %s: %w", id, err)
	}
	defer nsf.Close()
	if err := Detach(id); err != nil {
		return fmt.Errorf("attach %s: %w", id, err)
	}
	host := HostLink(id)
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: host, MasterIndex: br.Attrs().Index, MTU: br.Attrs().MTU},
		PeerName:         ContainerLink,
		PeerNamespace:    netlink.NsFd(int(nsf.Fd())),
		PeerHardwareAddr: MAC(addr.Addr()),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("attach %s: create veth %s: %w", id, host, err)
	}
	defer func() {
		if retErr != nil {
			_ = Detach(id)
		}
	}()
	err = inNetNS(nsf, func(h *netlink.Handle) error {
		if err := linkUp(h, "lo"); err != nil {
			return err
		}
		eth, err := h.LinkByName(ContainerLink)
		if err != nil {
			return err
		}
		if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(addr)}); err != nil {
			return fmt.Errorf("add address %s: %w", addr, err)
		}
		if err := h.LinkSetUp(eth); err != nil {
			return err
		}
		if a.ParentAddr != "" && a.ParentAddr != a.Addr {
			if err := parkParentAddr(h, a.ParentAddr); err != nil {
				return err
			}
		}
		if !a.DefaultRoute {
			// Without NAT nothing beyond the subnet would answer: with no route there, a
			// lookup (DNS) fails at once instead of waiting for its timeout.
			return nil
		}
		gw := Gateway(addr.Masked())
		return h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(gw.AsSlice()), Scope: netlink.SCOPE_UNIVERSE})
	})
	if err != nil {
		return fmt.Errorf("attach %s: inside its namespace: %w", id, err)
	}
	hl, err := netlink.LinkByName(host)
	if err == nil {
		err = netlink.LinkSetUp(hl)
	}
	if err != nil {
		return fmt.Errorf("attach %s: bring %s up: %w", id, host, err)
	}
	return nil
}

// LoopbackUp brings up lo in the network namespace of pid (a restore's new, empty one).
func LoopbackUp(pid int) error {
	nsf, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return err
	}
	defer nsf.Close()
	if err := inNetNS(nsf, func(h *netlink.Handle) error { return linkUp(h, "lo") }); err != nil {
		return fmt.Errorf("loopback up in %d's namespace: %w", pid, err)
	}
	return nil
}

// Detach removes the host end of id's veth pair (the kernel removes the other end with
// it). Nothing there is fine: a namespace whose last process ended took the pair along.
func Detach(id string) error {
	if !idRe.MatchString(id) {
		return nil // no veth of LazyFork's is named after anything but a container id
	}
	l, err := netlink.LinkByName(HostLink(id))
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("look up %s: %w", HostLink(id), err)
	}
	if l.Type() != "veth" {
		return fmt.Errorf("%s is a %s, not LazyFork's veth: leaving it", HostLink(id), l.Type())
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s: %w", HostLink(id), err)
	}
	return nil
}

var idRe = regexp.MustCompile(`^[0-9a-f]{12}$`)

// MAC is the container end's hardware address, derived from its IPv4 address (locally
// administered, 02:4c:a.b.c.d): an address handed out again after a delete comes with
// the same MAC, so no neighbour cache on the bridge holds a stale one.
func MAC(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x02, 0x4c, b[0], b[1], b[2], b[3]}
}

// EnsureBridge returns the bridge, creating it with the subnet's gateway address if
// missing. An existing bridge must carry exactly that gateway: one bridge, one subnet.
func EnsureBridge(name string, subnet netip.Prefix) (netlink.Link, error) {
	if err := CheckBridge(name); err != nil {
		return nil, err
	}
	gw := netip.PrefixFrom(Gateway(subnet), subnet.Bits())
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return nil, fmt.Errorf("look up bridge %s: %w", name, err)
		}
		if err := checkNoOverlap(subnet, name); err != nil {
			return nil, err
		}
		// Another create may make it at the same moment: EEXIST is that.
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create bridge %s: %w", name, err)
		}
		if l, err = netlink.LinkByName(name); err != nil {
			return nil, fmt.Errorf("create bridge %s: %w", name, err)
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(gw)}); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("bridge %s: add %s: %w", name, gw, err)
		}
	}
	if l.Type() != "bridge" {
		return nil, fmt.Errorf("%w: %s is a %s, not a bridge: set LAZYFORK_BRIDGE to another name", ErrBadConfig, name, l.Type())
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", name, err)
	}
	for _, a := range addrs {
		have, _ := netip.AddrFromSlice(a.IP.To4())
		ones, _ := a.Mask.Size()
		if netip.PrefixFrom(have, ones) != gw {
			return nil, fmt.Errorf("%w: bridge %s has %s/%d, not %s (subnet %s): delete its bridge-mode containers first, or set LAZYFORK_SUBNET back, or LAZYFORK_BRIDGE to another name", ErrBadConfig, name, have, ones, gw, subnet)
		}
	}
	if len(addrs) == 0 {
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(gw)}); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("bridge %s: add %s: %w", name, gw, err)
		}
	}
	if err := GuardBridge(name); err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("bridge %s: up: %w", name, err)
	}
	return l, nil
}

// RemoveBridge deletes the bridge (its subnet route goes with it). The caller checks,
// under the store lock, that no record uses it.
func RemoveBridge(name string) error {
	if err := CheckBridge(name); err != nil {
		return err
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return UnguardBridge(name)
		}
		return fmt.Errorf("look up bridge %s: %w", name, err)
	}
	if l.Type() != "bridge" {
		return nil
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete bridge %s: %w", name, err)
	}
	return UnguardBridge(name)
}

// checkNoOverlap refuses a subnet that overlaps a route of the host's own (other than
// the default route): the host would lose the way to that network.
func checkNoOverlap(subnet netip.Prefix, bridge string) error {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ip, _ := netip.AddrFromSlice(r.Dst.IP.To4())
		ones, _ := r.Dst.Mask.Size()
		dst := netip.PrefixFrom(ip, ones)
		if ones == 0 || !dst.Overlaps(subnet) {
			continue
		}
		name := "?"
		if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
			name = l.Attrs().Name
		}
		if name == bridge {
			continue
		}
		return fmt.Errorf("%w: subnet %s overlaps the host's route to %s on %s: set LAZYFORK_SUBNET to a network the host does not use", ErrBadConfig, subnet, dst, name)
	}
	return nil
}

// parkedTable holds the route of a fork's parked parent address; parkLink is the device
// it leads to: an ifb, which drops whatever is sent through it unless tc redirected it
// there (a route to nowhere, unlike a blackhole route, lets TCP repair connect).
const (
	parkedTable = 0x4c46
	parkLink    = "lfpark"
)

// parkParentAddr lets a fork's copies of its parent's sockets bound to the parent's
// address be restored (the address is put on lo) while nothing sent from that address
// can leave the namespace (a rule routes it into the ifb): the parent's peers never see
// a packet, not even a reset, from its copy. CloseInherited undoes it.
func parkParentAddr(h *netlink.Handle, parent string) error {
	p, err := netip.ParsePrefix(parent)
	if err != nil {
		return fmt.Errorf("bad parent address %q", parent)
	}
	one := netip.PrefixFrom(p.Addr(), 32)
	if err := h.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: parkLink}}); err != nil {
		return fmt.Errorf("park %s: create %s: %w", one, parkLink, err)
	}
	ifb, err := h.LinkByName(parkLink)
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(ifb); err != nil {
		return err
	}
	route := &netlink.Route{Table: parkedTable, LinkIndex: ifb.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}}
	if err := h.RouteAdd(route); err != nil {
		return fmt.Errorf("park %s: route: %w", one, err)
	}
	if err := h.RuleAdd(parkRule(one)); err != nil {
		return fmt.Errorf("park %s: rule: %w", one, err)
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := h.AddrAdd(lo, &netlink.Addr{IPNet: ipNet(one), Scope: unix.RT_SCOPE_HOST}); err != nil {
		return fmt.Errorf("park %s on lo: %w", one, err)
	}
	return nil
}

func parkRule(one netip.Prefix) *netlink.Rule {
	rule := netlink.NewRule()
	rule.Family = unix.AF_INET
	rule.Src = ipNet(one)
	rule.Table = parkedTable
	rule.Priority = 100
	return rule
}

// CloseInherited aborts, in the namespace of a fork's restored root pid, every TCP socket
// bound to its parent's address (connections to peers outside the parent, and listeners
// on that address only), then undoes parkParentAddr. The fork's processes see
// them reset (ECONNABORTED); the parent keeps its own. Loopback connections and
// listeners on 0.0.0.0 are untouched.
func CloseInherited(pid int, parent string) error {
	return CloseInheritedIn(fmt.Sprintf("/proc/%d/ns/net", pid), parent)
}

// CloseInheritedIn is CloseInherited in the namespace at path (a cluster fork's, once
// every member is restored into it: each may hold sockets bound to the parent address).
func CloseInheritedIn(path, parent string) error {
	p, err := netip.ParsePrefix(parent)
	if err != nil {
		return fmt.Errorf("bad parent address %q", parent)
	}
	nsf, err := os.Open(path)
	if err != nil {
		return err
	}
	defer nsf.Close()
	return inNetNS(nsf, func(h *netlink.Handle) error {
		socks, err := h.SocketDiagTCP(unix.AF_INET)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return fmt.Errorf("list sockets: %w", err)
		}
		var errs []error
		for _, s := range socks {
			src, _ := netip.AddrFromSlice(s.ID.Source.To4())
			if src != p.Addr() {
				continue
			}
			local := &net.TCPAddr{IP: s.ID.Source, Port: int(s.ID.SourcePort)}
			remote := &net.TCPAddr{IP: s.ID.Destination, Port: int(s.ID.DestinationPort)}
			if err := h.SocketDestroy(local, remote); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("close %s->%s: %w", local, remote, err))
			}
		}
		// Unparked, what may still be bound to the address can send nothing at all (the
		// kernel refuses a source address the namespace does not have).
		one := netip.PrefixFrom(p.Addr(), 32)
		lo, err := h.LinkByName("lo")
		if err == nil {
			err = h.AddrDel(lo, &netlink.Addr{IPNet: ipNet(one)})
		}
		if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			errs = append(errs, fmt.Errorf("unpark %s: %w", p.Addr(), err))
		}
		if err := h.RuleDel(parkRule(one)); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unpark %s: rule: %w", p.Addr(), err))
		}
		if ifb, err := h.LinkByName(parkLink); err == nil {
			if err := h.LinkDel(ifb); err != nil {
				errs = append(errs, fmt.Errorf("unpark %s: delete %s: %w", p.Addr(), parkLink, err))
			}
		}
		return errors.Join(errs...)
	})
}

// inNetNS runs f with a netlink handle whose sockets live in the namespace ns, on an OS
// thread that joined it; the thread is thrown away afterwards (it keeps the namespace).
func inNetNS(ns *os.File, f func(*netlink.Handle) error) error {
	return nsthread.Run(ns, unix.CLONE_NEWNET, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE, unix.NETLINK_INET_DIAG)
		if err != nil {
			return err
		}
		defer h.Close()
		return f(h)
	})
}

func linkUp(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return err
	}
	return h.LinkSetUp(l)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
