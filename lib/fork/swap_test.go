package fork_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// sqliteCounter writes a row per step through one connection held across forks: SQLite
// checks the database file's inode number on every write.
const sqliteCounter = `import sqlite3, time, itertools
db = sqlite3.connect("/srv/count.db"); db.execute("create table if not exists t(i)"); db.commit()
for i in itertools.count():
    try:
        db.execute("insert into t values (?)", (i,)); db.commit()
        print(i, db.execute("select count(*) from t").fetchone()[0], flush=True)
    except Exception as e:
        print("ERR", e, flush=True)
    time.sleep(0.1)
`

// The first fork of a container moves it onto its snapshot: it keeps its id, name,
// hostname and count, gets new host pids, and its files keep their inode numbers, so an
// SQLite connection held across the fork goes on writing, in the source and in the fork.
func TestForkSwapsSourceOntoSnapshot(t *testing.T) {
	rt := testutil.NewRuntime(t)
	if err := os.MkdirAll("/tmp", 0o755); err != nil {
		t.Fatal(err)
	}
	src := create(t, rt, "swapped", "sh", "-c", "mkdir -p /srv && exec python3 -c '"+strings.ReplaceAll(sqliteCounter, "'", `'"'"'`)+"'")
	testutil.Eventually(t, 10*time.Second, "the source to count", func() bool { return len(lines(src)) > 3 })
	oldPid, oldID, oldHost := src.Pid, src.ID, src.Hostname
	oldCg := src.Cgroup
	f := doFork(t, rt, src, 1)[0]
	cur, err := rt.Containers.Get(oldID)
	if err != nil {
		t.Fatal(err)
	}
	if cur.Pid == oldPid || cur.ID != oldID || cur.Name != "swapped" || cur.Hostname != oldHost || cur.Family == "" {
		t.Fatalf("after the swap: pid %d (was %d), id %s, name %s, hostname %s, family %q", cur.Pid, oldPid, cur.ID, cur.Name, cur.Hostname, cur.Family)
	}
	if h := execOut(t, rt, cur, "hostname"); h != oldHost {
		t.Errorf("the swapped source's hostname is %q, want %q", h, oldHost)
	}
	if _, err := os.Stat("/proc/" + itoa(oldPid)); err == nil {
		t.Errorf("the old source process %d is still there", oldPid)
	}
	if _, err := cgroup.LoadOwned(oldCg); err == nil {
		if cg, _ := cgroup.LoadOwned(oldCg); cg != nil {
			if procs, _ := cg.Procs(); len(procs) > 0 {
				t.Errorf("the old cgroup still holds %v", procs)
			}
		}
	}
	for _, c := range []string{cur.ID, f.ID} {
		c := c
		rec, _ := rt.Containers.Get(c)
		n := len(lines(rec))
		testutil.Eventually(t, 10*time.Second, c+" to go on writing", func() bool { return len(lines(rec)) > n+5 })
		l := lines(rec)
		for _, line := range l[n:] {
			if strings.HasPrefix(line, "ERR") {
				t.Fatalf("%s: %s (the database's inode changed under the held connection)", c, line)
			}
		}
	}
	// The count went on with no gap and no restart in the source.
	prev := -1
	for _, line := range lines(cur) {
		fs := strings.Fields(line)
		if len(fs) == 2 {
			n := atoi(fs[0])
			if prev >= 0 && n != prev+1 {
				t.Fatalf("source count jumped from %d to %d", prev, n)
			}
			prev = n
		}
	}
	// A second fork leaves the source where it is (it maps the family already): only
	// what it changed since is dumped.
	pid := cur.Pid
	doFork(t, rt, cur, 1)
	again, _ := rt.Containers.Get(oldID)
	if again.Pid != pid {
		t.Errorf("a second fork moved the source again (pid %d -> %d)", pid, again.Pid)
	}
}

