package fork_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
	"github.com/lazyfork/lazyfork/lib/testutil/timescale"
)

// prober is a confined workload: it counts, keeps a heap whose checksum it prints, uses
// sqlite3 on disk, a thread and a subprocess every tick, and when /tmp/probe appears it
// tries the escapes of docs/security.md itself (as the container's own process, not
// through exec) and writes what happened to /tmp/probe.out as JSON.
const proberPy = `
import ctypes, ctypes.util, errno, json, os, sqlite3, subprocess, threading, time, itertools, zlib
libc = ctypes.CDLL(None, use_errno=True)
heap = bytearray(b"lazyfork" * (4 << 20))
want = zlib.crc32(heap)

def sql(i):
    # A connection per tick: one opened before a fork fails in the fork with
    # SQLITE_READONLY_DBMOVED (the frozen layer is a copy: the file's inode number changes).
    db = sqlite3.connect("/tmp/probe.db")
    db.execute("create table if not exists t (i integer)")
    db.execute("insert into t values (?)", (i,)); db.commit()
    n = db.execute("select count(*) from t").fetchone()[0]
    db.close()
    return n

def err(f):
    try:
        r = f()
        return "ok" if r is None else "ok: " + str(r)[:60]
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

def c_err(r):
    if r != 0:
        raise OSError(ctypes.get_errno(), "")

def write(path, data):
    with open(path, "w") as f:
        f.write(data)

def probe():
    out = {}
    st = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
    out["CapEff"], out["NoNewPrivs"], out["Seccomp"] = st["CapEff"], st["NoNewPrivs"], st["Seccomp"]
    # Writes give back what is there: if one ever succeeded, the host would be unchanged.
    out["core_pattern"] = err(lambda: write("/proc/sys/kernel/core_pattern", open("/proc/sys/kernel/core_pattern").read()))
    out["sysrq"] = err(lambda: write("/proc/sysrq-trigger", ""))
    out["mknod_block"] = err(lambda: os.mknod("/tmp/sda", 0o600 | 0o060000, os.makedev(8, 0)))
    out["remount_mem"] = err(lambda: c_err(libc.mount(b"none", b"/.lazyfork/mem", None, 0x20 | 0x1000, None)))
    out["mount_tmpfs"] = err(lambda: c_err(libc.mount(b"x", b"/mnt", b"tmpfs", 0, None)))
    out["unshare_user"] = err(lambda: c_err(libc.unshare(0x10000000)))
    out["kcore"] = err(lambda: len(open("/proc/kcore", "rb").read(4096)))
    out["keys"] = err(lambda: len(open("/proc/keys").read()))
    mem = sorted(os.listdir("/.lazyfork/mem"))
    out["mem_files"] = len(mem)
    if mem:
        p = "/.lazyfork/mem/" + mem[0]
        out["mem_write"] = err(lambda: open(p, "r+b").write(b"x"))
        out["mem_truncate"] = err(lambda: os.truncate(p, 0))
        out["mem_chmod"] = err(lambda: os.chmod(p, 0o666))
    pid = int(open("/tmp/other-pid").read()) if os.path.exists("/tmp/other-pid") else 0
    if pid:
        out["ptrace_other"] = err(lambda: c_err(libc.ptrace(16, pid, None, None)))
        out["other_root"] = err(lambda: os.listdir("/proc/%d/root/" % pid))
        out["kill_other"] = err(lambda: os.kill(pid, 0))
    return out

for i in itertools.count():
    t = threading.Thread(target=lambda: None); t.start(); t.join()
    sub = subprocess.run(["true"]).returncode
    try:
        # Paused around dumps: CRIU refuses a task holding a file lock (sqlite's).
        rows = "paused" if os.path.exists("/tmp/pause") else sql(i)
    except sqlite3.Error as e:
        rows = getattr(e, "sqlite_errorname", str(e))
    print(i, zlib.crc32(heap) == want, sub, rows, flush=True)
    if os.path.exists("/tmp/probe"):
        os.unlink("/tmp/probe")
        json.dump(probe(), open("/tmp/probe.tmp", "w"))
        os.rename("/tmp/probe.tmp", "/tmp/probe.out")
    time.sleep(0.1)
`

// runProbe makes c's workload try the escapes and returns what each attempt gave.
func runProbe(t *testing.T, rt *container.Runtime, c *store.Container, otherPid int) map[string]any {
	t.Helper()
	execOut(t, rt, c, "sh", "-c", fmt.Sprintf("rm -f /tmp/probe.out; echo %d > /tmp/other-pid; touch /tmp/probe", otherPid))
	var out string
	for deadline := time.Now().Add(timescale.Scale(30 * time.Second)); out == ""; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			l := logLines(c)
			t.Fatalf("no probe results from %s after %v; alive %v; log ends %q", c.ID, timescale.Scale(30*time.Second), container.Alive(c), l[max(0, len(l)-12):])
		}
		out = tryExec(rt, c, "cat", "/tmp/probe.out")
	}
	m := map[string]any{}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("probe output %q: %v", out, err)
	}
	return m
}

