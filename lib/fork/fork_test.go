package fork_test

import (
	"context"
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
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
	"github.com/lazyfork/lazyfork/lib/testutil/timescale"
)

func TestMain(m *testing.M) { testutil.Main(m) }

var ctx = context.Background()

const counterPy = "import itertools, time\nfor i in itertools.count():\n    print(i, flush=True)\n    time.sleep(0.1)\n"

func create(t *testing.T, rt *container.Runtime, name string, cmd ...string) *store.Container {
	t.Helper()
	c, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: name, Command: cmd})
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return c
}

func doFork(t *testing.T, rt *container.Runtime, c *store.Container, n int, names ...string) []*store.Container {
	t.Helper()
	return doForkWith(t, rt, c, fork.Options{RestoreOptions: fork.RestoreOptions{N: n, Names: names}})
}

func doForkWith(t *testing.T, rt *container.Runtime, c *store.Container, o fork.Options) []*store.Container {
	t.Helper()
	forks, _, err := fork.Fork(ctx, rt, c, o)
	if err != nil {
		t.Fatalf("fork %s: %v", c.ID, err)
	}
	out := make([]*store.Container, len(forks))
	for i, f := range forks {
		if out[i], err = rt.Containers.Get(f.ID); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func logLines(c *store.Container) []string {
	b, _ := os.ReadFile(container.LogPath(c))
	return strings.Fields(string(b))
}

func lastInt(c *store.Container) int {
	b, _ := os.ReadFile(container.LogPath(c))
	return testutil.LastInt(string(b))
}

func execOut(t *testing.T, rt *container.Runtime, c *store.Container, args ...string) string {
	t.Helper()
	res, err := rt.Exec(ctx, c, container.ExecOptions{Args: args, Timeout: timescale.Scale(30 * time.Second)})
	if err != nil {
		t.Fatalf("exec %v in %s: %v", args, c.ID, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec %v in %s: exit %d: %s", args, c.ID, res.ExitCode, res.Stderr)
	}
	return strings.TrimSpace(res.Stdout)
}

// tryExec is execOut for polling: it reports failure instead of failing the test.
func tryExec(rt *container.Runtime, c *store.Container, args ...string) string {
	res, err := rt.Exec(ctx, c, container.ExecOptions{Args: args, Timeout: timescale.Scale(30 * time.Second)})
	if err != nil || res.ExitCode != 0 {
		return ""
	}
	return strings.TrimSpace(res.Stdout)
}

func TestForkContinuesCount(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src := create(t, rt, "counter", "python3", "-c", counterPy)
	testutil.Eventually(t, 10*time.Second, "counter to reach 5", func() bool { return lastInt(src) >= 5 })
	forks := doFork(t, rt, src, 3)
	at := lastInt(src)
	for _, f := range forks {
		f := f
		testutil.Eventually(t, 10*time.Second, "fork to count on", func() bool { return lastInt(f) > at+2 })
		lines := logLines(f)
		// The fork's log starts as the parent's (its upper was frozen at the dump) and
		// goes on with no gap and no restart from 0.
		for i, l := range lines {
			if l != strconv.Itoa(i) {
				t.Fatalf("fork %s log line %d = %s: the count did not continue seamlessly", f.ID, i, l)
			}
		}
		if f.Parent != src.ID || f.Depth != 1 {
			t.Errorf("fork record parent=%s depth=%d", f.Parent, f.Depth)
		}
	}
	// The parent keeps running and counting.
	before := lastInt(src)
	testutil.Eventually(t, 5*time.Second, "parent to keep counting", func() bool { return lastInt(src) > before })
	if st := rt.State(src); st != store.StateRunning {
		t.Fatalf("parent state %s", st)
	}
}

// A 256 MB heap forked 20 times as a copy with huge pages (the source keeps its own
// memory; the rewrite, lf-memfile's, allocates the dense stretches as huge pages ahead of
// its copy): forks stay small, the heap lives once on tmpfs in huge pages, and writes
// stay private (memory and files). A swap's huge pages
// (made before the freeze) are TestFirstSwapWritesIntoPreallocatedPages's.
func TestHeapForksShareMemoryAndIsolateWrites(t *testing.T) {
	rt := testutil.NewRuntime(t)
	prog := `
import os, hashlib
heap = bytearray(os.urandom(1 << 20)) * 256
open("/tmp/state", "w").write("parent")
def handle(cmd):
    if cmd[0] == "write":
        heap[12345] = (heap[12345] + 1) % 256
        heap[200 << 20] = 7
    return hashlib.sha1(heap).hexdigest()
print("ready", flush=True)
` + answerLoop
	src := create(t, rt, "big", "python3", "-c", prog)
	testutil.Eventually(t, 60*time.Second, "heap to fill", func() bool { return len(logLines(src)) > 0 })
	// The heap is hashed on request only: 21 processes hashing 256 MiB in a loop starved a
	// slow host (a TCG guest) for the whole package deadline.
	parentDigest := ask(t, rt, src, "d0", "digest")

	yes := true
	recs, snap, err := fork.Fork(ctx, rt, src, fork.Options{Copy: true, HugePages: &yes, RestoreOptions: fork.RestoreOptions{N: 20}})
	if err != nil {
		t.Fatalf("fork %s: %v", src.ID, err)
	}
	forks := make([]*store.Container, len(recs))
	for i, r := range recs {
		forks[i] = testutil.MustGet(t, rt, r.ID)
	}
	fam := forks[0].Family
	famBytes := fork.FamilyBytes(fam)
	if famBytes < 250<<20 || famBytes > 300<<20 {
		t.Errorf("family memory files hold %d MB, want the 256 MB heap once", famBytes>>20)
	}
	// Wherever the kernel has huge tmpfs pages the heap's memory file is made of them
	// (allocated before the copy, not collapsed after it) and forks map it in 2 MiB pages.
	_, thp := os.Stat("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
	huge := thp == nil
	if m := snap.Memfile; m == nil || (huge && m.HugePages < 120) {
		t.Errorf("rewrite %+v: want the 256 MB heap's dense stretches made huge pages", m)
	}
	time.Sleep(time.Second)
	for _, f := range forks {
		in := rt.Inspect(f)
		if in.State != store.StateRunning {
			t.Fatalf("fork %s is %s", f.ID, in.State)
		}
		// A few MB at most: the benchmark holds the exact target.
		if in.MemoryBytes > 8<<20 {
			t.Errorf("fork %s is charged %d kB, want a few MB", f.ID, in.MemoryBytes>>10)
		}
		if d := ask(t, rt, f, "d1", "digest"); d != parentDigest {
			t.Errorf("fork %s heap digest %s, want the parent's %s", f.ID, d, parentDigest)
		}
		// The digest read the whole heap: in 4 KiB pages that takes >= 512 kB of page
		// tables (one 4 KiB table per 2 MiB), in huge pages almost none.
		if pte := vmPTEkB(t, f.Pid); huge && pte >= 256 {
			t.Errorf("fork %s has %d kB of page tables after reading its 256 MB heap: not mapped in huge pages", f.ID, pte)
		}
	}
	// Write in fork 0: memory and a file.
	w := forks[0]
	execOut(t, rt, w, "sh", "-c", "echo fork0 > /tmp/state")
	if d := ask(t, rt, w, "w2", "write"); d == parentDigest {
		t.Errorf("fork0's heap write did not change its digest")
	}
	for _, c := range append([]*store.Container{src}, forks[1:4]...) {
		if d := ask(t, rt, c, "d3", "digest"); d != parentDigest {
			t.Errorf("%s saw fork0's heap write (digest %s)", c.ID, d)
		}
		if s := execOut(t, rt, c, "cat", "/tmp/state"); s != "parent" {
			t.Errorf("%s saw fork0's file write (%q)", c.ID, s)
		}
	}
	if s := execOut(t, rt, w, "cat", "/tmp/state"); s != "fork0" {
		t.Errorf("fork0 lost its own file write (%q)", s)
	}
	if fork.FamilyBytes(fam) > famBytes+(1<<20) {
		t.Errorf("family files grew from %d to %d bytes after a fork's write", famBytes, fork.FamilyBytes(fam))
	}
}

// A hostname the workload set itself (privileged: it may) is its own, and a fork keeps
// it rather than getting its id; the fork's record names it (zdtm utsname failed in every
// fork and plain copy). One LazyFork gave is replaced by the fork's id, as ever
// (TestForksHaveOwnPidNamespaceAndHostname).
func TestForkKeepsHostnameTheWorkloadSet(t *testing.T) {
	rt := testutil.NewRuntime(t)
	const py = `import itertools, socket, time
socket.sethostname("db.example")
for i in itertools.count():
    print(i, socket.gethostname(), flush=True)
    time.sleep(0.1)
`
	src, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "uts", Privileged: true, Command: []string{"python3", "-c", py}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the hostname to be set", func() bool { return strings.HasSuffix(lastLine(src), " db.example") })
	for _, f := range doFork(t, rt, src, 2) {
		if h := execOut(t, rt, f, "hostname"); h != "db.example" || f.Hostname != "db.example" {
			t.Errorf("fork %s: hostname %q, record %q; want the workload's db.example", f.ID, h, f.Hostname)
		}
	}
	if h := execOut(t, rt, testutil.MustGet(t, rt, src.ID), "hostname"); h != "db.example" {
		t.Errorf("source after the fork: hostname %q", h)
	}
}

func TestForksHaveOwnPidNamespaceAndHostname(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src := create(t, rt, "", "python3", "-c", counterPy)
	testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src) >= 1 })
	forks := doFork(t, rt, src, 2)
	seenNS := map[string]bool{}
	for _, c := range append([]*store.Container{src}, forks...) {
		if h := execOut(t, rt, c, "hostname"); h != c.ID {
			t.Errorf("hostname of %s = %q", c.ID, h)
		}
		if p1 := execOut(t, rt, c, "sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline"); !strings.HasPrefix(p1, "python3") {
			t.Errorf("pid 1 of %s is %q", c.ID, p1)
		}
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", c.Pid))
		if err != nil {
			t.Fatal(err)
		}
		if seenNS[ns] {
			t.Errorf("%s shares pid namespace %s", c.ID, ns)
		}
		seenNS[ns] = true
	}
	execOut(t, rt, forks[0], "sh", "-c", "echo mine > /srv/own")
	if _, err := rt.Exec(ctx, forks[1], container.ExecOptions{Args: []string{"cat", "/srv/own"}}); err != nil {
		t.Fatal(err)
	}
	if res, _ := rt.Exec(ctx, forks[1], container.ExecOptions{Args: []string{"cat", "/srv/own"}}); res.ExitCode == 0 {
		t.Errorf("sibling sees fork0's file")
	}
	if res, _ := rt.Exec(ctx, src, container.ExecOptions{Args: []string{"cat", "/srv/own"}}); res.ExitCode == 0 {
		t.Errorf("parent sees fork0's file")
	}
}

// Chains nine deep, a rebase, deleting a middle node, and memory files freed exactly when
// the last user goes.
func TestForkChainRebaseDeleteMiddleAndFree(t *testing.T) {
	rt := testutil.NewRuntime(t)
	// Each generation dirties 8 MB more of a 16 MB heap, so a deep fork's delta passes a
	// quarter of the shared pages and is rebased.
	prog := `
import os, time, itertools
heap = bytearray(os.urandom(16 << 20))
for i in itertools.count():
    print(i, flush=True)
    if os.path.exists("/tmp/dirty"):
        for off in range(0, 8 << 20, 4096):
            heap[off] = (heap[off] + 1) % 256
        os.remove("/tmp/dirty")
    time.sleep(0.1)
`
	root := create(t, rt, "root", "python3", "-c", prog)
	testutil.Eventually(t, 20*time.Second, "root counting", func() bool { return lastInt(root) >= 1 })
	chain := []*store.Container{root}
	rebased := false
	for depth := 1; depth <= 9; depth++ {
		parent := chain[len(chain)-1]
		if depth == 5 {
			execOut(t, rt, parent, "touch", "/tmp/dirty")
			testutil.Eventually(t, 10*time.Second, "dirtying", func() bool {
				res, _ := rt.Exec(ctx, parent, container.ExecOptions{Args: []string{"test", "-e", "/tmp/dirty"}})
				return res != nil && res.ExitCode != 0
			})
		}
		forks, snap, err := fork.Fork(ctx, rt, parent, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1}})
		if err != nil {
			t.Fatalf("fork at depth %d: %v", depth, err)
		}
		if snap.Memfile != nil && snap.Memfile.Rebased {
			rebased = true
		}
		c, err := rt.Containers.Get(forks[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		if c.Depth != depth {
			t.Fatalf("depth %d, want %d", c.Depth, depth)
		}
		chain = append(chain, c)
	}
	if !rebased {
		t.Errorf("no snapshot in the chain was rebased, though one fork dirtied half its heap")
	}
	last := chain[9]
	at := lastInt(last)
	testutil.Eventually(t, 10*time.Second, "depth-9 fork to count", func() bool { return lastInt(last) > at })

	// Delete a middle node: its descendants keep running.
	if err := rt.Delete(chain[4]); err != nil {
		t.Fatal(err)
	}
	if err := fork.GC(rt); err != nil {
		t.Fatal(err)
	}
	for _, c := range chain[5:] {
		n := lastInt(c)
		testutil.Eventually(t, 10*time.Second, "descendant of a deleted node to keep counting", func() bool { return lastInt(c) > n })
		execOut(t, rt, c, "true")
	}
	// A descendant of the deleted node can still be forked (its memory files survive).
	doFork(t, rt, chain[7], 1)

	fam := chain[1].Family
	famDir := filepath.Join(paths.Families(), fam)
	// Delete everything but one fork of the family: the files stay.
	all, _ := rt.Containers.List()
	var keep *store.Container
	for _, c := range all {
		if c.Family == fam && keep == nil {
			keep = c
			continue
		}
		if err := rt.Delete(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := fork.GC(rt); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(famDir); err != nil {
		t.Fatalf("family files removed while %s still maps them", keep.ID)
	}
	doFork(t, rt, keep, 1) // still dumpable: no "ghost file"
	all, _ = rt.Containers.List()
	for _, c := range all {
		if err := rt.Delete(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := fork.GC(rt); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(paths.Families()); len(ents) > 0 {
		t.Errorf("memory files left after the last user went: %v", ents)
	}
	if ents, _ := os.ReadDir(fork.LayersDir()); len(ents) > 0 {
		t.Errorf("frozen layers left after the last user went: %d", len(ents))
	}
	if ents, _ := os.ReadDir(paths.Snapshots()); len(ents) > 0 {
		t.Errorf("snapshots left: %d", len(ents))
	}
}

func TestMultiProcessContainerForks(t *testing.T) {
	rt := testutil.NewRuntime(t)
	prog := `
import os, time, threading, subprocess, itertools, ctypes, json
from concurrent.futures import ThreadPoolExecutor
pool = ThreadPoolExecutor(4)
child = subprocess.Popen(["python3", "-c", "import time\nwhile True: time.sleep(0.1)"])
libc = ctypes.CDLL(None)
for i in itertools.count():
    total = sum(pool.map(lambda x: x * x, range(100)))
    try:
        raise ValueError("tb")
    except ValueError:
        pass
    print(i, total, child.poll() is None, libc.getpid(), json.dumps([i]), flush=True)
    time.sleep(0.1)
`
	src := create(t, rt, "multi", "python3", "-c", prog)
	testutil.Eventually(t, 20*time.Second, "two processes", func() bool { return rt.Inspect(src).Procs == 2 && len(logLines(src)) > 10 })
	forks := doFork(t, rt, src, 2)
	for _, f := range forks {
		f := f
		n := len(logLines(f))
		testutil.Eventually(t, 10*time.Second, "fork to go on", func() bool { return len(logLines(f)) > n+10 })
		if in := rt.Inspect(f); in.Procs != 2 {
			t.Errorf("fork %s has %d processes, want 2", f.ID, in.Procs)
		}
		b, _ := os.ReadFile(container.LogPath(f))
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		lastLine := strings.Fields(lines[len(lines)-1])
		if len(lastLine) < 4 || lastLine[1] != "328350" || lastLine[2] != "True" || lastLine[3] != "1" {
			t.Errorf("fork %s last line %q: want pool sum 328350, child alive, getpid 1", f.ID, lines[len(lines)-1])
		}
		// A new thread and a new subprocess work in the fork.
		out := execOut(t, rt, f, "python3", "-c", "import threading, subprocess; t=threading.Thread(target=print, args=('thr',)); t.start(); t.join(); print(subprocess.check_output(['echo','sub']).decode().strip())")
		if out != "thr\nsub" {
			t.Errorf("fork %s: %q", f.ID, out)
		}
	}
}

func TestStopStartAndForkStopped(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src := create(t, rt, "agent", "python3", "-c", counterPy)
	testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src) >= 3 })
	s, err := fork.Stop(ctx, rt, src, hook.Options{})
	if err != nil {
		t.Fatal(err)
	}
	src, _ = rt.Containers.Get(src.ID)
	if st := rt.State(src); st != store.StateStopped {
		t.Fatalf("state after stop %s", st)
	}
	if in := rt.Inspect(src); in.Procs != 0 || in.MemoryBytes != 0 {
		t.Errorf("stopped container holds %d procs, %d bytes", in.Procs, in.MemoryBytes)
	}
	stoppedAt := lastInt(src)
	if s.State != stage.SnapMemfiled {
		t.Errorf("stop snapshot is %s", s.State)
	}
	kids := doFork(t, rt, src, 1)
	testutil.Eventually(t, 10*time.Second, "fork of stopped to count", func() bool { return lastInt(kids[0]) > stoppedAt+2 })
	if err := fork.Start(ctx, rt, src); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "restarted to count", func() bool { return lastInt(src) > stoppedAt+2 })
	if h := execOut(t, rt, src, "hostname"); h != src.ID {
		t.Errorf("restarted hostname %q", h)
	}
}

func TestShareMovesSourceOntoSnapshot(t *testing.T) {
	rt := testutil.NewRuntime(t)
	prog := "import os, time, itertools\nheap = bytearray(os.urandom(64 << 20))\nfor i in itertools.count():\n    print(i, flush=True)\n    time.sleep(0.1)\n"
	src := create(t, rt, "shared", "python3", "-c", prog)
	testutil.Eventually(t, 30*time.Second, "counting", func() bool { return lastInt(src) >= 3 })
	if m := rt.Inspect(src).MemoryBytes; m < 64<<20 {
		t.Fatalf("source holds %d MB before, want its 64 MB heap", m>>20)
	}
	forks, _, err := fork.Fork(ctx, rt, src, fork.Options{Share: true, RestoreOptions: fork.RestoreOptions{N: 2}})
	if err != nil {
		t.Fatal(err)
	}
	src, _ = rt.Containers.Get(src.ID)
	at := lastInt(src)
	testutil.Eventually(t, 10*time.Second, "source to count on after the move", func() bool { return lastInt(src) > at+2 })
	for i, l := range logLines(src) {
		if l != strconv.Itoa(i) {
			t.Fatalf("source log line %d = %s: the move broke its count", i, l)
		}
	}
	if h := execOut(t, rt, src, "hostname"); h != src.ID {
		t.Errorf("source hostname after the move %q", h)
	}
	// The heap now lives once, in the family files, for parent and forks alike.
	if m := rt.Inspect(src).MemoryBytes; m > 16<<20 {
		t.Errorf("source holds %d MB after --share, want a few MB", m>>20)
	}
	if src.Family == "" || src.Family != forks[0].Family {
		t.Errorf("source family %q, forks' %q", src.Family, forks[0].Family)
	}
	// And it can be forked again (a delta on the same family).
	if _, _, err := fork.Fork(ctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1}}); err != nil {
		t.Fatal(err)
	}
}

func vmPTEkB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmPTE:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatalf("no VmPTE in /proc/%d/status", pid)
	return 0
}
