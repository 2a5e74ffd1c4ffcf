package network

import (
	"fmt"
	"os"
	goruntime "runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// ChildEhashEntries sizes the TCP established hash table of every namespace NewNetNS
// makes. Without one of its own (net.ipv4.tcp_child_ehash_entries 0 where the namespace is
// made) a namespace shares the host's, 262,144 buckets on a 24 GB host, and every
// sock_diag dump of its TCP sockets walks all of them: CRIU dumps TCP sockets twice
// (IPv4, IPv6) while the tree is frozen, 1-6 ms each on a 2-core host against 0.6-1.9 ms
// with a table of its own (bench/README.md, issue 14). 4096 buckets hold 32 KB per
// namespace; the time-wait and SYN backlog limits the kernel derives from the table's size
// are set back to the host's defaults (copyTCPLimits).
const ChildEhashEntries = 4096

// The nursery is a network namespace of this process's own, kept by an open descriptor,
// whose tcp_child_ehash_entries is ChildEhashEntries: the kernel sizes a new namespace's
// table from the sysctl of the namespace its maker is in, so NewNetNS's thread joins the
// nursery before it unshares. The host's sysctl stays as it is.
var nursery struct {
	once   sync.Once
	fd     int // -1: none (an older kernel without the sysctl): namespaces share the host's table
	limits []tcpLimit
}

// tcpLimit is a sysctl the kernel computes from the table's size in a new namespace.
type tcpLimit struct{ name, value string }

var tcpLimitNames = []string{"tcp_max_tw_buckets", "tcp_max_syn_backlog"}

// nurseryFd makes the nursery on first use; -1 when it cannot be made.
func nurseryFd() int {
	nursery.once.Do(func() {
		nursery.fd = -1
		done := make(chan struct{})
		go func() {
			defer close(done)
			goruntime.LockOSThread() // never unlocked: the thread exits with the goroutine
			if unix.Unshare(unix.CLONE_NEWNET) != nil {
				return
			}
			// Made from the host's namespace, the nursery's own limits are the host's
			// defaults: what a namespace sharing the host's table gets.
			var limits []tcpLimit
			for _, n := range tcpLimitNames {
				b, err := os.ReadFile("/proc/sys/net/ipv4/" + n)
				if err != nil {
					return
				}
				limits = append(limits, tcpLimit{n, strings.TrimSpace(string(b))})
			}
			if os.WriteFile("/proc/sys/net/ipv4/tcp_child_ehash_entries", []byte(fmt.Sprint(ChildEhashEntries)), 0) != nil {
				return
			}
			fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return
			}
			nursery.fd, nursery.limits = fd, limits
		}()
		<-done
	})
	return nursery.fd
}

// enterNursery moves the calling, locked thread into the nursery (a no-op without one).
func enterNursery() (entered bool, err error) {
	fd := nurseryFd()
	if fd < 0 {
		return false, nil
	}
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return false, fmt.Errorf("join the namespace nursery: %w", err)
	}
	return true, nil
}

// copyTCPLimits sets, in the calling thread's new namespace, the limits the kernel
// derived from its small table back to the host's defaults: a container keeps as many
// time-wait sockets and SYN backlog as one sharing the host's table would.
func copyTCPLimits() error {
	for _, l := range nursery.limits {
		if err := os.WriteFile("/proc/sys/net/ipv4/"+l.name, []byte(l.value), 0); err != nil {
			return fmt.Errorf("set %s: %w", l.name, err)
		}
	}
	return nil
}
