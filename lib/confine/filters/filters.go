// Package filters compiles the seccomp programs of a confine.Profile: Docker's default
// profile (github.com/moby/profiles) translated and assembled with go-seccomp-bpf. It is
// apart from lib/confine, which loads the programs (Profile.ApplyFilters), so that what
// only loads them (lazyfork-helper, given them by the daemon) or only reads a Profile (the
// lazyfork client, through the store's records) links neither the compiler nor its syscall
// tables, whose set-up was the largest package init of both.
package filters

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	bpfseccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	profiles "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/confine"
)

// Skipped is one rule of the profile the compiler could not express, and why.
type Skipped struct {
	Syscall string
	Reason  string
}

// Policies is Docker's default profile as go-seccomp-bpf policies: Main allows every
// syscall the profile allows (those with argument conditions unconditionally), and each
// of Args refuses one such syscall when its arguments break the profile's conditions.
// The kernel runs all the filters and takes the strictest answer.
//
// Why not one filter: go-seccomp-bpf (v1.6.0) does not reload the syscall number after
// an argument check fails, so any rule after a conditional one would compare an argument
// with syscall numbers. Here every argument check is the only rule of its filter.
type Policies struct {
	Main    *bpfseccomp.Policy
	Args    []*bpfseccomp.Policy
	Skipped []Skipped // rules left out: stricter, never looser (they fall to EPERM)
}

// DefaultPolicy translates Docker's default seccomp profile, resolved for caps (rules
// that depend on a capability follow the bounding set, as in Docker) and this kernel,
// for the native architecture.
//
// Differences from libseccomp's compilation of the same profile (docs/security.md):
//   - Only the native ABI is allowed. Docker also lists the 32-bit x86 and x32 ABIs;
//     here their syscalls fail (EPERM for int 0x80, ENOSYS for x32).
//   - Names absent from the compiler's table for this architecture are skipped; on
//     x86_64 these are the 32-bit-only syscalls (chown32, mmap2, socketcall, ...).
//   - An argument rule must negate into one AND'ed set (each of its alternatives
//     checks one argument, as all of Docker's do); others are skipped.
func DefaultPolicy(caps []string) (Policies, error) {
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}}
	prof, err := profiles.GetDefaultProfile(spec)
	if err != nil {
		return Policies{}, fmt.Errorf("confine: load the default seccomp profile: %w", err)
	}
	return translate(prof)
}

func translate(prof *specs.LinuxSeccomp) (Policies, error) {
	var out Policies
	native, err := arch.GetInfo("")
	if err != nil {
		return out, fmt.Errorf("confine: seccomp: %w", err)
	}
	def, err := action(prof.DefaultAction, prof.DefaultErrnoRet)
	if err != nil {
		return out, fmt.Errorf("confine: seccomp default action: %w", err)
	}
	// go-seccomp-bpf validates the default action by name: plain errno means EPERM.
	if def == bpfseccomp.ActionErrno|bpfseccomp.Action(unix.EPERM) {
		def = bpfseccomp.ActionErrno
	}
	out.Main = &bpfseccomp.Policy{DefaultAction: def}
	skip := func(name, why string) { out.Skipped = append(out.Skipped, Skipped{name, why}) }

	unconditional := map[string]bool{}
	var condNames []string                                // in profile order
	conds := map[string][]bpfseccomp.ArgumentConditions{} // name -> OR'ed AND-sets
	for _, rule := range prof.Syscalls {
		act, err := action(rule.Action, rule.ErrnoRet)
		if err != nil {
			for _, n := range rule.Names {
				skip(n, err.Error())
			}
			continue
		}
		sets, why := conditions(rule.Args)
		if why == "" && len(sets) > 0 && act != bpfseccomp.ActionAllow {
			why = "argument conditions on a rule that does not allow"
		}
		g := bpfseccomp.SyscallGroup{Action: act}
		for _, n := range rule.Names {
			switch _, known := native.SyscallNames[n]; {
			case !known:
				skip(n, "not a syscall of "+native.Name+" in go-seccomp-bpf's table")
			case why != "":
				skip(n, why)
			case len(sets) == 0:
				if !unconditional[n] {
					g.Names = append(g.Names, n)
					unconditional[n] = true
				}
			default:
				if _, ok := conds[n]; !ok {
					condNames = append(condNames, n)
				}
				conds[n] = append(conds[n], sets...)
			}
		}
		if len(g.Names) > 0 {
			out.Main.Syscalls = append(out.Main.Syscalls, g)
		}
	}
	allowInMain := bpfseccomp.SyscallGroup{Action: bpfseccomp.ActionAllow}
	for _, n := range condNames {
		if unconditional[n] {
			continue // allowed outright by another rule: its conditions change nothing
		}
		neg, why := negate(conds[n])
		if why != "" {
			skip(n, why)
			continue
		}
		allowInMain.Names = append(allowInMain.Names, n)
		// Refuse (with the profile's default answer) when every allowed alternative fails.
		out.Args = append(out.Args, &bpfseccomp.Policy{
			DefaultAction: bpfseccomp.ActionAllow,
			Syscalls: []bpfseccomp.SyscallGroup{{Action: def,
				NamesWithCondtions: []bpfseccomp.NameWithConditions{{Name: n, Conditions: neg}}}},
		})
	}
	if len(allowInMain.Names) > 0 {
		out.Main.Syscalls = append(out.Main.Syscalls, allowInMain)
	}
	hotFirst(out.Main)
	return out, nil
}