// checkEscapesFail fails the test for every escape that worked.
func checkEscapesFail(t *testing.T, who string, m map[string]any, forked bool) {
	t.Helper()
	t.Logf("%s: %v", who, m)
	want := map[string]string{
		"CapEff": "00000000a80425fb", "NoNewPrivs": "1", "Seccomp": "2",
		"core_pattern": "EROFS", "sysrq": "EROFS", "mknod_block": "EPERM",
		"remount_mem": "EPERM", "mount_tmpfs": "EPERM", "unshare_user": "EPERM",
		"kcore": "ok: 0", "keys": "ok: 0",
		"ptrace_other": "ESRCH", "other_root": "ENOENT", "kill_other": "ESRCH",
	}
	// Kernels without these files (this host: no kcore, no sysrq) leave nothing to mask.
	for k, p := range map[string]string{"kcore": "/proc/kcore", "sysrq": "/proc/sysrq-trigger"} {
		if _, err := os.Stat(p); err != nil {
			want[k] = "ENOENT"
		}
	}
	if forked {
		// The family files exist only in forks; the bind is read-only and the files root's.
		want["mem_write"], want["mem_truncate"], want["mem_chmod"] = "EROFS", "EROFS", "EROFS"
	}
	for k, v := range want {
		if got := fmt.Sprint(m[k]); got != v {
			t.Errorf("%s: %s = %s, want %s", who, k, got, v)
		}
	}
	if forked && m["mem_files"].(float64) == 0 {
		t.Errorf("%s: no memory files under /.lazyfork/mem: the write attempts proved nothing", who)
	}
}

// procStatus reads the confinement fields of a host pid's /proc status.
func procStatus(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, k := range []string{"Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Seccomp_filters"} {
			if strings.HasPrefix(l, k+":") {
				keep = append(keep, l)
			}
		}
	}
	return strings.Join(keep, "\n")
}

