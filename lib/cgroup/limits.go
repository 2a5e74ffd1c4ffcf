package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Limits are a container's resource limits and device allow-list.
type Limits struct {
	Memory int64 // bytes; 0: none
	Pids   int64 // tasks (threads); 0: none
	// Devices restricts device access to AllowedDevices (devices cgroup on v1, an eBPF
	// device filter on v2).
	Devices bool
}

// Device is one character device a confined container may use.
type Device struct {
	Major, Minor int64 // Minor -1: every minor
	Access       string
}

// AllowedDevices are the character devices a confined container may create and open:
// the nodes LazyFork puts in its /dev (null, zero, full, random, urandom, tty) plus
// ptmx and the pts range, as runc's defaults. Nothing else, not even mknod of other
// nodes (runc allows "m" for all; here mknod of a block device fails outright).
var AllowedDevices = []Device{
	{1, 3, "rwm"}, {1, 5, "rwm"}, {1, 7, "rwm"}, {1, 8, "rwm"}, {1, 9, "rwm"},
	{5, 0, "rwm"}, {5, 2, "rwm"}, {136, -1, "rwm"},
}

// SetLimits applies l to the group. On v1 the device list needs the devices hierarchy;
// a host without one gets an error naming it.
func (c *Cgroup) SetLimits(l Limits) error {
	if c.V2 {
		return c.setLimitsV2(l)
	}
	write := func(k, file, val string) error {
		dir, err := c.dir(k)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, file), []byte(val), 0); err != nil {
			return fmt.Errorf("set %s of cgroup %s to %q: %w", file, c.Name, val, err)
		}
		return nil
	}
	if l.Memory > 0 {
		if err := write("memory", "memory.limit_in_bytes", strconv.FormatInt(l.Memory, 10)); err != nil {
			return err
		}
	}
	if l.Pids > 0 {
		if err := write("pids", "pids.max", strconv.FormatInt(l.Pids, 10)); err != nil {
			return err
		}
	}
	if !l.Devices {
		return nil
	}
	if _, ok := c.Paths[v1Devices]; !ok {
		return errors.New("device allow-list: this host has no v1 devices hierarchy and LazyFork uses v1 here: mount it, or create with --privileged")
	}
	if err := write(v1Devices, "devices.deny", "a"); err != nil {
		return err
	}
	for _, d := range AllowedDevices {
		if err := write(v1Devices, "devices.allow", d.rule()); err != nil {
			return err
		}
	}
	return nil
}

func (d Device) rule() string {
	minor := "*"
	if d.Minor >= 0 {
		minor = strconv.FormatInt(d.Minor, 10)
	}
	return fmt.Sprintf("c %d:%s %s", d.Major, minor, d.Access)
}

func (c *Cgroup) setLimitsV2(l Limits) error {
	r := &cgroup2.Resources{}
	if l.Memory > 0 {
		r.Memory = &cgroup2.Memory{Max: &l.Memory}
	}
	if l.Pids > 0 {
		r.Pids = &cgroup2.Pids{Max: l.Pids}
	}
	if l.Devices {
		// containerd compiles this list into an eBPF program attached to the group: every
		// entry needs its numbers, -1 for "any"; the first entry denies everything.
		all := int64(-1)
		r.Devices = []specs.LinuxDeviceCgroup{{Allow: false, Type: "a", Major: &all, Minor: &all, Access: "rwm"}}
		for _, d := range AllowedDevices {
			maj, min := d.Major, d.Minor
			r.Devices = append(r.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &maj, Minor: &min, Access: d.Access})
		}
	}
	if err := c.v2.Update(r); err != nil {
		return fmt.Errorf("set limits of cgroup %s: %w", c.Name, err)
	}
	return nil
}

// DevicesAllowed reads the v1 device list of the group ("" on v2 or without one): what
// CRIU must carry into a fork's group.
func (c *Cgroup) DevicesAllowed() (string, error) {
	if c.V2 {
		return "", nil
	}
	if _, ok := c.Paths[v1Devices]; !ok {
		return "", nil
	}
	dir, err := c.dir(v1Devices)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(dir, "devices.list"))
	return string(b), err
}
