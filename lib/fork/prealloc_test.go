package fork_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// A source's first fork allocates its memory file's pages before the freeze and the
// dump's page server writes into them: the swapped source and the fork see the heap as
// it was, the family holds the heap once (what was allocated but not dumped is punched
// out, and so are pages of zeros), and no preallocated file is left. The source also maps 1 GiB it only read (the shared zero
// page, present in its page tables): that must not be allocated, and the whole stays
// under the anonymous memory its cgroup is charged for.
func TestFirstSwapWritesIntoPreallocatedPages(t *testing.T) {
	rt := testutil.NewRuntime(t)
	prog := `
import os, mmap, time, hashlib
heap = bytearray(os.urandom(1 << 20)) * 64
zeroed = bytearray(8 << 20)
zeroed[:] = bytes(8 << 20)  # written zeros: present pages, dumped
zeros = mmap.mmap(-1, 1 << 30, flags=mmap.MAP_PRIVATE)
s = sum(zeros[i] for i in range(0, 1 << 30, 4096))
print("ready", s, flush=True)
while True:
    open("/tmp/digest.tmp", "w").write(hashlib.sha1(heap).hexdigest())
    os.rename("/tmp/digest.tmp", "/tmp/digest")
    time.sleep(0.2)
`
	src := create(t, rt, "prealloc", "python3", "-c", prog)
	testutil.Eventually(t, 60*time.Second, "heap to fill", func() bool { return len(logLines(src)) > 0 })
	testutil.Eventually(t, 60*time.Second, "digest", func() bool { return tryExec(rt, src, "cat", "/tmp/digest") != "" })
	digest := execOut(t, rt, src, "cat", "/tmp/digest")
	cg, err := cgroup.LoadOwned(src.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	st, err := cg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// Huge pages however slowly fresh ones come (by default the making stops once one is
	// slow: memfile.TestPreallocateStopsMakingSlowHugePages), so that what follows holds
	// on this VM, whose fresh huge pages are often slow.
	yes := true
	forks, s, err := fork.Fork(ctx, rt, src, fork.Options{HugePages: &yes, RestoreOptions: fork.RestoreOptions{N: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Swap || s.Memfile == nil {
		t.Fatalf("snapshot %+v: not a swap's, or not rewritten", s)
	}
	if b := s.Dump.PreallocBytes; b < 64<<20 || uint64(b) > st.Rss+(8<<20) {
		t.Errorf("preallocated %d MB; want the 64 MB heap, and at most the group's anonymous memory (%d MB) and a little growth", b>>20, st.Rss>>20)
	}
	t.Logf("preallocated %d MB (%d huge pages), group anonymous memory %d MB, family %d MB", s.Dump.PreallocBytes>>20, s.Dump.PreallocHugePages, st.Rss>>20, fork.FamilyBytes(s.Family)>>20)
	// The 64 MiB heap and the 8 MiB of zeros: 36 stretches, less the heap's ends.
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/shmem_enabled"); err == nil && (s.Dump.PreallocHugePages < 32 || s.Dump.PreallocHugeSlow) {
		t.Errorf("%d huge pages preallocated, want the heap's dense 2 MiB stretches", s.Dump.PreallocHugePages)
	}
	// CRIU 4.1 (a distribution's, the v2 guest's) dumps into pages images as ever.
	if wide := criu.SpeaksWidePageServer(ctx, rt.CRIU); s.Dump.PagesPlaced != wide {
		t.Errorf("pages sent to the page server: %v, want %v (criu 4.2 or later: %v)", s.Dump.PagesPlaced, wide, wide)
	}
	if s.Memfile.PreallocFiles != 1 {
		t.Errorf("%d memory files written into preallocated pages, want 1", s.Memfile.PreallocFiles)
	}
	ents, _ := os.ReadDir(s.FamilyDir)
	for _, e := range ents {
		if strings.Contains(e.Name(), "-prealloc-") {
			t.Errorf("left %s in the family directory", e.Name())
		}
	}
	// The 8 MiB of written zeros are holes, as a rewrite from pages images leaves them.
	if fb := fork.FamilyBytes(s.Family); fb < 64<<20 || fb > 72<<20 {
		t.Errorf("family files hold %d MB, want the 64 MB heap once and no zero pages", fb>>20)
	}
	cur, err := rt.Containers.Get(src.ID)
	if err != nil {
		t.Fatal(err)
	}
	f, err := rt.Containers.Get(forks[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{cur.ID, f.ID} {
		rec, _ := rt.Containers.Get(c)
		// A digest computed after the fork: the file is rewritten every 0.2 s.
		time.Sleep(500 * time.Millisecond)
		if d := execOut(t, rt, rec, "cat", "/tmp/digest"); d != digest {
			t.Errorf("%s reads a heap with digest %s, want %s", c, d, digest)
		}
		// The heap's dense 2 MiB stretches were preallocated as huge pages: wherever the
		// kernel has huge tmpfs pages, the source and the fork, both reading their heap
		// every 0.2 s, map it without page tables.
		if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/shmem_enabled"); err == nil {
			kb := rollupKB(t, rec.Pid, "ShmemPmdMapped:")
			if kb < 48<<10 {
				t.Errorf("%s maps %d kB of tmpfs files in huge pages, want most of its 64 MB heap", c, kb)
			}
			t.Logf("%s maps %d kB in huge pages", c, kb)
		}
	}
}

// rollupKB reads a field of /proc/pid/smaps_rollup, in kB.
func rollupKB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/smaps_rollup", field, pid)
	return 0
}
