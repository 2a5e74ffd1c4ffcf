package snaptree_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/snaptree"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
	"github.com/lazyfork/lazyfork/lib/testutil/timescale"
)

func TestMain(m *testing.M) { testutil.Main(m) }

var ctx = context.Background()

// prog holds a heap of random bytes and answers SIGUSR1 by burning 50 ms of CPU (so
// that its activity is visible) and writing the heap's hash and a query counter to
// /tmp/a; SIGUSR2 makes it write one byte in each of 2048 pages of the heap (8 MiB
// of private copies in a fork). Between signals it uses no CPU at all.
const prog = `
import os, signal, hashlib, time
heap = bytearray(os.urandom(16 << 20))
n = [0]
def q(*a):
    n[0] += 1
    t = time.process_time()
    while time.process_time() - t < 0.05:
        pass
    open('/tmp/a.tmp', 'w').write('%s %d' % (hashlib.sha256(heap).hexdigest(), n[0]))
    os.rename('/tmp/a.tmp', '/tmp/a')
def d(*a):
    for i in range(0, 8 << 20, 4096):
        heap[i] = (heap[i] + 1) & 255
    open('/tmp/d', 'w').close()
signal.signal(signal.SIGUSR1, q)
signal.signal(signal.SIGUSR2, d)
open('/tmp/state', 'w').write('written before suspend')
open('/tmp/ready', 'w').close()
while True:
    signal.pause()
`

// waitLoops is how many 50 ms polls a script inside a container makes: 20 s, stretched
// on slow machines (make test-v2).
func waitLoops() int { return int(timescale.Scale(20*time.Second) / (50 * time.Millisecond)) }

// execTimeout bounds a command run in a container.
func execTimeout() time.Duration { return timescale.Scale(40 * time.Second) }

func queryScript() string {
	return fmt.Sprintf(`rm -f /tmp/a; kill -USR1 1; for i in $(seq %d); do [ -f /tmp/a ] && cat /tmp/a && exit 0; sleep 0.05; done; echo no answer >&2; exit 1`, waitLoops())
}

// query returns the heap hash and the query counter of a node's program.
func query(t *testing.T, rt *container.Runtime, id string) (string, int) {
	t.Helper()
	c, err := rt.Containers.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	res, err := rt.Exec(ctx, c, container.ExecOptions{Args: []string{"sh", "-c", queryScript()}, Timeout: execTimeout()})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("query %s: %v %+v", id, err, res)
	}
	f := strings.Fields(res.Stdout)
	if len(f) != 2 {
		t.Fatalf("query %s: %q", id, res.Stdout)
	}
	n, _ := strconv.Atoi(f[1])
	return f[0], n
}

// dirty makes a node's program write 8 MiB of its heap.
func dirty(t *testing.T, rt *container.Runtime, id string) {
	t.Helper()
	res, err := rt.Exec(ctx, testutil.MustGet(t, rt, id), container.ExecOptions{Args: []string{"sh", "-c",
		fmt.Sprintf(`rm -f /tmp/d; kill -USR2 1; for i in $(seq %d); do [ -f /tmp/d ] && exit 0; sleep 0.05; done; exit 1`, waitLoops())}, Timeout: execTimeout()})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("dirty %s: %v %+v", id, err, res)
	}
}

func catFile(t *testing.T, rt *container.Runtime, id, path string) string {
	t.Helper()
	c, err := rt.Containers.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	res, err := rt.Exec(ctx, c, container.ExecOptions{Args: []string{"cat", path}, Timeout: execTimeout()})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("cat %s in %s: %v %+v", path, id, err, res)
	}
	return res.Stdout
}

func newTree(t *testing.T, b *snaptree.Budget) (*container.Runtime, *snaptree.Manager, *snaptree.Tree) {
	t.Helper()
	rt := testutil.NewRuntime(t)
	m := &snaptree.Manager{RT: rt}
	tr, err := m.Create(ctx, snaptree.CreateOptions{Budget: b, Label: "root",
		Container: container.CreateOptions{Image: testutil.DefaultImage, Command: []string{"python3", "-c", prog}}})
	if err != nil {
		t.Fatalf("create tree: %v", err)
	}
	testutil.PruneAtEnd(t, m, tr)
	c, _ := rt.Containers.Get(tr.Root)
	testutil.Eventually(t, 20*time.Second, "root program ready", func() bool {
		res, err := rt.Exec(ctx, c, container.ExecOptions{Args: []string{"test", "-f", "/tmp/ready"}, Timeout: execTimeout()})
		return err == nil && res.ExitCode == 0
	})
	return rt, m, tr
}

