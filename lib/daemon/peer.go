package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"slices"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DefaultGroup is the group whose members may use the daemon besides root, when it
// exists on the host (`groupadd --system lazyfork; usermod -aG lazyfork USER`). Anyone
// who can use the daemon can run code as root in containers: membership is root access.
const DefaultGroup = "lazyfork"

// Peer is who is on the other end of a connection, as the kernel saw it at connect()
// (SO_PEERCRED, SO_PEERGROUPS): it cannot be forged by the client.
type Peer struct {
	Pid    int32
	Uid    uint32
	Gid    uint32
	Groups []uint32 // supplementary groups
}

type peerKey struct{}

type peerResult struct {
	p   *Peer
	err error
}

// withPeer is the http.Server's ConnContext: the credentials are read once per connection.
func withPeer(ctx context.Context, c net.Conn) context.Context {
	p, err := PeerOf(c)
	return context.WithValue(ctx, peerKey{}, peerResult{p, err})
}

func peerFrom(ctx context.Context) (*Peer, error) {
	r, ok := ctx.Value(peerKey{}).(peerResult)
	if !ok {
		return nil, errors.New("no peer credentials on this connection")
	}
	return r.p, r.err
}

// PeerOf reads the credentials of the process at the other end of a unix socket.
func PeerOf(c net.Conn) (*Peer, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("peer credentials: %T is not a unix socket", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	var (
		p    Peer
		cerr error
	)
	err = raw.Control(func(fd uintptr) {
		cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil {
			cerr = fmt.Errorf("SO_PEERCRED: %w", err)
			return
		}
		p.Pid, p.Uid, p.Gid = cred.Pid, cred.Uid, cred.Gid
		p.Groups, cerr = peerGroups(int(fd))
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	return &p, nil
}

// peerGroups reads SO_PEERGROUPS (Linux 4.13+), growing the buffer when the kernel asks.
func peerGroups(fd int) ([]uint32, error) {
	n := 64
	for range 4 {
		buf := make([]uint32, n)
		l := uint32(n * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&l)), 0)
		switch errno {
		case 0:
			return buf[:l/4], nil
		case unix.ERANGE:
			n = int(l/4) + 1
		default:
			return nil, fmt.Errorf("SO_PEERGROUPS: %w", errno)
		}
	}
	return nil, errors.New("SO_PEERGROUPS: group list keeps growing")
}

// access decides who may use the daemon: root, and members of one group.
type access struct {
	group string // name, for messages
	gid   uint32
	ok    bool // the group exists
}

// lookupAccess resolves the allowed group; a group that does not exist allows root only.
func lookupAccess(name string) (access, error) {
	if name == "" {
		return access{}, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		var unknown user.UnknownGroupError
		if errors.As(err, &unknown) {
			return access{group: name}, nil
		}
		return access{}, fmt.Errorf("look up group %s: %w", name, err)
	}
	gid, err := strconv.ParseUint(g.Gid, 10, 32)
	if err != nil {
		return access{}, fmt.Errorf("group %s: bad gid %q", name, g.Gid)
	}
	return access{group: name, gid: uint32(gid), ok: true}, nil
}

func (a access) allows(p *Peer) bool {
	if p.Uid == 0 {
		return true
	}
	return a.ok && (p.Gid == a.gid || slices.Contains(p.Groups, a.gid))
}

func (a access) describe() string {
	switch {
	case a.ok:
		return fmt.Sprintf("root and members of group %s (gid %d)", a.group, a.gid)
	case a.group != "":
		return fmt.Sprintf("root only (group %s does not exist)", a.group)
	}
	return "root only"
}

// openSocketTo gives the group access to the socket (0660, group-owned) and, when the
// daemon made the socket's directory itself, lets the group through it (0710). A
// directory that existed before keeps the mode its owner gave it.
func (a access) openSocketTo(socket string, madeDir bool) error {
	if !a.ok {
		return nil
	}
	if err := os.Lchown(socket, 0, int(a.gid)); err != nil {
		return fmt.Errorf("give group %s the socket: %w", a.group, err)
	}
	if err := os.Chmod(socket, 0o660); err != nil {
		return fmt.Errorf("give group %s the socket: %w", a.group, err)
	}
	if madeDir {
		dir := socketDir(socket)
		if err := os.Lchown(dir, 0, int(a.gid)); err != nil {
			return fmt.Errorf("give group %s the socket directory: %w", a.group, err)
		}
		if err := os.Chmod(dir, 0o710); err != nil {
			return fmt.Errorf("give group %s the socket directory: %w", a.group, err)
		}
	}
	return nil
}