// hotSyscalls are the calls most programs make most often. go-seccomp-bpf checks names
// one after the other, and the profile lists them alphabetically (read and write near
// the end); checking these first makes the common call cost a few instructions.
var hotSyscalls = []string{
	"read", "write", "futex", "epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll",
	"recvfrom", "sendto", "recvmsg", "sendmsg", "readv", "writev", "pread64", "pwrite64",
	"lseek", "close", "openat", "newfstatat", "fstat", "statx", "mmap", "munmap", "mprotect",
	"madvise", "brk", "rt_sigprocmask", "rt_sigaction", "rt_sigreturn", "clock_gettime",
	"clock_nanosleep", "nanosleep", "getpid", "gettid", "sched_yield", "ioctl", "fcntl",
	"getdents64", "select", "pselect6", "getrandom", "wait4", "clone", "execve", "exit",
	"exit_group", "accept4", "connect",
}

// hotFirst moves the hot syscalls that the policy allows unconditionally into a group of
// their own at the front. Each name is in one group only and every moved name is allowed
// where it was, so the answers do not change, only how soon they come.
func hotFirst(p *bpfseccomp.Policy) {
	hot := bpfseccomp.SyscallGroup{Action: bpfseccomp.ActionAllow}
	for _, h := range hotSyscalls {
		for i := range p.Syscalls {
			g := &p.Syscalls[i]
			if g.Action != bpfseccomp.ActionAllow {
				continue
			}
			if j := slices.Index(g.Names, h); j >= 0 {
				g.Names = slices.Delete(g.Names, j, j+1)
				hot.Names = append(hot.Names, h)
				break
			}
		}
	}
	p.Syscalls = slices.DeleteFunc(p.Syscalls, func(g bpfseccomp.SyscallGroup) bool {
		return len(g.Names)+len(g.NamesWithCondtions) == 0
	})
	if len(hot.Names) > 0 {
		p.Syscalls = append([]bpfseccomp.SyscallGroup{hot}, p.Syscalls...)
	}
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
	}
	return 0, fmt.Errorf("action %s not supported", a)
}

