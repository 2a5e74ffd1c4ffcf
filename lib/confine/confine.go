// Package confine holds the confinement every process inside a LazyFork container runs
// under (Docker's default, unless the container is privileged): a reduced capability set,
// no_new_privs, Docker's default seccomp profile and the container's user. A Profile is
// stored in the container record; whoever starts a process inside the container (the
// container's set-up helper, the exec path) calls ApplyFilters on the thread that then
// execve's, with the seccomp programs lib/confine/filters compiled. Forks do not call it:
// CRIU dumps and restores capabilities, no_new_privs, seccomp filters and credentials as
// they are.
package confine

import (
	"fmt"
	"runtime"
	"slices"
	"strings"

	"github.com/moby/sys/capability"
	"golang.org/x/sys/unix"
)

// Seccomp profile names a Profile can carry.
const (
	SeccompDefault    = "default"    // Docker's default profile (github.com/moby/profiles/seccomp)
	SeccompUnconfined = "unconfined" // no filter
)

// Profile is the confinement of the processes of one container. Its zero value is not
// valid; start from Default or Privileged. The JSON form is part of container.json: add
// fields, never rename them.
type Profile struct {
	// Privileged keeps every capability and loads no seccomp filter (the --privileged
	// opt-out); Caps, NoNewPrivs and Seccomp are then ignored. UID/GID still apply.
	Privileged bool `json:"privileged,omitempty"`
	// Caps are the capability names ("CAP_CHOWN", ...) kept in the bounding, effective
	// and permitted sets. The inheritable and ambient sets are always empty, as in runc
	// and Docker since CVE-2022-24769 (and CRIU can then restore the sets: it drops
	// CAP_SETPCAP from the bounding set before it sets them, and the kernel refuses an
	// inheritable set it no longer bounds).
	Caps       []string `json:"caps,omitempty"`
	NoNewPrivs bool     `json:"no_new_privs,omitempty"`
	Seccomp    string   `json:"seccomp,omitempty"`

	// User is the user as given (image `User` or --user), kept for display; UID, GID and
	// Groups are what it resolved to in the image's /etc/passwd and /etc/group.
	User   string   `json:"user,omitempty"`
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
	// Home is the user's home directory from /etc/passwd ("" if unknown): HOME when the
	// environment does not set it.
	Home string `json:"home,omitempty"`
}

// DefaultCaps is Docker's default capability set.
var DefaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// Default is the confinement of a container created without --privileged, as root.
func Default() Profile {
	return Profile{Caps: slices.Clone(DefaultCaps), NoNewPrivs: true, Seccomp: SeccompDefault}
}

// Privileged is the --privileged opt-out: every capability, no seccomp, no no_new_privs.
func Privileged() Profile {
	return Profile{Privileged: true, Seccomp: SeccompUnconfined}
}

// Validate checks a profile read from a record before anything is applied.
func (p Profile) Validate() error {
	if p.Privileged {
		return nil
	}
	if _, err := capsFromNames(p.Caps); err != nil {
		return err
	}
	switch p.Seccomp {
	case SeccompDefault, SeccompUnconfined:
	default:
		return fmt.Errorf("confine: unknown seccomp profile %q (want %q or %q)", p.Seccomp, SeccompDefault, SeccompUnconfined)
	}
	return nil
}

// Filtered reports whether p loads a seccomp filter (Docker's default profile): then
// ApplyFilters needs its programs (lib/confine/filters compiles them).
func (p Profile) Filtered() bool { return !p.Privileged && p.Seccomp == SeccompDefault }

