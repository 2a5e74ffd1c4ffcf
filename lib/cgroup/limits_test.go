package cgroup

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLimitsAndDeviceList: memory and pids limits land in the group's files, the device
// list replaces "a *:* rwm", and a record from before the devices hierarchy (no devices
// path) still loads.
func TestLimitsAndDeviceList(t *testing.T) {
	requireRoot(t)
	c, err := Create(testName(t), "")
	if err != nil {
		t.Fatal(err)
	}
	cleanupGroup(t, c)
	if c.V2 {
		t.Skip("this host's groups are v2; the v1 files below do not exist (the eBPF path is untested here)")
	}
	if _, ok := c.Paths["devices"]; !ok {
		t.Fatal("no devices path on a host with a v1 devices hierarchy")
	}
	if err := c.SetLimits(Limits{Memory: 64 << 20, Pids: 42, Devices: true}); err != nil {
		t.Fatal(err)
	}
	read := func(k, f string) string {
		d, _ := c.dir(k)
		b, err := os.ReadFile(filepath.Join(d, f))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if got := read("memory", "memory.limit_in_bytes"); got != "67108864" {
		t.Errorf("memory.limit_in_bytes = %s", got)
	}
	if got := read("pids", "pids.max"); got != "42" {
		t.Errorf("pids.max = %s", got)
	}
	var want []string
	for _, d := range AllowedDevices {
		want = append(want, d.rule())
	}
	if got := read("devices", "devices.list"); got != strings.Join(want, "\n") {
		t.Errorf("devices.list = %q, want %q", got, strings.Join(want, "\n"))
	}
	for _, f := range c.ProcsFiles() {
		if strings.Contains(f, "/devices/") {
			t.Errorf("ProcsFiles lists %s: criu must not join the device list", f)
		}
	}
	old := maps.Clone(c.Paths)
	delete(old, "devices")
	l, err := Load(old)
	if err != nil {
		t.Fatalf("load a record without a devices path: %v", err)
	}
	if len(l.CriuRootArgs()) != 3 {
		t.Errorf("old record's CriuRootArgs = %v, want memory, pids, freezer", l.CriuRootArgs())
	}
}