// A restore that fails during the swap leaves the old source running where it was, with
// its files, its pid and its count: nothing lost, and nothing left over.
func TestSwapFailureLeavesSourceRunning(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src := create(t, rt, "keep", "python3", "-c", counterPy)
	testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src) >= 3 })
	if err := os.WriteFile(filepath.Join(src.Upper, "precious"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := leftovers(t, rt.Containers)
	pid := src.Pid
	s, err := fork.Dump(ctx, rt, src, fork.DumpOptions{Swap: true})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Swap {
		t.Fatal("the dump did not leave the source frozen for a swap")
	}
	at := lastInt(src)
	time.Sleep(300 * time.Millisecond)
	if lastInt(src) != at {
		t.Error("the source ran on between the swap dump and the swap")
	}
	m, err := fork.Memfile(ctx, s, fork.MemfileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The restore of the new source cannot open its memory files.
	files, _ := filepath.Glob(filepath.Join(m.FamilyDir, "*.mem"))
	for _, f := range files {
		os.Remove(f)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = fork.Swap(cctx, rt, src, m, nil)
	if err == nil {
		t.Fatal("swap succeeded without memory files")
	}
	if !strings.Contains(err.Error(), "goes on as it was") {
		t.Errorf("error does not say the source was kept: %v", err)
	}
	cur, _ := rt.Containers.Get(src.ID)
	if cur.Pid != pid || src.Pid != pid {
		t.Fatalf("after a failed swap the source is pid %d (record %d), want %d", src.Pid, cur.Pid, pid)
	}
	if b, err := os.ReadFile(filepath.Join(src.Upper, "precious")); err != nil || string(b) != "data" {
		t.Errorf("the source's upper was not put back: %v", err)
	}
	testutil.Eventually(t, 10*time.Second, "the old source to count on", func() bool { return lastInt(src) > at+3 })
	if err := fork.RemoveSnapshot(m); err != nil {
		t.Fatal(err)
	}
	if err := fork.GC(rt); err != nil {
		t.Fatal(err)
	}
	if after := leftovers(t, rt.Containers); after != before {
		t.Errorf("a failed swap left things behind:\n before %s\n after  %s", before, after)
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// The process running a fork dies (SIGKILL) after the dump left the source frozen with its
// upper moved: GC gives the source back, thawed, with its upper, and leaves nothing else.
func TestGCRecoversADeadSwap(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src := create(t, rt, "orphan", "python3", "-c", counterPy)
	testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src) >= 3 })
	if err := os.WriteFile(filepath.Join(src.Upper, "precious"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := leftovers(t, rt.Containers)
	s, err := fork.Dump(ctx, rt, src, fork.DumpOptions{Swap: true})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Swap || s.Owner != os.Getpid() {
		t.Fatalf("swap dump: swap=%v owner=%d", s.Swap, s.Owner)
	}
	// As if this process had been killed here.
	s.Owner = 1 << 22
	if err := fork.Save(s); err != nil {
		t.Fatal(err)
	}
	at := lastInt(src)
	if err := fork.GC(rt); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the source to run again", func() bool { return lastInt(src) > at+3 })
	if b, err := os.ReadFile(filepath.Join(src.Upper, "precious")); err != nil || string(b) != "data" {
		t.Errorf("the source's upper was not given back: %v", err)
	}
	if after := leftovers(t, rt.Containers); after != before {
		t.Errorf("GC after a dead swap left:\n before %s\n after  %s", before, after)
	}
}

// A swap killed while the new source was being restored, and then its container deleted:
// GC still removes the new source's group (named after the container and the snapshot).
func TestGCEndsTheGroupOfADeadSwapOfADeletedContainer(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src := create(t, rt, "gone", "python3", "-c", counterPy)
	testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src) >= 1 })
	s, err := fork.Dump(ctx, rt, src, fork.DumpOptions{Swap: true})
	if err != nil {
		t.Fatal(err)
	}
	// What the swap had made when its process was killed: the new source's group.
	cg, err := cgroup.Create(src.ID+"-"+s.ID, rt.CgroupParent)
	if err != nil {
		t.Fatal(err)
	}
	s.Owner = 1 << 22
	if err := fork.Save(s); err != nil {
		t.Fatal(err)
	}
	if err := rt.Delete(src); err != nil {
		t.Fatal(err)
	}
	if err := fork.GC(rt); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cg.FreezerDir()); err == nil {
		t.Errorf("the group %s of the dead swap survived GC", cg.FreezerDir())
		_ = cg.Remove()
	}
}

