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

// tcpLockTable is the table LockTCP makes in a namespace (nothing else is ever there: the
// namespace is new and the restore has not started).
const tcpLockTable = "lazyfork-restore-lock"

// LockTCP drops every TCP packet in the network namespace at nsPath but CRIU's own, until
// the returned unlock runs. A restore into a namespace CRIU did not make gets no lock of
// CRIU's (it expects the dump's to be still there, as on a migration), and it brings the
// connections back one socket at a time: a socket taken out of repair mode to send its
// unsent data probes its peer, which is not restored yet, and the namespace answers with a
// reset ("Can't restore not-sent send queue data ... Broken pipe"). Dropped packets are
// sent again once the lock is gone, by TCP itself.
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
