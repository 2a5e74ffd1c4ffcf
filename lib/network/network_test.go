package network

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestAllocatorSkipsHeldGatewayAndBroadcast(t *testing.T) {
	p := netip.MustParsePrefix("10.9.0.0/29") // .1 gateway, .7 broadcast: .2-.6 for containers
	a := NewAllocator(p, []string{"10.9.0.3/29", "10.9.0.5", "192.168.1.2/24", "garbage"})
	var got []string
	for {
		s, err := a.Next()
		if err != nil {
			if !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "LAZYFORK_SUBNET") {
				t.Fatalf("exhaustion error: %v", err)
			}
			break
		}
		got = append(got, s)
	}
	if strings.Join(got, " ") != "10.9.0.2/29 10.9.0.4/29 10.9.0.6/29" {
		t.Fatalf("handed out %v", got)
	}
}

func TestAllocatorNeverRepeats(t *testing.T) {
	a := NewAllocator(netip.MustParsePrefix("10.9.0.0/24"), nil)
	seen := map[string]bool{}
	for i := 0; i < 253; i++ {
		s, err := a.Next()
		if err != nil {
			t.Fatalf("after %d: %v", i, err)
		}
		if seen[s] || s == "10.9.0.1/24" || s == "10.9.0.255/24" {
			t.Fatalf("bad address %s", s)
		}
		seen[s] = true
	}
	if _, err := a.Next(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("254th: %v", err)
	}
}

func TestSettings(t *testing.T) {
	for _, c := range []struct{ subnet, want string }{
		{"10.88.0.0/16", ""},
		{"10.88.0.1/16", "use 10.88.0.0/16"},
		{"10.88.0.0", "CIDR"},
		{"fd00::/64", "IPv4"},
		{"10.0.0.0/30", "/8 to /29"},
		{"10.0.0.0/7", "/8 to /29"},
		{"127.0.0.0/8", "reserved"},
		{"169.254.0.0/16", "reserved"},
	} {
		_, err := ParseSubnet(c.subnet)
		if (c.want == "") != (err == nil) || (err != nil && (!strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrBadConfig))) {
			t.Errorf("%s: %v", c.subnet, err)
		}
	}
	for name, ok := range map[string]bool{"lfbr0": true, "lfbrtest12345": true, "lfbr012345678901": false, "eth0": false, "lfv0123456789ab": false, "lfbr-x": false, "": false} {
		if (CheckBridge(name) == nil) != ok {
			t.Errorf("bridge %q: %v", name, CheckBridge(name))
		}
	}
	if g := Gateway(netip.MustParsePrefix("10.88.0.0/16")); g.String() != "10.88.0.1" {
		t.Errorf("gateway %s", g)
	}
	if m := MAC(netip.MustParseAddr("10.88.1.2")).String(); m != "02:4c:0a:58:01:02" {
		t.Errorf("mac %s", m)
	}
	if HostLink("0123456789ab") != "lfv0123456789ab" || len(HostLink("0123456789ab")) > 15 {
		t.Errorf("host link %q", HostLink("0123456789ab"))
	}
	// The environment is the mains' to read (kong env tags), never this package's.
	t.Setenv("LAZYFORK_BRIDGE", "lfbrenv")
	if c := (Config{}).WithDefaults(); c.Bridge != DefaultBridge || c.Subnet != DefaultSubnet {
		t.Errorf("defaults %+v", c)
	}
	if c := (Config{Bridge: "lfbrx"}).WithDefaults(); c.Bridge != "lfbrx" || c.Subnet != DefaultSubnet {
		t.Errorf("explicit bridge %+v", c)
	}
}