// capsDropper's child drops CAP_SETPCAP from its bounding set (zdtm caps00): CRIU's
// restorer trims the bounding set before capset(), which then refuses the inheritable set
// confined containers have, and criu hangs "Killing processes because of failure on
// restore".
const capsDropper = `import ctypes, os, time, itertools
libc = ctypes.CDLL(None, use_errno=True)
if os.fork() == 0:
    assert libc.prctl(24, 8, 0, 0, 0) == 0  # PR_CAPBSET_DROP, CAP_SETPCAP
    while True:
        time.sleep(1)
for i in itertools.count():
    print(i, flush=True)
    time.sleep(0.1)
`

// A swap whose restore cannot finish is bounded: it ends within SwapRestoreTimeout (and a
// criu that logged an error within criu.ErrorGrace, not the restore's minute), and the
// source is thawed and counts on, with nothing left over.
func TestSwapRestoreIsBounded(t *testing.T) {
	rt := testutil.NewRuntime(t)
	check := func(t *testing.T, src *store.Container, took time.Duration, err error, limit time.Duration) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "goes on as it was") {
			t.Fatalf("fork: %v, want a failed swap that kept the source", err)
		}
		t.Logf("failed after %v: %v", took.Round(time.Millisecond), err)
		if took > limit {
			t.Errorf("the swap took %v with the source frozen, want under %v", took, limit)
		}
		if st := rt.State(src); st != store.StateRunning {
			t.Fatalf("after the failed swap the source is %s", st)
		}
		at := lastInt(src)
		testutil.Eventually(t, 10*time.Second, "the source to count on", func() bool { return lastInt(src) > at+3 })
	}

	t.Run("deadline", func(t *testing.T) {
		src := create(t, rt, "bounded", "python3", "-c", counterPy)
		testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src) >= 3 })
		before := leftovers(t, rt.Containers)
		old := fork.SwapRestoreTimeout
		fork.SwapRestoreTimeout = time.Millisecond // no restore is that fast
		t.Cleanup(func() { fork.SwapRestoreTimeout = old })
		begin := time.Now()
		_, _, err := fork.Fork(ctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1}})
		fork.SwapRestoreTimeout = old
		check(t, src, time.Since(begin), err, fork.DumpTimeout)
		if !strings.Contains(err.Error(), "deadline") {
			t.Errorf("error does not name the deadline: %v", err)
		}
		if err := fork.GC(rt); err != nil {
			t.Fatal(err)
		}
		if after := leftovers(t, rt.Containers); after != before {
			t.Errorf("a swap past its deadline left things behind:\n before %s\n after  %s", before, after)
		}
	})

	t.Run("criu hangs after an error", func(t *testing.T) {
		src := create(t, rt, "caps", "python3", "-c", capsDropper)
		testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src) >= 3 })
		before := leftovers(t, rt.Containers)
		begin := time.Now()
		forks, _, err := fork.Fork(ctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1}})
		if err == nil {
			// The restore works (confinement no longer gives an inheritable set): nothing
			// hangs, and the fork must count too.
			f, _ := rt.Containers.Get(forks[0].ID)
			n := len(lines(f))
			testutil.Eventually(t, 10*time.Second, "the fork to count", func() bool { return len(lines(f)) > n+2 })
			t.Logf("the restore of a process without CAP_SETPCAP in its bounding set works here")
			return
		}
		check(t, src, time.Since(begin), err, fork.RestoreTimeout-10*time.Second)
		if !strings.Contains(err.Error(), "did not exit within") {
			t.Errorf("error does not say criu stalled after an error: %v", err)
		}
		if err := fork.GC(rt); err != nil {
			t.Fatal(err)
		}
		if after := leftovers(t, rt.Containers); after != before {
			t.Errorf("a stalled swap restore left things behind:\n before %s\n after  %s", before, after)
		}
	})
}
