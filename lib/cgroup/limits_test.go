package cgroup

import (
	"bytes"
	"io"
	"maps"
	"os"
	"os/exec"
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

// TestDeviceFilterV2: on the v2 hierarchy the device list is an eBPF program (this hybrid
// host keeps memory and pids on v1, so LazyFork's groups are v1; the v2 hierarchy can
// still hold a group with a device program and no controllers).
func TestDeviceFilterV2(t *testing.T) {
	requireRoot(t)
	_, c := v2Group(t)
	if err := c.create(nil); err != nil {
		t.Fatal(err)
	}
	cleanupGroup(t, c)
	if err := c.SetLimits(Limits{Devices: true}); err != nil {
		t.Fatal(err)
	}
	// /dev/null is on the list, /dev/kmsg (c 1:11) is not; mknod of a block device fails.
	dir := t.TempDir()
	script := "read _; cat /dev/null && echo null-ok; cat /dev/kmsg 2>/dev/null || echo kmsg-denied; mknod " + dir + "/blk b 8 0 2>/dev/null || echo mknod-denied"
	cmd := exec.Command("sh", "-c", script)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.AddProc(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal(err)
	}
	_, _ = io.WriteString(in, "\n")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if got := strings.Join(strings.Fields(out.String()), " "); got != "null-ok kmsg-denied mknod-denied" {
		t.Errorf("under the v2 device filter: %q, want null-ok kmsg-denied mknod-denied", got)
	}
}
