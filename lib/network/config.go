// Package network gives containers their network in bridge mode: a LazyFork bridge on the
// host, one veth pair per container (host end lfv<id> on the bridge, "eth0" inside) and an
// address from the bridge's subnet, allocated from the container records so an address is
// never held twice, even after a crash. Forks get a namespace prepared the same way before
// CRIU restores into it. Everything goes through netlink; nothing is shelled out.
package network

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
)

// Defaults of the settings (LAZYFORK_BRIDGE, LAZYFORK_SUBNET).
const (
	DefaultBridge = "lfbr0"
	DefaultSubnet = "10.88.0.0/16"
)

// ErrBadConfig is wrapped by every refusal of a setting.
var ErrBadConfig = errors.New("bad network setting")

// Config is where bridge-mode containers are attached. A zero field means the default.
// The mains fill it from LAZYFORK_BRIDGE and LAZYFORK_SUBNET.
type Config struct {
	Bridge string // host bridge name: lfbr followed by up to 11 of [a-z0-9]
	Subnet string // IPv4 network in CIDR form; the bridge holds its first address
}

// WithDefaults fills empty fields from the defaults.
func (c Config) WithDefaults() Config {
	if c.Bridge == "" {
		c.Bridge = DefaultBridge
	}
	if c.Subnet == "" {
		c.Subnet = DefaultSubnet
	}
	return c
}

// Only names of this shape are ever created or deleted: a forged record or setting can
// never aim a deletion at an interface LazyFork does not own.
var bridgeRe = regexp.MustCompile(`^lfbr[a-z0-9]{0,11}$`)

// CheckBridge validates a bridge name.
func CheckBridge(name string) error {
	if !bridgeRe.MatchString(name) {
		return fmt.Errorf("%w: bridge name %q: use lfbr followed by up to 11 lower-case letters or digits (LAZYFORK_BRIDGE), e.g. %s", ErrBadConfig, name, DefaultBridge)
	}
	return nil
}

// ParseSubnet checks a subnet setting: IPv4, host bits zero, room for a gateway and at
// least two containers.
func ParseSubnet(s string) (netip.Prefix, error) {
	fix := fmt.Sprintf("set LAZYFORK_SUBNET to an IPv4 network such as %s", DefaultSubnet)
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%w: subnet %q is not in CIDR form: %s", ErrBadConfig, s, fix)
	}
	if !p.Addr().Is4() {
		return netip.Prefix{}, fmt.Errorf("%w: subnet %q is not IPv4: %s", ErrBadConfig, s, fix)
	}
	if p.Bits() < 8 || p.Bits() > 29 {
		return netip.Prefix{}, fmt.Errorf("%w: subnet %q: the prefix must be /8 to /29: %s", ErrBadConfig, s, fix)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%w: subnet %q has host bits set: use %s", ErrBadConfig, s, p.Masked())
	}
	if p.Addr().IsLoopback() || p.Addr().IsMulticast() || p.Addr().IsUnspecified() || p.Addr().IsLinkLocalUnicast() {
		return netip.Prefix{}, fmt.Errorf("%w: subnet %q is a reserved range: %s", ErrBadConfig, s, fix)
	}
	return p, nil
}

// Check validates both settings (after defaults).
func (c Config) Check() (netip.Prefix, error) {
	c = c.WithDefaults()
	if err := CheckBridge(c.Bridge); err != nil {
		return netip.Prefix{}, err
	}
	return ParseSubnet(c.Subnet)
}

// Gateway is the bridge's own address in p: its first host address.
func Gateway(p netip.Prefix) netip.Addr { return p.Masked().Addr().Next() }

// HostLink is the host end of a container's veth pair, named after its id (12 hex digits:
// 15 characters, the kernel's limit).
func HostLink(id string) string { return "lfv" + id }

// ContainerLink is the container's end of the pair.
const ContainerLink = "eth0"
