package network_test

import (
	"encoding/binary"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/network"
	"github.com/lazyfork/lazyfork/lib/testutil/priv"
)

// A connection made the way CRIU restores one (connect() in repair mode, then the dumped
// MSS clamp) sends IPv4's minimum 524-byte segments until ResyncTCPMSS; then it sends
// what the clamp and loopback's path allow.
func TestResyncTCPMSS(t *testing.T) {
	priv.Root(t, "TCP repair mode (CAP_NET_ADMIN), network namespaces")
	ns, err := network.NewNetNS()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Release()
	fd := -1
	inNetNS(t, ns.Path, func() {
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
			t.Fatal(err)
		}
	})
	// Closed in repair mode: no packet leaves (the namespace goes with the test anyway).
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, 1); err != nil {
		t.Fatal(err)
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: 9, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	opt := make([]byte, 8) // struct tcp_repair_opt: TCPOPT_MAXSEG, the dumped clamp
	binary.NativeEndian.PutUint32(opt, 2)
	binary.NativeEndian.PutUint32(opt[4:], 65483)
	if err := unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_OPTIONS, string(opt)); err != nil {
		t.Fatal(err)
	}
	if m := sndMSS(t, fd); m != 524 {
		t.Fatalf("segment size after a repair-mode connect: %d, want 524 (what CRIU's restore leaves)", m)
	}
	n, err := network.ResyncTCPMSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if m := sndMSS(t, fd); m <= 536 || n < 1 {
		t.Fatalf("after ResyncTCPMSS (%d connections): segment size %d, want the clamp's (65483 less options)", n, m)
	}
}

func sndMSS(t *testing.T, fd int) uint32 {
	t.Helper()
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		t.Fatal(err)
	}
	return info.Snd_mss
}
