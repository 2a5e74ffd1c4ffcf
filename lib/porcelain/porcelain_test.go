package porcelain

import (
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"": 0, "4096": 4096, "64k": 64 << 10, "512m": 512 << 20, "2G": 2 << 30} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v, want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"12x", "-1", "0", "m", "1.5g", "99999999999g"} {
		if _, err := ParseBytes(bad); err == nil || !strings.Contains(err.Error(), "--memory") {
			t.Errorf("ParseBytes(%q) err = %v, want a --memory error", bad, err)
		}
	}
}
