package confine

import (
	"fmt"
	"strings"
	"unsafe"

	bpfseccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	profiles "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Skipped is one rule of the profile the compiler could not express, and why.
type Skipped struct {
	Syscall string
	Reason  string
}

// DefaultPolicy translates Docker's default seccomp profile, resolved for caps (rules
// that depend on a capability follow the bounding set, as in Docker) and this kernel,
// into a go-seccomp-bpf policy for the native architecture. It reports the rules it had
// to leave out, which make the filter stricter, never looser: a syscall left out falls to
// the default action (EPERM).
//
// Differences from libseccomp's compilation of the same profile (docs/security.md):
//   - Only the native ABI is allowed. Docker also lists the 32-bit x86 and x32 ABIs;
//     here their syscalls fail (EPERM for int 0x80, ENOSYS for x32).
//   - Rules are matched first to last (the profile has no overlapping ones).
//   - Names this compiler's syscall table lacks are skipped (reported).
func DefaultPolicy(caps []string) (*bpfseccomp.Policy, []Skipped, error) {
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}}
	prof, err := profiles.GetDefaultProfile(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("confine: load the default seccomp profile: %w", err)
	}
	return translate(prof)
}

func translate(prof *specs.LinuxSeccomp) (*bpfseccomp.Policy, []Skipped, error) {
	native, err := arch.GetInfo("")
	if err != nil {
		return nil, nil, fmt.Errorf("confine: seccomp: %w", err)
	}
	def, err := action(prof.DefaultAction, prof.DefaultErrnoRet)
	if err != nil {
		return nil, nil, fmt.Errorf("confine: seccomp default action: %w", err)
	}
	// go-seccomp-bpf validates the default action by name: plain errno means EPERM.
	if def == bpfseccomp.ActionErrno|bpfseccomp.Action(unix.EPERM) {
		def = bpfseccomp.ActionErrno
	}
	pol := &bpfseccomp.Policy{DefaultAction: def}
	var skipped []Skipped
	for _, rule := range prof.Syscalls {
		act, err := action(rule.Action, rule.ErrnoRet)
		if err != nil {
			for _, n := range rule.Names {
				skipped = append(skipped, Skipped{n, err.Error()})
			}
			continue
		}
		conds, why := conditions(rule.Args)
		g := bpfseccomp.SyscallGroup{Action: act}
		for _, n := range rule.Names {
			if _, ok := native.SyscallNames[n]; !ok {
				skipped = append(skipped, Skipped{n, "not in go-seccomp-bpf's syscall table for " + native.Name})
				continue
			}
			if why != "" {
				skipped = append(skipped, Skipped{n, why})
				continue
			}
			if len(conds) == 0 {
				g.Names = append(g.Names, n)
				continue
			}
			for _, c := range conds {
				g.NamesWithCondtions = append(g.NamesWithCondtions, bpfseccomp.NameWithConditions{Name: n, Conditions: c})
			}
		}
		if len(g.Names)+len(g.NamesWithCondtions) > 0 {
			pol.Syscalls = append(pol.Syscalls, g)
		}
	}
	return pol, skipped, nil
}

// action maps an OCI action to go-seccomp-bpf's; errno actions carry their errno in the
// low 16 bits of the return value, as the kernel reads it.
func action(a specs.LinuxSeccompAction, errnoRet *uint) (bpfseccomp.Action, error) {
	switch a {
	case specs.ActAllow:
		return bpfseccomp.ActionAllow, nil
	case specs.ActErrno:
		e := uint(unix.EPERM)
		if errnoRet != nil {
			e = *errnoRet
		}
		return bpfseccomp.ActionErrno | bpfseccomp.Action(e&0xffff), nil
	case specs.ActKill, specs.ActKillThread:
		return bpfseccomp.ActionKillThread, nil
	case specs.ActKillProcess:
		return bpfseccomp.ActionKillProcess, nil
	case specs.ActTrap:
		return bpfseccomp.ActionTrap, nil
	case specs.ActLog:
		return bpfseccomp.ActionLog, nil
	case specs.ActTrace:
		// SCMP_ACT_TRACE without a tracer fails the call with ENOSYS; same here.
		return bpfseccomp.ActionTrace, nil
	}
	return 0, fmt.Errorf("action %s not supported", a)
}