// conditions turns a rule's argument checks into AND-sets that are OR'ed. As runc does:
// checks of distinct arguments are one AND'ed set; repeated checks of the same argument
// become one set each (OR).
func conditions(args []specs.LinuxSeccompArg) ([]bpfseccomp.ArgumentConditions, string) {
	if len(args) == 0 {
		return nil, ""
	}
	seen := map[uint]bool{}
	repeated := false
	var all bpfseccomp.ArgumentConditions
	for _, a := range args {
		repeated = repeated || seen[a.Index]
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

// compares are the profile's plain comparisons, as go-seccomp-bpf names them.
var compares = map[specs.LinuxSeccompOperator]bpfseccomp.Operation{
	specs.OpEqualTo: bpfseccomp.Equal, specs.OpNotEqual: bpfseccomp.NotEqual,
	specs.OpLessThan: bpfseccomp.LessThan, specs.OpLessEqual: bpfseccomp.LessOrEqual,
	specs.OpGreaterThan: bpfseccomp.GreaterThan, specs.OpGreaterEqual: bpfseccomp.GreaterOrEqual,
}

func condition(a specs.LinuxSeccompArg) (bpfseccomp.Condition, string) {
	c := bpfseccomp.Condition{Argument: uint32(a.Index), Value: a.Value}
	if a.Index > 5 {
		return c, fmt.Sprintf("argument index %d out of range", a.Index)
	}
	if op, ok := compares[a.Op]; ok {
		c.Operation = op
		return c, ""
	}
	switch a.Op {
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
	return c, ""
}

var opposite = map[bpfseccomp.Operation]bpfseccomp.Operation{
	bpfseccomp.Equal: bpfseccomp.NotEqual, bpfseccomp.NotEqual: bpfseccomp.Equal,
	bpfseccomp.LessThan: bpfseccomp.GreaterOrEqual, bpfseccomp.GreaterOrEqual: bpfseccomp.LessThan,
	bpfseccomp.LessOrEqual: bpfseccomp.GreaterThan, bpfseccomp.GreaterThan: bpfseccomp.LessOrEqual,
	bpfseccomp.BitsNotSet: bpfseccomp.BitsSet, bpfseccomp.BitsSet: bpfseccomp.BitsNotSet,
}

// negate turns "any of these sets holds" into the one AND-set "none holds", possible
// when every set is a single check.
func negate(sets []bpfseccomp.ArgumentConditions) (bpfseccomp.ArgumentConditions, string) {
	var out bpfseccomp.ArgumentConditions
	for _, s := range sets {
		if len(s) != 1 {
			return nil, "an alternative checks several arguments at once: not expressible as one filter"
		}
		c := s[0]
		c.Operation = opposite[c.Operation]
		out = append(out, c)
	}
	return out, ""
}

// DefaultFilters compiles DefaultPolicy(caps) into classic BPF programs for seccomp(2),
// the main one first.
func DefaultFilters(caps []string) ([][]unix.SockFilter, error) {
	pol, err := DefaultPolicy(caps)
	if err != nil {
		return nil, err
	}
	var out [][]unix.SockFilter
	for _, p := range append([]*bpfseccomp.Policy{pol.Main}, pol.Args...) {
		prog, err := compile(p)
		if err != nil {
			return nil, err
		}
		out = append(out, prog)
	}
	return out, nil
}

func compile(p *bpfseccomp.Policy) ([]unix.SockFilter, error) {
	insts, err := p.Assemble()
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

// For is p's seccomp programs (none for a privileged or unconfined profile), compiled once
// per set of capabilities in this process: a daemon compiles them for the commands it
// execs once, not anew in each exec helper, which is given them (helper.Config.Filters).
func For(p confine.Profile) ([][]unix.SockFilter, error) {
	if !p.Filtered() {
		return nil, nil
	}
	key := strings.Join(p.Caps, ",")
	if v, ok := compiled.Load(key); ok {
		return v.([][]unix.SockFilter), nil
	}
	progs, err := DefaultFilters(p.Caps)
	if err != nil {
		return nil, err
	}
	compiled.Store(key, progs)
	return progs, nil
}

var compiled sync.Map // caps -> [][]unix.SockFilter

// Apply confines the calling process with p for its next execve (confine.Profile.
// ApplyFilters, which says how), its programs compiled first: an error there leaves the
// process untouched.
func Apply(p confine.Profile) error {
	progs, err := For(p)
	if err != nil {
		return err
	}
	return p.ApplyFilters(progs)
}
