package criu

import (
	"context"
	"os"
	"strings"
	"testing"
)

// The CRIU that LazyFork runs must dump a process holding inet sockets on this kernel
// (CRIU 4.1 cannot on Linux >= 6.16): `lazyfork doctor` runs the same probe.
func TestProbeSocketDump(t *testing.T) {
	requirePriv(t)
	scratch := t.TempDir()
	if err := ProbeSocketDump(context.Background(), "", scratch); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(scratch); len(left) != 0 {
		t.Errorf("the probe left %d entries in its scratch dir", len(left))
	}
}

// The operator's CRIU (--criu / $LAZYFORK_CRIU, which the mains pass as the explicit
// path) wins and is named as the source; one that does not exist is named in a one-line
// error. "" is the default one.
func TestFindBinaryExplicit(t *testing.T) {
	_, err := FindBinary("/nonexistent/criu")
	if err == nil || !containsAll(err.Error(), "LAZYFORK_CRIU=/nonexistent/criu", "unset it") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("err = %v", err)
	}
	exe, _ := os.Executable()
	if b, err := FindBinary(exe); err != nil || b.Path != exe || b.Source != "LAZYFORK_CRIU" {
		t.Fatalf("FindBinary = %+v, %v", b, err)
	}
	// The environment is the mains' to read (kong env tags), never this package's.
	t.Setenv("LAZYFORK_CRIU", exe)
	if b, err := FindBinary(""); err == nil && (b.Path == exe || b.Source == "LAZYFORK_CRIU") {
		t.Fatalf("FindBinary(\"\") = %+v", b)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
