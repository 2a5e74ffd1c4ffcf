package confine_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/lazyfork/lazyfork/lib/confine"
	"github.com/lazyfork/lazyfork/lib/confine/filters"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

const (
	childEnv = "LF_CONFINE_TEST_PROFILE"
	noProgs  = "LF_CONFINE_TEST_NO_PROGRAMS" // the child calls ApplyFilters(nil)
)

// TestMain doubles as the confined child: with childEnv set, it applies that profile and
// execs its arguments, as the container set-up helper does.
func TestMain(m *testing.M) {
	if js := os.Getenv(childEnv); js != "" {
		runtime.LockOSThread()
		var p confine.Profile
		if err := json.Unmarshal([]byte(js), &p); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(126)
		}
		apply := func() error { return filters.Apply(p) }
		if os.Getenv(noProgs) != "" {
			apply = func() error { return p.ApplyFilters(nil) }
		}
		if err := apply(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(126)
		}
		args := os.Args[1:]
		err := syscall.Exec(args[0], args, []string{"PATH=/usr/bin:/bin"})
		fmt.Fprintln(os.Stderr, err)
		os.Exit(127)
	}
	os.Exit(m.Run())
}

// runConfined runs a shell script under p in a child process and returns its output.
func runConfined(t *testing.T, p confine.Profile, script string) (string, error) {
	t.Helper()
	js, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "/bin/sh", "-c", script)
	cmd.Env = []string{childEnv + "=" + string(js)}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// status reads fields of /proc/self/status as the confined shell sees them.