func nodeOf(t *testing.T, tr *snaptree.Tree, id string) *snaptree.Node {
	t.Helper()
	n := tr.Nodes[id]
	if n == nil {
		t.Fatalf("node %s not in tree %s", id, tr.ID)
	}
	return n
}

// cgroupBytes is a live container's cgroup charge (0 when it has no group).
func cgroupBytes(rt *container.Runtime, id string) int64 {
	c, err := rt.Containers.Get(id)
	if err != nil {
		return 0
	}
	cg, err := container.Cgroup(c)
	if err != nil {
		return 0
	}
	st, err := cg.Stats()
	if err != nil {
		return 0
	}
	return int64(st.MemoryBytes)
}

// tmpfsBytes is everything LazyFork holds on tmpfs for this test.
func tmpfsBytes() int64 {
	var n int64
	_ = filepath.Walk(paths.Run(), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	return n
}

func TestTreeOperations(t *testing.T) {
	rt, m, tr := newTree(t, nil)
	root := nodeOf(t, tr, tr.Root)
	if !root.HasKeyframe || root.Keyframe == "" || root.Generation != 1 || root.State != snaptree.StateLive {
		t.Fatalf("root after create: %+v", root)
	}
	if _, err := fork.LoadSnapshot(root.Keyframe); err != nil {
		t.Fatalf("root keyframe not written at create: %v", err)
	}
	// The root runs inside the tree cgroup.
	c, _ := rt.Containers.Get(tr.Root)
	for k, p := range c.Cgroup {
		if !strings.HasPrefix(p, tr.Cgroup[k]+"/") {
			t.Fatalf("root cgroup %s:%s is not inside the tree's %s", k, p, tr.Cgroup[k])
		}
	}
	h0, n0 := query(t, rt, tr.Root)

	// prepare is idempotent; refresh writes a new generation.
	n, tr, err := m.Prepare(ctx, tr.ID, "", false)
	if err != nil || n.Generation != 1 || n.Keyframe != root.Keyframe {
		t.Fatalf("prepare again: %v %+v", err, n)
	}
	n, tr, err = m.Prepare(ctx, tr.ID, tr.Root, true)
	if err != nil || n.Generation != 2 || n.Keyframe == root.Keyframe {
		t.Fatalf("refresh: %v %+v", err, n)
	}
	if h, k := query(t, rt, tr.Root); h != h0 || k != n0+1 {
		t.Fatalf("root after refresh: hash %s count %d, want %s %d", h, k, h0, n0+1)
	}
	// The refreshed root maps both generations' files (the new one holds only what
	// changed): the budget counts both, which is every byte the tree holds on tmpfs.
	if tr, err = m.Get(ctx, tr.ID); err != nil {
		t.Fatal(err)
	}
	if sh := nodeOf(t, tr, tr.Root).SharedRAMBytes; sh != tr.Usage.TmpfsBytes {
		t.Fatalf("root's shared RAM after a refresh is %d, the tree's memory files hold %d on tmpfs", sh, tr.Usage.TmpfsBytes)
	}

	// A batch of two forks of the root.
	forks, tr, err := m.Fork(ctx, tr.ID, tr.Root, snaptree.ForkOptions{N: 2, Labels: []string{"a", "b"}})
	if err != nil || len(forks) != 2 {
		t.Fatalf("fork: %v", err)
	}
	a, b := forks[0].ID, forks[1].ID
	if nodeOf(t, tr, a).Parent != tr.Root || nodeOf(t, tr, a).Label != "a" {
		t.Fatalf("fork node: %+v", nodeOf(t, tr, a))
	}
	if got := nodeOf(t, tr, tr.Root).Children; len(got) != 2 {
		t.Fatalf("root children %v", got)
	}
	if h, _ := query(t, rt, a); h != h0 {
		t.Fatalf("fork a heap %s, want %s", h, h0)
	}

	// A fork of a fork: the child gets its keyframe first.
	aa, tr, err := m.Fork(ctx, tr.ID, a, snaptree.ForkOptions{N: 1})
	if err != nil {
		t.Fatalf("fork of a fork: %v", err)
	}
	if !nodeOf(t, tr, a).HasKeyframe {
		t.Fatalf("a has no keyframe after its first fork")
	}

	// Suspend a: its state goes to disk, its RAM is freed, it resumes exactly.
	query(t, rt, a)
	ha, na := query(t, rt, a)
	ramBefore := cgroupBytes(rt, a)
	if ramBefore == 0 {
		t.Fatal("a has no cgroup charge before suspend")
	}
	if _, err := rt.Exec(ctx, testutil.MustGet(t, rt, a), container.ExecOptions{Args: []string{"sh", "-c", "echo only-in-a > /tmp/file-a"}}); err != nil {
		t.Fatal(err)
	}
	tmpBefore := tmpfsBytes()
	sn, tr, err := m.Suspend(ctx, tr.ID, a)
	if err != nil {
		t.Fatalf("suspend: %v", err)
	}
	if sn.State != snaptree.StateSuspended || sn.DeltaBytes == 0 || sn.DirtyPages == 0 {
		t.Fatalf("suspended node: %+v", sn)
	}
	ca := testutil.MustGet(t, rt, a)
	if ca.State != store.StateStopped {
		t.Fatalf("a's record is %s", ca.State)
	}
	if _, err := container.Cgroup(ca); err == nil {
		t.Fatalf("a still has a cgroup after suspend")
	}
	if _, err := os.Stat(filepath.Join(paths.Snapshots(), ca.Snapshot)); err == nil {
		t.Fatalf("a's snapshot is still on tmpfs")
	}
	tmpAfter := tmpfsBytes()
	t.Logf("suspend a: cgroup %d -> 0 bytes, tmpfs %d -> %d bytes, on disk %d bytes", ramBefore, tmpBefore, tmpAfter, sn.DiskBytes)
	if tmpAfter > tmpBefore {
		t.Fatalf("tmpfs grew on suspend: %d -> %d", tmpBefore, tmpAfter)
	}
	// Resume: same id, same memory, same files, and it goes on running.
	rn, tr, err := m.Resume(ctx, tr.ID, a)
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	if rn.State != snaptree.StateLive || len(rn.Packed) != 1 || rn.Packed[0].Role != snaptree.RoleKeyframe {
		t.Fatalf("resumed node: %+v", rn)
	}
	if h, k := query(t, rt, a); h != ha || k != na+1 {
		t.Fatalf("a after resume: hash %s count %d, want %s %d", h, k, ha, na+1)
	}
	if got := catFile(t, rt, a, "/tmp/file-a"); got != "only-in-a\n" {
		t.Fatalf("a's file after resume: %q", got)
	}
	if got := catFile(t, rt, a, "/tmp/state"); got != "written before suspend" {
		t.Fatalf("a's /tmp/state after resume: %q", got)
	}

	// Fork from a suspended node: b suspended, forked, stays suspended.
	if _, tr, err = m.Suspend(ctx, tr.ID, b); err != nil {
		t.Fatal(err)
	}
	bf, tr, err := m.Fork(ctx, tr.ID, b, snaptree.ForkOptions{N: 1})
	if err != nil {
		t.Fatalf("fork of suspended b: %v", err)
	}
	if nodeOf(t, tr, b).State != snaptree.StateSuspended || bf[0].Parent != b {
		t.Fatalf("b %s, fork parent %s", nodeOf(t, tr, b).State, bf[0].Parent)
	}
	if h, _ := query(t, rt, bf[0].ID); h != h0 {
		t.Fatalf("fork of suspended b: heap %s, want %s", h, h0)
	}

	// Rollback: a new branch from the root's keyframe, the root untouched.
	rb, tr, err := m.Rollback(ctx, tr.ID, tr.Root, "", "rb")
	if err != nil {
		t.Fatalf("rollback: %v", err)
	}
	if rb.Parent != tr.Root || rb.From != nodeOf(t, tr, tr.Root).Keyframe {
		t.Fatalf("rollback node %+v", rb)
	}
	if h, _ := query(t, rt, rb.ID); h != h0 {
		t.Fatalf("rollback heap %s, want %s", h, h0)
	}

	// A node stopped behind the tree's back (`lazyfork stop`) shows exited and resumes
	// from the snapshot it was stopped into.
	hb, nb := query(t, rt, bf[0].ID)
	if _, err := fork.Stop(ctx, rt, testutil.MustGet(t, rt, bf[0].ID), hook.Options{}); err != nil {
		t.Fatal(err)
	}
	if tr, err = m.Get(ctx, tr.ID); err != nil || nodeOf(t, tr, bf[0].ID).State != snaptree.StateExited {
		t.Fatalf("a stopped node shows %s (%v)", nodeOf(t, tr, bf[0].ID).State, err)
	}
	if _, tr, err = m.Resume(ctx, tr.ID, bf[0].ID); err != nil {
		t.Fatalf("resume of a stopped node: %v", err)
	}
	if h, k := query(t, rt, bf[0].ID); h != hb || k != nb+1 {
		t.Fatalf("stopped node after resume: %s %d, want %s %d", h, k, hb, nb+1)
	}

	// Protect / unprotect.
	if p, _, err := m.Protect(ctx, tr.ID, a, true); err != nil || !p.Protected {
		t.Fatalf("protect: %v", err)
	}
	if p, _, err := m.Protect(ctx, tr.ID, a, false); err != nil || p.Protected {
		t.Fatalf("unprotect: %v", err)
	}

	// Prune a's subtree (a and aa): processes, records and packed state go; the rest
	// of the tree keeps running.
	tmpBeforePrune := tmpfsBytes()
	pa, paa := testutil.MustGet(t, rt, a), testutil.MustGet(t, rt, aa[0].ID)
	pr, tr, err := m.Prune(ctx, tr.ID, a)
	if err != nil {
		t.Fatalf("prune: %v", err)
	}
	// a's packed keyframe goes from disk; their processes' RAM with their cgroups; on
	// tmpfs nothing is left that nothing needs.
	t.Logf("prune a's subtree: tmpfs %d -> %d bytes (reported freed %d), disk freed %d", tmpBeforePrune, tmpfsBytes(), pr.TmpfsFreed, pr.DiskFreed)
	if pr.DiskFreed <= 0 {
		t.Fatalf("pruning a (with a packed keyframe) freed no disk: %+v", pr)
	}
	for _, c := range []*store.Container{pa, paa} {
		if len(c.Cgroup) == 0 {
			t.Fatalf("%s had no cgroup before the prune", c.ID)
		}
		for k, p := range c.Cgroup {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", k, p)); err == nil {
				t.Fatalf("pruned %s's cgroup %s:%s is left", c.ID, k, p)
			}
		}
	}
	if freed, err := snaptree.FreeFamily(ctx, rt, testutil.MustGet(t, rt, tr.Root).Family); err != nil || freed != 0 {
		t.Fatalf("after prune, %d bytes of memory files were still unneeded (%v)", freed, err)
	}
	if len(pr.Pruned) != 2 || tr.Nodes[a] != nil || tr.Nodes[aa[0].ID] != nil {
		t.Fatalf("prune result %+v", pr)
	}
	for _, id := range []string{a, aa[0].ID} {
		if _, err := rt.Containers.Get(id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("pruned %s still recorded: %v", id, err)
		}
		if _, err := os.Stat(snaptree.TreeDirNode(tr.ID, id)); err == nil {
			t.Fatalf("pruned %s still has packed state", id)
		}
	}
	if h, _ := query(t, rt, tr.Root); h != h0 {
		t.Fatalf("root after prune: %s", h)
	}
}

