package network

import (
	"errors"
	"fmt"
	"net/netip"
)

// ErrExhausted is returned when a subnet has no free address.
var ErrExhausted = errors.New("no free address")

// Allocator hands out the addresses of one subnet that no container record holds. The
// caller builds it under the store lock from every record and keeps the lock until the
// new records are written: the records are the allocation, so a crash can neither lose
// an address nor give one out twice.
type Allocator struct {
	subnet netip.Prefix
	used   map[netip.Addr]bool
	next   netip.Addr
}

// NewAllocator starts an allocator for subnet; inUse are the addresses records hold
// ("10.88.0.5/16" or bare addresses; others, and those outside subnet, are ignored).
func NewAllocator(subnet netip.Prefix, inUse []string) *Allocator {
	a := &Allocator{subnet: subnet, used: map[netip.Addr]bool{}, next: Gateway(subnet).Next()}
	for _, s := range inUse {
		if p, err := netip.ParsePrefix(s); err == nil {
			a.used[p.Addr()] = true
		} else if ip, err := netip.ParseAddr(s); err == nil {
			a.used[ip] = true
		}
	}
	return a
}

// Next returns a free address with the subnet's prefix length ("10.88.0.2/16"), the
// lowest one above the last handed out.
func (a *Allocator) Next() (string, error) {
	for ip := a.next; a.subnet.Contains(ip); ip = ip.Next() {
		if a.used[ip] || isBroadcast(a.subnet, ip) {
			continue
		}
		a.used[ip] = true
		a.next = ip.Next()
		return netip.PrefixFrom(ip, a.subnet.Bits()).String(), nil
	}
	return "", fmt.Errorf("%w in %s (%d containers hold its addresses): delete some bridge-mode containers or set LAZYFORK_SUBNET to a larger network", ErrExhausted, a.subnet, len(a.used))
}

func isBroadcast(p netip.Prefix, ip netip.Addr) bool {
	b := ip.As4()
	bits := p.Bits()
	for i := 0; i < 4; i++ {
		for j := 7; j >= 0; j-- {
			if i*8+(7-j) < bits {
				continue
			}
			if b[i]&(1<<j) == 0 {
				return false
			}
		}
	}
	return true
}