func status(t *testing.T, p confine.Profile) map[string]string {
	t.Helper()
	out, err := runConfined(t, p, "cat /proc/self/status")
	if err != nil {
		t.Fatalf("confined child: %v\n%s", err, out)
	}
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// dockerCapMask is the bit mask of confine.DefaultCaps (what `docker run` shows as CapEff).
const dockerCapMask = "00000000a80425fb"

func TestPolicyCompiles(t *testing.T) {
	pol, err := filters.DefaultPolicy(confine.DefaultCaps)
	if err != nil {
		t.Fatal(err)
	}
	progs, err := filters.DefaultFilters(confine.DefaultCaps)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range pol.Main.Syscalls {
		n += len(g.Names)
		if len(g.NamesWithCondtions) > 0 {
			t.Errorf("the main filter has argument checks (%v): go-seccomp-bpf would compare later rules with an argument", g.NamesWithCondtions)
		}
	}
	for _, a := range pol.Args {
		if len(a.Syscalls) != 1 || len(a.Syscalls[0].NamesWithCondtions) != 1 {
			t.Errorf("an argument filter must hold exactly one rule: %+v", a.Syscalls)
		}
	}
	var sizes []int
	for _, p := range progs {
		sizes = append(sizes, len(p))
	}
	t.Logf("%d syscalls, %d argument filters, instructions per filter %v", n, len(pol.Args), sizes)
	for _, s := range pol.Skipped {
		// Only syscalls x86_64 does not have may be left out (libseccomp ignores them too).
		if !strings.Contains(s.Reason, "not a syscall of") {
			t.Errorf("rule left out: %s: %s", s.Syscall, s.Reason)
		}
	}
	if n < 300 || len(pol.Args) != 3 || sizes[0] > 4096 {
		t.Fatalf("%d syscalls, %d argument filters (socket, personality, clone), %d instructions: want Docker's ~350 within 4096", n, len(pol.Args), sizes[0])
	}
}

func TestApplyDefault(t *testing.T) {
	testutil.RequireRoot(t)
	st := status(t, confine.Default())
	for k, want := range map[string]string{
		"CapEff": dockerCapMask, "CapPrm": dockerCapMask, "CapInh": "0000000000000000", "CapBnd": dockerCapMask,
		"CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2", "Uid": "0\t0\t0\t0",
	} {
		if st[k] != want {
			t.Errorf("%s = %q, want %q", k, st[k], want)
		}
	}
}

func TestApplyUser(t *testing.T) {
	testutil.RequireRoot(t)
	p := confine.Default()
	p.UID, p.GID, p.Groups = 1234, 2345, []uint32{3456}
	st := status(t, p)
	for k, want := range map[string]string{
		"Uid": "1234\t1234\t1234\t1234", "Gid": "2345\t2345\t2345\t2345", "Groups": "3456",
		"CapEff": "0000000000000000", "CapBnd": dockerCapMask,
	} {
		if st[k] != want {
			t.Errorf("%s = %q, want %q", k, st[k], want)
		}
	}
}

// A profile that needs a seccomp filter and is given no programs is refused before
// anything changes; a privileged one needs none.
func TestApplyFiltersNeedsPrograms(t *testing.T) {
	testutil.RequireRoot(t)
	for _, c := range []struct {
		p    confine.Profile
		want string // in the output; "" = runs
	}{{confine.Default(), "no seccomp programs"}, {confine.Privileged(), ""}} {
		js, err := json.Marshal(c.p)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "/bin/sh", "-c", "grep -E '^(Seccomp|CapEff):' /proc/self/status")
		cmd.Env = []string{childEnv + "=" + string(js), noProgs + "=1"}
		out, err := cmd.CombinedOutput()
		if c.want == "" {
			if err != nil || !strings.Contains(string(out), "Seccomp:\t0") {
				t.Errorf("privileged, no programs: %v %q", err, out)
			}
			continue
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 126 || !strings.Contains(string(out), c.want) {
			t.Errorf("confined, no programs: %v %q, want exit 126 naming %q", err, out, c.want)
		}
	}
}

func TestApplyPrivileged(t *testing.T) {
	testutil.RequireRoot(t)
	st := status(t, confine.Privileged())
	if st["Seccomp"] != "0" || st["NoNewPrivs"] != "0" || st["CapEff"] == dockerCapMask {
		t.Fatalf("privileged child: CapEff %s NoNewPrivs %s Seccomp %s, want all caps, 0, 0", st["CapEff"], st["NoNewPrivs"], st["Seccomp"])
	}
}

// TestSeccompBlocks checks the filter refuses what Docker's profile refuses and keeps
// ordinary work (fork, exec, threads through clone3's ENOSYS fallback) going.
func TestSeccompBlocks(t *testing.T) {
	testutil.RequireRoot(t)
	for _, c := range []struct{ script, want string }{
		{"unshare -U true 2>&1; echo rc=$?", "rc=1"},      // unshare needs CAP_SYS_ADMIN
		{"unshare -m true 2>&1; echo rc=$?", "rc=1"},      // so does a mount namespace
		{"mount -t tmpfs x /mnt 2>&1; echo rc=$?", "rc="}, // mount: not allowed
		// Argument rules: the socket domains, personality values and clone flags Docker
		// allows work, the others fail with EPERM (44, AF_XDP, is allowed: the kernel
		// refuses its socket type; 40, AF_VSOCK, is not).
		{`python3 -c 'import socket, errno
for fam in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK, 40, 44):
    try:
        socket.socket(fam, socket.SOCK_DGRAM).close(); print(fam, "ok")
    except OSError as e:
        print(fam, errno.errorcode[e.errno])'`, "1 ok\n2 ok\n10 ok\n16 ok\n40 EPERM\n44 ESOCKTNOSUPPORT"},
		{`python3 -c 'import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.personality.argtypes = [ctypes.c_ulong]
print(libc.personality(0xffffffff) >= 0, libc.personality(0x0040000), ctypes.get_errno())
print(libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0), ctypes.get_errno())'`, "True -1 1\n-1 1"},
		{"python3 -c 'import threading,subprocess; t=threading.Thread(target=print,args=(\"thread\",)); t.start(); t.join(); print(subprocess.run([\"echo\",\"child\"],capture_output=True,text=True).stdout.strip())'", "thread\nchild"},
	} {
		out, _ := runConfined(t, confine.Default(), c.script)
		if !strings.Contains(out, c.want) || strings.Contains(c.script, "mount -t") && strings.Contains(out, "rc=0") {
			t.Errorf("%s: got %q, want %q", c.script, out, c.want)
		}
	}
}

func TestValidate(t *testing.T) {
	p := confine.Default()
	p.Caps = append(p.Caps, "CAP_NOPE")
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "CAP_NOPE") {
		t.Fatalf("unknown capability: err = %v", err)
	}
	p = confine.Default()
	p.Seccomp = "strict"
	if err := p.Validate(); err == nil {
		t.Fatal("unknown seccomp profile accepted")
	}
}
