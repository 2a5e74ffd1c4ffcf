package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// soccrMark is the mark CRIU's libsoccr puts on the packets it forges while it restores
// half-closed connections (SOCCR_MARK in soccr/soccr.h): they must pass a lock.
const soccrMark = 0xC114

// tcpLockTable is the table LockTCP makes in a namespace.
const tcpLockTable = "lazyfork-tcp-lock"

// LockTCP drops every TCP packet in the network namespace at nsPath but CRIU's own, until
// the returned unlock runs; dropped packets are sent again afterwards, by TCP itself.
// What CRIU's --network-lock does, which LazyFork cannot use: on a dump from inside the
// namespace CRIU locks each connection as it reaches its socket, and on a restore into a
// namespace it did not make it locks nothing (it expects the dump's lock to be still
// there, as on a migration). Both windows need it:
//   - dump: frozen tasks send nothing, but their kernel goes on sending queued data when
//     the peer's window opens; data that reaches a socket after CRIU read its queues,
//     and is acknowledged to a peer not yet saved, is in neither image, and the restored
//     pair waits for it forever.
//   - restore: connections come back one socket at a time; a socket taken out of repair
//     mode to send its unsent data probes a peer not restored yet, and the namespace
//     answers with a reset ("Can't restore not-sent send queue data ... Broken pipe").
func LockTCP(nsPath string) (unlock func() error, err error) {
	ns, err := os.Open(nsPath)
	if err != nil {
		return nil, fmt.Errorf("lock tcp: %w", err)
	}
	defer ns.Close()
	// Lasting: its socket is opened in the namespace now, while ns is open.
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())), nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("lock tcp in %s: %w", nsPath, err)
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: tcpLockTable})
	mark := make([]byte, 4)
	binary.NativeEndian.PutUint32(mark, soccrMark)
	for name, hook := range map[string]*nftables.ChainHook{"input": nftables.ChainHookInput, "output": nftables.ChainHookOutput} {
		ch := c.AddChain(&nftables.Chain{Name: name, Table: t, Type: nftables.ChainTypeFilter, Hooknum: hook, Priority: nftables.ChainPriorityFilter})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: mark},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}})
	}
	if err := c.Flush(); err != nil {
		_ = c.CloseLasting()
		return nil, fmt.Errorf("lock tcp in %s: %w", nsPath, err)
	}
	return func() error {
		defer c.CloseLasting()
		c.DelTable(t)
		// Gone already: a namespace CRIU restores gets its dumped ruleset back.
		if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unlock tcp in %s: %w", nsPath, err)
		}
		return nil
	}, nil
}

// UnlockTCP removes LockTCP's table from the namespace at nsPath if it is there: a
// namespace CRIU restores gets back the ruleset it had when it was dumped, lock included.
func UnlockTCP(nsPath string) error {
	ns, err := os.Open(nsPath)
	if err != nil {
		return fmt.Errorf("unlock tcp: %w", err)
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())), nftables.AsLasting())
	if err != nil {
		return fmt.Errorf("unlock tcp in %s: %w", nsPath, err)
	}
	defer c.CloseLasting()
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: tcpLockTable})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unlock tcp in %s: %w", nsPath, err)
	}
	return nil
}

// TCPLock holds at most one LockTCP at a time and lets it go once: a dump or restore
// locks at one CRIU notification, unlocks at a later one, and unlocks on every way out.
type TCPLock struct{ unlock func() error }

// Lock locks nsPath's TCP unless this holder already holds a lock.
func (l *TCPLock) Lock(nsPath string) error {
	if l.unlock != nil {
		return nil
	}
	u, err := LockTCP(nsPath)
	if err != nil {
		return err
	}
	l.unlock = u
	return nil
}

// Held reports whether a lock is held.
func (l *TCPLock) Held() bool { return l.unlock != nil }

// Unlock releases the lock held, if any; a second call does nothing.
func (l *TCPLock) Unlock() error {
	if l.unlock == nil {
		return nil
	}
	u := l.unlock
	l.unlock = nil
	return u()
}
