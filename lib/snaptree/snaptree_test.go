package snaptree_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/runtime"
	"github.com/lazyfork/lazyfork/lib/snaptree"
	"github.com/lazyfork/lazyfork/lib/testutil"
	"github.com/lazyfork/lazyfork/lib/tree"
)

func TestMain(m *testing.M) {
	criu.MaybeKdatHelper()
	runtime.MaybeInit()
	runtime.MaybeCgexec()
	os.Exit(m.Run())
}

var ctx = context.Background()

// prog holds a heap of random bytes and answers SIGUSR1 by burning 50 ms of CPU (so
// that its activity is visible) and writing the heap's hash and a query counter to
// /tmp/a. Between queries it uses no CPU at all.
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
signal.signal(signal.SIGUSR1, q)
open('/tmp/state', 'w').write('written before suspend')
open('/tmp/ready', 'w').close()
while True:
    signal.pause()
`

const queryScript = `rm -f /tmp/a; kill -USR1 1; for i in $(seq 400); do [ -f /tmp/a ] && cat /tmp/a && exit 0; sleep 0.05; done; echo no answer >&2; exit 1`

// query returns the heap hash and the query counter of a node's program.
func query(t *testing.T, rt *runtime.Runtime, id string) (string, int) {
	t.Helper()
	c, err := rt.Tree.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	res, err := rt.Exec(ctx, c, runtime.ExecOptions{Args: []string{"sh", "-c", queryScript}, Timeout: 40 * time.Second})
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

func catFile(t *testing.T, rt *runtime.Runtime, id, path string) string {
	t.Helper()
	c, err := rt.Tree.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	res, err := rt.Exec(ctx, c, runtime.ExecOptions{Args: []string{"cat", path}, Timeout: 30 * time.Second})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("cat %s in %s: %v %+v", path, id, err, res)
	}
	return res.Stdout
}

func newTree(t *testing.T, b *snaptree.Budget) (*runtime.Runtime, *snaptree.Manager, *snaptree.Tree) {
	t.Helper()
	rt := testutil.NewRuntime(t)
	m := &snaptree.Manager{RT: rt}
	tr, err := m.Create(ctx, snaptree.CreateOptions{Budget: b, Label: "root",
		Container: runtime.CreateOptions{Image: testutil.DefaultImage, Command: []string{"python3", "-c", prog}}})
	if err != nil {
		t.Fatalf("create tree: %v", err)
	}
	t.Cleanup(func() {
		// Prune the whole tree (the runtime's own cleanup then finds nothing left).
		if _, err := os.Stat(tr.Dir()); err == nil {
			if _, _, err := m.Prune(ctx, tr.ID, tr.Root); err != nil {
				t.Errorf("cleanup prune: %v", err)
			}
		}
	})
	c, _ := rt.Tree.Get(tr.Root)
	testutil.Eventually(t, 20*time.Second, "root program ready", func() bool {
		res, err := rt.Exec(ctx, c, runtime.ExecOptions{Args: []string{"test", "-f", "/tmp/ready"}, Timeout: 10 * time.Second})
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
func cgroupBytes(rt *runtime.Runtime, id string) int64 {
	c, err := rt.Tree.Get(id)
	if err != nil {
		return 0
	}
	cg, err := runtime.Cgroup(c)
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
	c, _ := rt.Tree.Get(tr.Root)
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
	if _, err := rt.Exec(ctx, mustGet(t, rt, a), runtime.ExecOptions{Args: []string{"sh", "-c", "echo only-in-a > /tmp/file-a"}}); err != nil {
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
	ca := mustGet(t, rt, a)
	if ca.State != tree.StateStopped {
		t.Fatalf("a's record is %s", ca.State)
	}
	if _, err := runtime.Cgroup(ca); err == nil {
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

	// Protect / unprotect.
	if p, _, err := m.Protect(ctx, tr.ID, a, true); err != nil || !p.Protected {
		t.Fatalf("protect: %v", err)
	}
	if p, _, err := m.Protect(ctx, tr.ID, a, false); err != nil || p.Protected {
		t.Fatalf("unprotect: %v", err)
	}

	// Prune a's subtree (a and aa): processes, records and packed state go; the rest
	// of the tree keeps running.
	pr, tr, err := m.Prune(ctx, tr.ID, a)
	if err != nil {
		t.Fatalf("prune: %v", err)
	}
	if len(pr.Pruned) != 2 || tr.Nodes[a] != nil || tr.Nodes[aa[0].ID] != nil {
		t.Fatalf("prune result %+v", pr)
	}
	for _, id := range []string{a, aa[0].ID} {
		if _, err := rt.Tree.Get(id); !errors.Is(err, tree.ErrNotFound) {
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

func mustGet(t *testing.T, rt *runtime.Runtime, id string) *tree.Container {
	t.Helper()
	c, err := rt.Tree.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var _ = cgroup.Mode
var _ = fsutil.RemoveAll