var _ = cgroup.Mode
var _ = fsutil.RemoveAll

// liveRAM is the tree's RAM as the budget sees it.
func liveRAM(tr *snaptree.Tree) int64 {
	var n int64
	for _, x := range tr.Nodes {
		if x.State == snaptree.StateLive {
			n += x.RAMBytes
		}
		n += x.SharedRAMBytes // keyframe files on tmpfs count whatever the node's state
	}
	return n
}

func TestEvictionSuspendsLeastRecentlyActiveUnprotected(t *testing.T) {
	rt, m, tr := newTree(t, nil)
	if _, _, err := m.Protect(ctx, tr.ID, tr.Root, true); err != nil {
		t.Fatal(err)
	}
	forks, tr, err := m.Fork(ctx, tr.ID, tr.Root, snaptree.ForkOptions{N: 2})
	if err != nil {
		t.Fatal(err)
	}
	a, b := forks[0].ID, forks[1].ID
	// The root stays idle (and is the least recently active); a works, then b.
	dirty(t, rt, a)
	dirty(t, rt, b)
	query(t, rt, a)
	if tr, err = m.Get(ctx, tr.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	query(t, rt, b)
	if tr, err = m.Get(ctx, tr.ID); err != nil {
		t.Fatal(err)
	}
	r, na, nb := nodeOf(t, tr, tr.Root), nodeOf(t, tr, a), nodeOf(t, tr, b)
	if !(r.LastActive.Before(na.LastActive) && na.LastActive.Before(nb.LastActive)) {
		t.Fatalf("last active: root %v a %v b %v (want increasing)", r.LastActive, na.LastActive, nb.LastActive)
	}
	// A RAM budget the three live nodes exceed 85% of, and two do not.
	total := liveRAM(tr)
	small := tr.Budget
	// 8% over the threshold: RAM figures move by a few hundred KiB between looks.
	small.MaxRAMBytes = int64(float64(total) / 0.85 * 0.92)
	t.Logf("live RAM root %d a %d b %d = %d; budget %d", r.RAMBytes, na.RAMBytes, nb.RAMBytes, total, small.MaxRAMBytes)
	var evs []snaptree.Event
	m.OnEvent = func(e snaptree.Event) { evs = append(evs, e) }
	if tr, err = m.SetBudget(ctx, tr.ID, small); err != nil {
		t.Fatalf("set budget: %v", err)
	}
	if got := []string{nodeOf(t, tr, tr.Root).State, nodeOf(t, tr, a).State, nodeOf(t, tr, b).State}; got[0] != snaptree.StateLive || got[1] != snaptree.StateSuspended || got[2] != snaptree.StateLive {
		t.Fatalf("after eviction root, a, b are %v; want live, suspended, live", got)
	}
	evicted := false
	for _, e := range evs {
		if e.Kind == "evict" && len(e.Nodes) == 1 && e.Nodes[0] == a {
			evicted = true
		}
	}
	if !evicted {
		t.Fatalf("no evict event for a: %+v", evs)
	}
	// Evicting again finds nothing to do; the protected root is never chosen.
	if ids, tr2, err := m.Evict(ctx, tr.ID); err != nil || len(ids) != 0 || nodeOf(t, tr2, tr2.Root).State != snaptree.StateLive {
		t.Fatalf("evict again: %v %v", ids, err)
	}
	// A fork that cannot fit even after eviction fails, naming the budget, and changes
	// nothing.
	before := len(tr.Nodes)
	_, tr, err = m.Fork(ctx, tr.ID, b, snaptree.ForkOptions{N: 4})
	var ob *snaptree.OverBudgetError
	if !errors.As(err, &ob) {
		t.Fatalf("fork over budget: %v, want OverBudgetError", err)
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "max_ram_bytes") {
		t.Fatalf("error not one line naming the budget: %q", msg)
	}
	t.Logf("over budget: %v", err)
	if tr, err = m.Get(ctx, tr.ID); err != nil {
		t.Fatal(err)
	}
	if len(tr.Nodes) != before || nodeOf(t, tr, tr.Root).State != snaptree.StateLive {
		t.Fatalf("a failed fork changed the tree: %d nodes (was %d), root %s", len(tr.Nodes), before, nodeOf(t, tr, tr.Root).State)
	}
	// A fork that fits once eviction made room: at max_live 2 with the protected root
	// and b live, forking the root suspends b first.
	roomy := tr.Budget
	roomy.MaxLive, roomy.MaxRAMBytes = 2, 1<<30
	if tr, err = m.SetBudget(ctx, tr.ID, roomy); err != nil {
		t.Fatal(err)
	}
	nf, tr, err := m.Fork(ctx, tr.ID, tr.Root, snaptree.ForkOptions{N: 1})
	if err != nil {
		t.Fatalf("fork that eviction makes room for: %v", err)
	}
	if nodeOf(t, tr, b).State != snaptree.StateSuspended || nodeOf(t, tr, nf[0].ID).State != snaptree.StateLive || tr.Usage.Live != 2 {
		t.Fatalf("after a fork at max_live: b %s, new %s, live %d", nodeOf(t, tr, b).State, nodeOf(t, tr, nf[0].ID).State, tr.Usage.Live)
	}
}

// Suspending every node frees the heap from tmpfs; after a power cut (every process
// killed, tmpfs and cgroups wiped) suspended nodes resume from disk with their memory and
// files; pruning the root frees every byte.
func TestSuspendFreesRAMPowerCutAndPrune(t *testing.T) {
	rt, m, tr := newTree(t, nil)
	forks, tr, err := m.Fork(ctx, tr.ID, tr.Root, snaptree.ForkOptions{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	a := forks[0].ID
	if _, err := rt.Exec(ctx, testutil.MustGet(t, rt, a), container.ExecOptions{Args: []string{"sh", "-c", "echo a-was-here > /tmp/file-a"}}); err != nil {
		t.Fatal(err)
	}
	hr, nr := query(t, rt, tr.Root)
	ha, na := query(t, rt, a)
	if _, tr, err = m.Suspend(ctx, tr.ID, a); err != nil {
		t.Fatalf("suspend a: %v", err)
	}
	ramRoot, tmpBefore := cgroupBytes(rt, tr.Root), tmpfsBytes()
	if _, tr, err = m.Suspend(ctx, tr.ID, tr.Root); err != nil {
		t.Fatalf("suspend root: %v", err)
	}
	tmpAfter := tmpfsBytes()
	t.Logf("suspend root: cgroup %d -> %d bytes; tmpfs %d -> %d bytes; tree on disk %d bytes", ramRoot, cgroupBytes(rt, tr.Root), tmpBefore, tmpAfter, tr.Usage.DiskBytes)
	if cgroupBytes(rt, tr.Root) != 0 {
		t.Fatal("root still charged after suspend")
	}
	// The heap is in the root's cgroup (written after its keyframe) or in memory files:
	// either way it is gone from RAM.
	if freed := ramRoot + tmpBefore - tmpAfter; freed < 16<<20 {
		t.Fatalf("suspending the last live node freed %d bytes of cgroup and tmpfs, want the 16 MiB heap", freed)
	}
	if tr.Usage.Live != 0 {
		t.Fatalf("usage %+v after suspending everything", tr.Usage)
	}

	// Power cut: tmpfs state and the tree cgroup vanish.
	for _, d := range []string{paths.Snapshots(), paths.Families()} {
		if err := fsutil.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
	}
	if cg, err := cgroup.LoadOwned(tr.Cgroup); err == nil {
		if err := cg.Remove(); err != nil {
			t.Fatal(err)
		}
	}
	if _, tr, err = m.Resume(ctx, tr.ID, a); err != nil {
		t.Fatalf("resume a after power cut: %v", err)
	}
	if h, k := query(t, rt, a); h != ha || k != na+1 {
		t.Fatalf("a after power cut: %s %d, want %s %d", h, k, ha, na+1)
	}
	if got := catFile(t, rt, a, "/tmp/file-a"); got != "a-was-here\n" {
		t.Fatalf("a's file after power cut: %q", got)
	}
	if _, tr, err = m.Resume(ctx, tr.ID, tr.Root); err != nil {
		t.Fatalf("resume root after power cut: %v", err)
	}
	if h, k := query(t, rt, tr.Root); h != hr || k != nr+1 {
		t.Fatalf("root after power cut: %s %d, want %s %d", h, k, hr, nr+1)
	}

	// Prune the root: nothing of the tree is left anywhere.
	res, _, err := m.Prune(ctx, tr.ID, tr.Root)
	if err != nil {
		t.Fatalf("prune root: %v", err)
	}
	if !res.TreeRemoved || len(res.Pruned) != 2 {
		t.Fatalf("prune result %+v", res)
	}
	t.Logf("prune root: freed tmpfs %d, disk %d", res.TmpfsFreed, res.DiskFreed)
	if _, err := os.Stat(tr.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("tree dir left: %v", err)
	}
	if n := tmpfsFiles(t); len(n) > 0 {
		t.Fatalf("tmpfs files left after pruning the root: %v", n)
	}
	if ents, _ := os.ReadDir(paths.Layers()); len(ents) > 0 {
		t.Fatalf("layers left: %d", len(ents))
	}
	if all, _ := rt.Containers.List(); len(all) > 0 {
		t.Fatalf("records left: %d", len(all))
	}
	if _, err := cgroup.LoadOwned(tr.Cgroup); err == nil {
		t.Fatalf("tree cgroup left")
	}
}

// tmpfsFiles lists snapshot and memory files left on tmpfs.
func tmpfsFiles(t *testing.T) []string {
	var out []string
	for _, d := range []string{paths.Snapshots(), paths.Families()} {
		_ = filepath.Walk(d, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				out = append(out, p)
			}
			return nil
		})
	}
	return out
}

// A forged tree.json (packed state outside the tree, a foreign cgroup) is refused before
// anything is touched.
func TestForgedTreeDocument(t *testing.T) {
	root := t.TempDir()
	testutil.SetRoots(t, root, t.TempDir())
	id := "t0123456789ab"
	good := func() map[string]any {
		return map[string]any{"kind": snaptree.Kind, "version": snaptree.Version, "id": id, "root": "0123456789ab",
			"cgroup": map[string]string{"memory": "/lazyfork/tree-0123456789ab"},
			"nodes": map[string]any{"0123456789ab": map[string]any{"id": "0123456789ab", "state": "suspended",
				"packed": []map[string]any{{"snapshot": "s0123456789ab", "role": "suspend", "family": "s0123456789ab",
					"files": []string{"x.mem"}, "dir": filepath.Join(root, "trees", id, "nodes", "0123456789ab", "s0123456789ab")}}}}}
	}
	m := &snaptree.Manager{RT: &container.Runtime{}}
	write := func(doc map[string]any) {
		if err := os.MkdirAll(filepath.Join(root, "trees", id), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := fsutil.WriteJSON(filepath.Join(root, "trees", id, "tree.json"), doc); err != nil {
			t.Fatal(err)
		}
	}
	write(good())
	if _, err := m.List(); err != nil {
		t.Fatalf("a good document refused: %v", err)
	}
	packed := func(d map[string]any) map[string]any {
		return d["nodes"].(map[string]any)["0123456789ab"].(map[string]any)["packed"].([]map[string]any)[0]
	}
	cases := map[string]func(d map[string]any){
		"packed dir /etc":   func(d map[string]any) { packed(d)["dir"] = "/etc" },
		"packed file ../x":  func(d map[string]any) { packed(d)["files"] = []string{"../../../etc/passwd"} },
		"family ../":        func(d map[string]any) { packed(d)["family"] = "../x" },
		"foreign cgroup":    func(d map[string]any) { d["cgroup"] = map[string]string{"memory": "/system.slice"} },
		"node id traversal": func(d map[string]any) { d["nodes"] = map[string]any{"../x": map[string]any{"id": "../x"}} },
		"member id traversal": func(d map[string]any) {
			d["nodes"].(map[string]any)["0123456789ab"].(map[string]any)["member_ids"] = []string{"0123456789ab", "../../x"}
		},
		"member list without its leader first": func(d map[string]any) {
			d["nodes"].(map[string]any)["0123456789ab"].(map[string]any)["member_ids"] = []string{"aaaaaaaaaaaa", "0123456789ab"}
		},
		"other id": func(d map[string]any) { d["id"] = "t111111111111" },
	}
	for name, mutate := range cases {
		d := good()
		mutate(d)
		write(d)
		_, err := m.Get(ctx, id)
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error not one line: %q", name, err)
		}
	}
}

// Adopt a running container (it moves into the tree cgroup, whose limits derive from
// the budget, and keeps its memory); rollback from a suspended node's packed keyframe;
// drop suspends the live nodes and keeps the state; a dropped tree refuses operations
// but can be pruned.
func TestAdoptRollbackSuspendedDrop(t *testing.T) {
	rt := testutil.NewRuntime(t)
	m := &snaptree.Manager{RT: rt}
	c, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "adoptee", Command: []string{"python3", "-c", prog}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "program ready", func() bool {
		res, err := rt.Exec(ctx, c, container.ExecOptions{Args: []string{"test", "-f", "/tmp/ready"}, Timeout: execTimeout()})
		return err == nil && res.ExitCode == 0
	})
	h0, n0 := query(t, rt, c.ID)
	b := snaptree.DefaultBudget()
	b.MaxLive, b.MaxRAMBytes = 4, 512<<20
	tr, err := m.Adopt(ctx, "adoptee", snaptree.CreateOptions{Name: "adopted", Budget: &b})
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	testutil.PruneAtEnd(t, m, tr)
	if tr.Root != c.ID || !nodeOf(t, tr, c.ID).HasKeyframe {
		t.Fatalf("adopted tree: %+v", tr)
	}
	c = testutil.MustGet(t, rt, c.ID)
	for k, p := range c.Cgroup {
		if !strings.HasPrefix(p, tr.Cgroup[k]+"/") {
			t.Fatalf("adopted container's cgroup %s:%s is not inside the tree's %s", k, p, tr.Cgroup[k])
		}
	}
	if h, n := query(t, rt, c.ID); h != h0 || n != n0+1 {
		t.Fatalf("adopted container: %s %d, want %s %d", h, n, h0, n0+1)
	}
	// The tree cgroup's limits derive from the budget.
	tcg, err := cgroup.LoadOwned(tr.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	if !tcg.V2 {
		for file, want := range map[string]int64{
			filepath.Join("/sys/fs/cgroup/memory", tr.Cgroup["memory"], "memory.limit_in_bytes"): b.MaxRAMBytes + snaptree.CgroupHeadroom,
			filepath.Join("/sys/fs/cgroup/pids", tr.Cgroup["pids"], "pids.max"):                  int64(b.MaxLive) * snaptree.PidsPerLive,
		} {
			got, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(string(got)) != strconv.FormatInt(want, 10) {
				t.Errorf("%s = %s, want %d", file, got, want)
			}
		}
	}
	if _, err := m.Adopt(ctx, "adoptee", snaptree.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "already") {
		t.Fatalf("adopting a tree's node again: %v", err)
	}

	// Two forks of the same tree at once: the tree's lock serialises them, both land.
	errs := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func() { _, _, err := m.Fork(ctx, tr.ID, tr.Root, snaptree.ForkOptions{N: 1}); errs <- err }()
	}
	for i := 0; i < 2; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent fork: %v", err)
		}
	}
	if tr, err = m.Get(ctx, tr.ID); err != nil || len(tr.Nodes) != 3 || len(nodeOf(t, tr, tr.Root).Children) != 2 {
		t.Fatalf("after two concurrent forks: %v %d nodes", err, len(tr.Nodes))
	}
	for _, k := range nodeOf(t, tr, tr.Root).Children {
		if _, _, err := m.Prune(ctx, tr.ID, k); err != nil {
			t.Fatal(err)
		}
	}

	// Rollback from a suspended node: its keyframe comes back from disk.
	if _, tr, err = m.Suspend(ctx, tr.ID, tr.Root); err != nil {
		t.Fatal(err)
	}
	kf := nodeOf(t, tr, tr.Root).Keyframe
	if _, err := os.Stat(filepath.Join(paths.Snapshots(), kf)); err == nil {
		t.Fatalf("the suspended root's keyframe stayed on tmpfs")
	}
	rb, tr, err := m.Rollback(ctx, tr.ID, tr.Root, "branch", "")
	if err != nil {
		t.Fatalf("rollback of a suspended node: %v", err)
	}
	if rb.From != kf || rb.Name != "branch" {
		t.Fatalf("rollback node %+v", rb)
	}
	if h, _ := query(t, rt, rb.ID); h != h0 {
		t.Fatalf("rollback heap %s, want %s", h, h0)
	}

	// Drop: the live branch is suspended, the state stays, the tree refuses operations.
	res, tr, err := m.Drop(ctx, tr.ID)
	if err != nil {
		t.Fatalf("drop: %v", err)
	}
	if len(res.Suspended) != 1 || res.Suspended[0] != rb.ID || res.Dir != tr.Dir() || !tr.Dropped {
		t.Fatalf("drop result %+v", res)
	}
	if _, err := os.Stat(filepath.Join(res.Dir, "tree.json")); err != nil {
		t.Fatal(err)
	}
	if _, err := cgroup.LoadOwned(tr.Cgroup); err == nil {
		t.Fatal("tree cgroup left after drop")
	}
	if _, _, err := m.Resume(ctx, tr.ID, rb.ID); !errors.Is(err, snaptree.ErrDropped) {
		t.Fatalf("resume in a dropped tree: %v", err)
	}
	if all, _ := m.List(); len(all) != 1 || !all[0].Dropped {
		t.Fatalf("list after drop: %+v", all)
	}
}
