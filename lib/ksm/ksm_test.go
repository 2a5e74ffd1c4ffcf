package ksm_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/ksm"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

var ctx = context.Background()

// workload fills a 16 MiB buffer (in the snapshot), then, once /tmp/go exists, writes
// new contents into every page: the same bytes in every fork, different per page, so
// only pages of different forks are identical.
const workload = `import os, time
N = 4096
buf = bytearray(N * 4096)
for i in range(N):
    buf[i*4096:(i+1)*4096] = (b'%08d' % i) * 512
print('ready', flush=True)
while not os.path.exists('/tmp/go'):
    time.sleep(0.1)
for i in range(N):
    buf[i*4096:(i+1)*4096] = (b'%08x' % (i * 7 + 1)) * 512
print('written', flush=True)
while True:
    time.sleep(1)
`

func logHas(c *store.Container, word string) bool {
	b, _ := os.ReadFile(container.LogPath(c))
	return strings.Contains(string(b), word)
}

// forks creates a container running the workload and forks it twice with ksm as given;
// each fork then rewrites its buffer.
func forks(t *testing.T, useKSM bool) []*store.Container {
	t.Helper()
	rt := testutil.NewRuntime(t)
	src, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Command: []string{"python3", "-c", workload}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the workload to fill its buffer", func() bool { return logHas(src, "ready") })
	made, _, err := fork.Fork(ctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 2}, KSM: useKSM})
	if err != nil {
		t.Fatal(err)
	}
	var out []*store.Container
	for _, f := range made {
		c, err := rt.Containers.Get(f.ID)
		if err != nil {
			t.Fatal(err)
		}
		res, err := rt.Exec(ctx, c, container.ExecOptions{Args: []string{"touch", "/tmp/go"}, Timeout: 30 * time.Second})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec touch in %s: %v %+v", c.ID, err, res)
		}
		out = append(out, c)
	}
	for _, c := range out {
		testutil.Eventually(t, 30*time.Second, "fork "+c.ID+" to rewrite its buffer", func() bool { return logHas(c, "written") })
	}
	return out
}

// mergeableVMAs counts the VMAs of c's processes whose VmFlags carry mg (MADV_MERGEABLE).
func mergeableVMAs(t *testing.T, c *store.Container) int {
	t.Helper()
	cg, err := cgroup.LoadOwned(cgroup.Paths(c.Cgroup))
	if err != nil {
		t.Fatal(err)
	}
	pids, err := cg.Procs()
	if err != nil || len(pids) == 0 {
		t.Fatalf("processes of %s: %v %v", c.ID, pids, err)
	}
	return ksm.MergeableVMAs(pids)
}

// Two forks of a ksm tree: their memory is mergeable and, with ksmd running, the pages
// they wrote identically are merged.
func TestForksMergeWithKSM(t *testing.T) {
	testutil.RequireRoot(t)
	if err := ksm.Available(); err != nil {
		t.Fatal(err)
	}
	fs := forks(t, true)
	for _, c := range fs {
		if n := mergeableVMAs(t, c); n == 0 {
			t.Fatalf("fork %s has no MADV_MERGEABLE mapping", c.ID)
		}
	}
	testutil.SetKnob(t, filepath.Join(ksm.SysDir, "pages_to_scan"), "1000") // a full pass of the forks in about a second
	testutil.SetKnob(t, filepath.Join(ksm.SysDir, "run"), "1")
	merged := map[string]int64{}
	testutil.Eventually(t, 90*time.Second, "ksmd to merge pages of both forks", func() bool {
		for _, c := range fs {
			n, err := ksm.CgroupMergingPages(cgroup.Paths(c.Cgroup))
			if err != nil {
				t.Fatal(err)
			}
			merged[c.ID] = n
		}
		return merged[fs[0].ID] > 0 && merged[fs[1].ID] > 0
	})
	st, err := ksm.Read()
	if err != nil || st.Run != 1 || st.PagesSharing == 0 {
		t.Fatalf("ksm state %+v %v", st, err)
	}
	t.Logf("merged pages per fork %v; ksmd %d sharing %d shared", merged, st.PagesSharing, st.PagesShared)
}

// Without the option, no mapping of a fork is mergeable.
func TestKSMOffByDefault(t *testing.T) {
	testutil.RequireRoot(t)
	for _, c := range forks(t, false) {
		if n := mergeableVMAs(t, c); n != 0 {
			t.Fatalf("fork %s of a tree without ksm has %d MADV_MERGEABLE mappings", c.ID, n)
		}
		if n, err := ksm.CgroupMergingPages(cgroup.Paths(c.Cgroup)); err != nil || n != 0 {
			t.Fatalf("fork %s: %d merged pages (%v)", c.ID, n, err)
		}
	}
}

// A ksm tree's keyframe (fork.Prepare with KSM) moves the container onto memory files
// mapped mergeable.
func TestPrepareKSM(t *testing.T) {
	rt := testutil.NewRuntime(t)
	c, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Command: []string{"python3", "-c", workload}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the workload to fill its buffer", func() bool { return logHas(c, "ready") })
	if n := mergeableVMAs(t, c); n != 0 {
		t.Fatalf("%d mergeable mappings before the keyframe", n)
	}
	if _, err := fork.Prepare(ctx, rt, c, fork.PrepareOptions{KSM: true}); err != nil {
		t.Fatal(err)
	}
	if c, err = rt.Containers.Get(c.ID); err != nil {
		t.Fatal(err)
	}
	if n := mergeableVMAs(t, c); n == 0 {
		t.Fatal("no mergeable mapping after a ksm keyframe")
	}
}