// conditions turns a rule's argument checks into condition sets that are OR'ed (each set
// is AND'ed). As runc does: checks of distinct arguments are one AND'ed set; repeated
// checks of the same argument become one set each (OR).
func conditions(args []specs.LinuxSeccompArg) ([]bpfseccomp.ArgumentConditions, string) {
	if len(args) == 0 {
		return nil, ""
	}
	seen := map[uint]bool{}
	repeated := false
	var all bpfseccomp.ArgumentConditions
	for _, a := range args {
		if seen[a.Index] {
			repeated = true
		}
		seen[a.Index] = true
		c, why := condition(a)
		if why != "" {
			return nil, why
		}
		all = append(all, c)
	}
	if !repeated {
		return []bpfseccomp.ArgumentConditions{all}, ""
	}
	var out []bpfseccomp.ArgumentConditions
	for _, c := range all {
		out = append(out, bpfseccomp.ArgumentConditions{c})
	}
	return out, ""
}

func condition(a specs.LinuxSeccompArg) (bpfseccomp.Condition, string) {
	c := bpfseccomp.Condition{Argument: uint32(a.Index), Value: a.Value}
	switch a.Op {
	case specs.OpEqualTo:
		c.Operation = bpfseccomp.Equal
	case specs.OpNotEqual:
		c.Operation = bpfseccomp.NotEqual
	case specs.OpLessThan:
		c.Operation = bpfseccomp.LessThan
	case specs.OpLessEqual:
		c.Operation = bpfseccomp.LessOrEqual
	case specs.OpGreaterThan:
		c.Operation = bpfseccomp.GreaterThan
	case specs.OpGreaterEqual:
		c.Operation = bpfseccomp.GreaterOrEqual
	case specs.OpMaskedEqual:
		// (arg & mask) == 0 is "no bit of mask set"; other masked compares have no
		// equivalent in go-seccomp-bpf.
		if a.ValueTwo != 0 {
			return c, fmt.Sprintf("argument %d: masked compare (arg & %#x) == %#x not expressible", a.Index, a.Value, a.ValueTwo)
		}
		c.Operation = bpfseccomp.BitsNotSet
	default:
		return c, fmt.Sprintf("argument %d: operator %s not supported", a.Index, a.Op)
	}
	if a.Index > 5 {
		return c, fmt.Sprintf("argument index %d out of range", a.Index)
	}
	return c, ""
}

// DefaultFilter compiles DefaultPolicy(caps) into a classic BPF program for seccomp(2).
func DefaultFilter(caps []string) ([]unix.SockFilter, error) {
	pol, _, err := DefaultPolicy(caps)
	if err != nil {
		return nil, err
	}
	insts, err := pol.Assemble()
	if err != nil {
		return nil, fmt.Errorf("confine: compile seccomp profile: %w", err)
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("confine: assemble seccomp filter: %w", err)
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out, nil
}

// loadFilter installs prog for every thread of the process. no_new_privs (or
// CAP_SYS_ADMIN) must already hold.
func loadFilter(prog []unix.SockFilter) error {
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("confine: load seccomp filter (%d instructions): %w", len(prog), errno)
	}
	if r != 0 {
		// With TSYNC a positive return names a thread that could not take the filter.
		return fmt.Errorf("confine: load seccomp filter: thread %d could not be synchronised", r)
	}
	return nil
}

// FormatSkipped renders skipped rules for a log line or a test message.
func FormatSkipped(s []Skipped) string {
	var b strings.Builder
	for i, x := range s {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(x.Syscall + ": " + x.Reason)
	}
	return b.String()
}