// cgroupFile reads a v1 limit file of c's cgroup, or its v2 equivalent on a v2 group:
// memory.max for memory.limit_in_bytes, pids.max as is; v2 has no devices.list (the
// rules are an eBPF program), so there it is what the rules let a process in c do.
func cgroupFile(t *testing.T, rt *container.Runtime, c *store.Container, ctrl, file string) string {
	t.Helper()
	path := filepath.Join("/sys/fs/cgroup", ctrl, c.Cgroup[ctrl], file)
	if g, v2 := c.Cgroup["unified"]; v2 {
		switch file {
		case "memory.limit_in_bytes":
			file = "memory.max"
		case "devices.list":
			return deviceAccess(t, rt, c)
		}
		path = filepath.Join("/sys/fs/cgroup", g, file)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// deviceAccess is what the v2 eBPF device program lets a process exec'd in c do: mknod
// of a block device (7:0), of a char device off the allow-list (1:1) and of one on it (1:3).
func deviceAccess(t *testing.T, rt *container.Runtime, c *store.Container) string {
	t.Helper()
	return execOut(t, rt, c, "sh", "-c", `for n in "b 7 0" "c 1 1" "c 1 3"; do if mknod /tmp/lf-dev $n 2>/dev/null; then r=ok; else r=refused; fi; rm -f /tmp/lf-dev; printf '%s:%s ' "$n" $r; done`)
}

// TestConfinedContainerAndForks: the escapes fail in a container and in its fork, a
// sibling fork keeps working, forks carry the parent's confinement and limits exactly.
func TestConfinedContainerAndForks(t *testing.T) {
	rt := testutil.NewRuntime(t)
	other := create(t, rt, "other", "sleep", "1000")
	src, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "prober",
		Command: []string{"python3", "-c", proberPy}, Memory: 512 << 20, PidsLimit: 100})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "prober to run", func() bool { return len(logLines(src)) > 5 })
	checkEscapesFail(t, "container", runProbe(t, rt, src, other.Pid), false)

	execOut(t, rt, src, "touch", "/tmp/pause")
	testutil.Eventually(t, 30*time.Second, "sqlite to pause", func() bool {
		l := logLines(src)
		return len(l) > 0 && l[len(l)-1] == "paused"
	})
	forks := doFork(t, rt, src, 2)
	a, b := forks[0], forks[1]
	for _, f := range forks {
		if got, want := procStatus(t, f.Pid), procStatus(t, src.Pid); got != want {
			t.Errorf("fork %s status:\n%s\nparent:\n%s", f.ID, got, want)
		}
		for _, cf := range [][2]string{{"memory", "memory.limit_in_bytes"}, {"pids", "pids.max"}, {"devices", "devices.list"}} {
			if got, want := cgroupFile(t, rt, f, cf[0], cf[1]), cgroupFile(t, rt, src, cf[0], cf[1]); got != want {
				t.Errorf("fork %s %s = %q, parent has %q", f.ID, cf[1], got, want)
			}
		}
		if f.Confine == nil || f.Memory != src.Memory || f.PidsLimit != src.PidsLimit {
			t.Errorf("fork %s record: confine %v memory %d pids %d, parent's %v %d %d", f.ID, f.Confine, f.Memory, f.PidsLimit, src.Confine, src.Memory, src.PidsLimit)
		}
	}
	if got := cgroupFile(t, rt, src, "memory", "memory.limit_in_bytes"); got != fmt.Sprint(512<<20) {
		t.Errorf("memory.limit_in_bytes = %s, want %d", got, 512<<20)
	}
	if _, v2 := src.Cgroup["unified"]; v2 {
		if got, want := cgroupFile(t, rt, src, "devices", "devices.list"), "b 7 0:refused c 1 1:refused c 1 3:ok"; got != want {
			t.Errorf("v2 device access %q, want %q", got, want)
		}
	}
	checkEscapesFail(t, "fork", runProbe(t, rt, a, other.Pid), true)

	// The sibling goes on: counting, heap intact, sqlite rows growing, thread and
	// subprocess fine in every tick (each line: i heap_ok subprocess_rc rows).
	execOut(t, rt, b, "rm", "/tmp/pause")
	lines := func() []string {
		raw, _ := os.ReadFile(container.LogPath(b))
		return strings.Split(strings.TrimSpace(string(raw)), "\n")
	}
	n := len(lines()) // lines, not logLines' words: 20 more ticks, not 4 times as many
	// Each tick checksums a 32 MiB heap: seconds apiece under emulation (make test-v2).
	for deadline := time.Now().Add(timescale.Scale(60 * time.Second)); ; time.Sleep(50 * time.Millisecond) {
		l := lines()
		if len(l) > n+20 && !strings.HasSuffix(l[len(l)-10], "paused") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sibling %s did not go on: %d log lines, %d when unpaused; alive %v; log ends %q",
				b.ID, len(l), n, container.Alive(b), l[max(0, len(l)-5):])
		}
	}
	last := lines()
	for _, l := range last[len(last)-10:] {
		f := strings.Fields(l)
		if len(f) != 4 || f[1] != "True" || f[2] != "0" {
			t.Errorf("sibling %s line %q: want heap intact and subprocess exit 0", b.ID, l)
		} else if _, err := strconv.Atoi(f[3]); err != nil {
			t.Errorf("sibling %s line %q: sqlite failed: %s", b.ID, l, f[3])
		}
	}
	if !container.Alive(a) {
		t.Errorf("prober fork %s died after its attempts", a.ID)
	}
}

// TestStoppedAndStartedKeepsConfinement: a confined container with limits, stopped and
// started again (restored into a new cgroup), has the same status lines and limits.
func TestStoppedAndStartedKeepsConfinement(t *testing.T) {
	rt := testutil.NewRuntime(t)
	c, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "agent",
		Command: []string{"python3", "-c", counterPy}, Memory: 256 << 20, PidsLimit: 64})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(c) >= 3 })
	want := procStatus(t, c.Pid)
	limits := cgroupFile(t, rt, c, "memory", "memory.limit_in_bytes") + " " + cgroupFile(t, rt, c, "pids", "pids.max") + " " + cgroupFile(t, rt, c, "devices", "devices.list")
	if _, err := fork.Stop(ctx, rt, c, hook.Options{}); err != nil {
		t.Fatal(err)
	}
	c, _ = rt.Containers.Get(c.ID)
	if err := fork.Start(ctx, rt, c); err != nil {
		t.Fatal(err)
	}
	c, _ = rt.Containers.Get(c.ID)
	if got := procStatus(t, c.Pid); got != want {
		t.Errorf("after stop/start:\n%s\nbefore:\n%s", got, want)
	}
	got := cgroupFile(t, rt, c, "memory", "memory.limit_in_bytes") + " " + cgroupFile(t, rt, c, "pids", "pids.max") + " " + cgroupFile(t, rt, c, "devices", "devices.list")
	if got != limits {
		t.Errorf("limits after stop/start %q, before %q", got, limits)
	}
}
