package network

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/paths"
)

// LazyFork's rules live in one nftables table of its own (ip lazyfork), made through
// netlink: every rule carries a comment naming the container (or bridge) it is for, so
// removal deletes exactly LazyFork's rules and the table goes with the last one. Each
// bridge has a rule dropping what its containers would have the host forward (they reach
// the host's bridge address and each other only); a --nat container gets a forward accept
// before it and a masquerade rule. Nothing else on the host (iptables, other tables) is
// read or changed, except net.ipv4.ip_forward, which masquerading needs and which the
// first --nat container turns on (it is left on; the drop rules keep the others in).
const (
	natTable      = "lazyfork"
	natChain      = "postrouting"
	forwardChain  = "forward"
	commentPrefix = "lazyfork "
)

func natComment(id string) string        { return commentPrefix + "nat " + id }
func bridgeComment(bridge string) string { return commentPrefix + "bridge " + bridge }

// GuardBridge makes sure the bridge's forward drop rule exists.
func GuardBridge(bridge string) error {
	if err := CheckBridge(bridge); err != nil {
		return err
	}
	return ensureRules("guard bridge "+bridge, bridgeComment(bridge), func(c *nftables.Conn, t *nftables.Table, _, fwd *nftables.Chain) {
		// Not what stays on the bridge: with br_netfilter loaded, bridged packets between
		// two containers pass the forward hook too, in and out by the bridge.
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, UserData: comment(bridgeComment(bridge)), Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(bridge)},
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(bridge)},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}})
	})
}

// AddNAT masquerades what the container id (address addr, on bridge) sends through any
// other interface of the host, and lets the host forward it (an accept placed before the
// bridge's drop rule).
func AddNAT(id, bridge, addr string) error {
	if !idRe.MatchString(id) {
		return fmt.Errorf("nat: bad container id %q", id)
	}
	if err := CheckBridge(bridge); err != nil {
		return err
	}
	p, err := netip.ParsePrefix(addr)
	if err != nil || !p.Addr().Is4() {
		return fmt.Errorf("nat %s: bad address %q", id, addr)
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("nat %s: turn on ip_forward: %w", id, err)
	}
	// A swapped or restarted source finds its rules still there.
	return ensureRules("nat "+id, natComment(id), func(c *nftables.Conn, t *nftables.Table, nat, fwd *nftables.Chain) {
		src := p.Addr().As4()
		saddr := []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: src[:]},
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: nat, UserData: comment(natComment(id)), Exprs: append(append([]expr.Any{}, saddr...),
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(bridge)},
			&expr.Masq{},
		)})
		// Accepts go first, the bridge's drop last.
		c.InsertRule(&nftables.Rule{Table: t, Chain: fwd, UserData: comment(natComment(id)), Exprs: append([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(bridge)},
		}, append(saddr, &expr.Verdict{Kind: expr.VerdictAccept})...)})
	})
}

// ensureRules runs add under the NAT lock with LazyFork's table and chains (created if
// missing), unless a rule with comment marker is there already: adding is idempotent.
func ensureRules(what, marker string, add func(c *nftables.Conn, t *nftables.Table, nat, fwd *nftables.Chain)) error {
	return locked(what, func(c *nftables.Conn) error {
		t, nat, fwd := chains(c)
		existing, err := comments(c, t)
		if err != nil || existing[marker] {
			return err
		}
		add(c, t, nat, fwd)
		if err := c.Flush(); err != nil {
			return fmt.Errorf("add rules: %w", err)
		}
		return nil
	})
}

// locked runs f on a netlink connection under the NAT lock; what names the change in
// f's error.
func locked(what string, f func(c *nftables.Conn) error) error {
	unlock, err := natLock()
	if err != nil {
		return err
	}
	defer unlock()
	c, err := nftables.New()
	if err == nil {
		defer c.CloseLasting()
		err = f(c)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// RemoveNAT deletes the rules AddNAT made for id (none is fine), and the table once
// empty.
func RemoveNAT(id string) error {
	if !idRe.MatchString(id) {
		return fmt.Errorf("nat: bad container id %q", id)
	}
	return removeRules(natComment(id))
}

// UnguardBridge deletes the bridge's drop rule (the bridge is gone), and the table once
// empty.
func UnguardBridge(bridge string) error {
	if err := CheckBridge(bridge); err != nil {
		return err
	}
	return removeRules(bridgeComment(bridge))
}

func removeRules(which string) error {
	return locked(fmt.Sprintf("remove %q rules", which), func(c *nftables.Conn) error {
		t, rules, err := ourRules(c)
		if t == nil || err != nil {
			return err
		}
		empty := true
		for _, r := range rules {
			if ruleComment(r) != which {
				empty = false
				continue
			}
			if err := c.DelRule(r); err != nil {
				return err
			}
		}
		if empty {
			c.DelTable(t)
		}
		return c.Flush()
	})
}

// NATRules lists the comments of LazyFork's NAT rules on this host ("lazyfork nat <id>",
// "lazyfork bridge <name>").
func NATRules() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	defer c.CloseLasting()
	_, rules, err := ourRules(c)
	var out []string
	for _, r := range rules {
		out = append(out, ruleComment(r))
	}
	return out, err
}

// ourRules reads LazyFork's table and its rules; a nil table when there is none.
func ourRules(c *nftables.Conn) (*nftables.Table, []*nftables.Rule, error) {
	t, err := c.ListTableOfFamily(natTable, nftables.TableFamilyIPv4)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	rules, err := tableRules(c, t)
	return t, rules, err
}

// chains queues the table and its two chains (created if missing, kept if present).
func chains(c *nftables.Conn) (*nftables.Table, *nftables.Chain, *nftables.Chain) {
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: natTable})
	nat := c.AddChain(&nftables.Chain{Name: natChain, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	accept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: forwardChain, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	return t, nat, fwd
}

// comments are those of the rules already in the table (the queued table and chains are
// sent first, so a missing table is created, then read back empty).
func comments(c *nftables.Conn, t *nftables.Table) (map[string]bool, error) {
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("create table %s: %w", natTable, err)
	}
	rules, err := tableRules(c, t)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, r := range rules {
		out[ruleComment(r)] = true
	}
	return out, nil
}

func tableRules(c *nftables.Conn, t *nftables.Table) ([]*nftables.Rule, error) {
	var out []*nftables.Rule
	for _, name := range []string{natChain, forwardChain} {
		rs, err := c.GetRules(t, &nftables.Chain{Name: name, Table: t})
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("list %s rules: %w", name, err)
		}
		for _, r := range rs {
			r.Chain = &nftables.Chain{Name: name, Table: t}
			r.Table = t
			out = append(out, r)
		}
	}
	return out, nil
}

func comment(s string) []byte { return userdata.AppendString(nil, userdata.TypeComment, s) }

func ruleComment(r *nftables.Rule) string {
	s, _ := userdata.GetString(r.UserData, userdata.TypeComment)
	return s
}

// ifname pads an interface name as the kernel compares it.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// natLock serialises rule changes across LazyFork processes (check, then add).
func natLock() (func(), error) {
	if err := os.MkdirAll(paths.Run(), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(paths.Run(), "nat.lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock nat rules: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock nat rules: %w", err)
	}
	return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
}
