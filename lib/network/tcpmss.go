package network

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/procfs"
)

// ResyncTCPMSS makes every IPv4 TCP connection held by the tree rooted at pid work out its
// segment size again; called once CRIU restored the tree's sockets, before they leave
// repair mode. It returns how many connections it resynced.
//
// Why: CRIU restores a connection by connect() in repair mode, when the kernel computes
// the segment size from the 536-byte default (524 with timestamps: IPv4's minimum), and
// only afterwards sets the dumped MSS clamp (TCP_REPAIR_OPTIONS), which does not compute
// it again. Every restored connection then sends 524-byte segments for good (on loopback a
// hundred times the packets, each charged to the receiver's buffer with its overhead).
// With both queues full the receiver overflowed its buffer. On Linux >= 6.17 a receiver drops in-window data that does not fit its buffer and closes
// its window to zero with the sender's last segment out beyond it; the sender's window
// updates then carry a sequence number beyond that zero window and are dropped too. Two
// programs that wait for each other (zdtm socket-tcpbuf: both queues full, a heartbeat on
// a second connection) hang for good, each retransmission backed off to two minutes.
//
// Setting the (empty) IP options again is the one socket option that makes the kernel call
// tcp_sync_mss for an established connection: the segment size becomes what the path and
// the clamp allow, as in the source. Sockets that carry IP options are left alone, and so
// are IPv6 ones (their restored size is IPv6's minimum, 1208 bytes, and nothing short of
// real extension headers recomputes it).
func ResyncTCPMSS(pid int) (int, error) {
	seen := map[string]bool{}
	n := 0
	var errs []error
	for _, p := range procfs.Descendants(pid, 100000) {
		k, err := resyncTask(p, seen)
		n += k
		if err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// resyncTask resyncs the IPv4 TCP sockets in pid's descriptor table not in seen yet.
func resyncTask(pid int, seen map[string]bool) (int, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, nil // gone, or a thread-less zombie
	}
	var pidfd = -1
	defer func() {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
	}()
	n := 0
	for _, e := range ents {
		link, err := os.Readlink(dir + e.Name())
		if err != nil || !strings.HasPrefix(link, "socket:[") || seen[link] {
			continue
		}
		seen[link] = true
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pidfd < 0 {
			if pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
				return n, fmt.Errorf("resync tcp mss of %d: %w", pid, err)
			}
		}
		ok, err := resyncSocket(pidfd, fd)
		if err != nil {
			return n, fmt.Errorf("resync tcp mss of %d fd %d: %w", pid, fd, err)
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// resyncSocket resyncs the socket at fd in pidfd's table if it is a connected IPv4 TCP
// socket without IP options.
func resyncSocket(pidfd, fd int) (bool, error) {
	s, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return false, nil // closed meanwhile
	}
	defer unix.Close(s)
	if d, err := unix.GetsockoptInt(s, unix.SOL_SOCKET, unix.SO_DOMAIN); err != nil || d != unix.AF_INET {
		return false, nil
	}
	if p, err := unix.GetsockoptInt(s, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil || p != unix.IPPROTO_TCP {
		return false, nil
	}
	info, err := unix.GetsockoptTCPInfo(s, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil || info.State == tcpListen || info.State == tcpClose {
		return false, nil
	}
	if o, err := unix.GetsockoptString(s, unix.IPPROTO_IP, unix.IP_OPTIONS); err != nil || o != "" {
		return false, nil
	}
	if err := unix.SetsockoptString(s, unix.IPPROTO_IP, unix.IP_OPTIONS, ""); err != nil {
		return false, err
	}
	return true, nil
}

// TCP states of tcp_info (include/net/tcp_states.h).
const (
	tcpClose  = 7
	tcpListen = 10
)