// ApplyFilters confines the calling process for its next execve: supplementary groups,
// gid and uid, the capability sets, no_new_privs and the seccomp programs progs
// (filters.For(p), compiled by whoever started this process, or filters.Apply), in that
// order (the bounding set can only shrink while CAP_SETPCAP is effective, and the filter
// goes last so it never has to allow the set-up itself). It cannot be undone. A profile
// that needs a filter and is given none is refused before anything changes: a missing
// program never means no filter.
//
// Capabilities, no_new_privs, the user and the groups are per thread: call
// runtime.LockOSThread first and execve from the same goroutine right after ApplyFilters
// returns (syscall.Exec), which ends the other threads. The
// seccomp filter is synchronised to every thread (SECCOMP_FILTER_FLAG_TSYNC). After it
// the caller can no longer mount, setns or change users; do all of that before.
func (p Profile) ApplyFilters(progs [][]unix.SockFilter) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if !p.Filtered() {
		progs = nil
	} else if len(progs) == 0 {
		return fmt.Errorf("confine: no seccomp programs for a profile with the %s filter (lib/confine/filters compiles them)", p.Seccomp)
	}
	for _, prog := range progs {
		if len(prog) == 0 || len(prog) > bpfMaxInsns {
			return fmt.Errorf("confine: a seccomp program of %d instructions", len(prog))
		}
	}
	if !p.Privileged {
		if err := p.dropBounding(); err != nil {
			return err
		}
	}
	if err := p.setUser(); err != nil {
		return err
	}
	if !p.Privileged {
		if err := p.setCaps(); err != nil {
			return err
		}
	}
	if p.NoNewPrivs && !p.Privileged {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("confine: set no_new_privs: %w", err)
		}
	}
	for _, prog := range progs {
		if err := loadFilter(prog); err != nil {
			return err
		}
	}
	runtime.KeepAlive(progs)
	return nil
}

// capsFromNames maps "CAP_X" names to capability values; unknown names are an error.
func capsFromNames(names []string) ([]capability.Cap, error) {
	known := map[string]capability.Cap{}
	for _, c := range capability.ListKnown() {
		known["CAP_"+strings.ToUpper(c.String())] = c
	}
	var out []capability.Cap
	for _, n := range names {
		c, ok := known[strings.ToUpper(n)]
		if !ok {
			return nil, fmt.Errorf("confine: unknown capability %q (names look like CAP_CHOWN)", n)
		}
		out = append(out, c)
	}
	return out, nil
}

// current returns this thread's capability sets, loaded, and the profile's capabilities.
func (p Profile) current() (capability.Capabilities, []capability.Cap, error) {
	caps, err := capsFromNames(p.Caps)
	if err != nil {
		return nil, nil, err
	}
	c, err := capability.NewPid2(0)
	if err == nil {
		err = c.Load()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("confine: read capabilities: %w", err)
	}
	return c, caps, nil
}

func (p Profile) dropBounding() error {
	c, caps, err := p.current()
	if err != nil {
		return err
	}
	c.Clear(capability.BOUNDING)
	c.Set(capability.BOUNDING, caps...)
	if err := c.Apply(capability.BOUNDS); err != nil {
		return fmt.Errorf("confine: drop capabilities from the bounding set: %w", err)
	}
	return nil
}

func (p Profile) setCaps() error {
	c, caps, err := p.current()
	if err != nil {
		return err
	}
	c.Clear(capability.CAPS | capability.AMBIENT)
	c.Set(capability.EFFECTIVE|capability.PERMITTED, caps...)
	if err := c.Apply(capability.CAPS | capability.AMBS); err != nil {
		return fmt.Errorf("confine: set capabilities: %w", err)
	}
	return nil
}

// setUser switches to the profile's user, keeping the permitted capabilities across the
// uid change (setCaps then trims them; execve drops them for a non-root user, as Docker).
func (p Profile) setUser() error {
	if err := unix.Prctl(unix.PR_SET_KEEPCAPS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: keep capabilities: %w", err)
	}
	groups := make([]int, len(p.Groups))
	for i, g := range p.Groups {
		groups[i] = int(g)
	}
	// This thread's credentials only, as its capabilities and no_new_privs: the execve
	// that follows from it (see ApplyFilters) gives the command this thread's, and ends
	// the other threads. The syscall package's setgroups, setresgid and setresuid change
	// every thread's, each stopping them all with a signal and spinning until each has
	// answered: 3-11 ms of an exec's start on a loaded 2-core host (bench/README.md).
	if err := unix.Setgroups(groups); err != nil { // a raw syscall: this thread's
		return fmt.Errorf("confine: set groups %v: %w", p.Groups, err)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(p.GID), uintptr(p.GID), uintptr(p.GID)); e != 0 {
		return fmt.Errorf("confine: set gid %d: %w", p.GID, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(p.UID), uintptr(p.UID), uintptr(p.UID)); e != 0 {
		return fmt.Errorf("confine: set uid %d: %w", p.UID, e)
	}
	if err := unix.Prctl(unix.PR_SET_KEEPCAPS, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: reset keep capabilities: %w", err)
	}
	return nil
}
