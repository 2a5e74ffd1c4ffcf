package fork_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/guard"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// leftovers summarises everything a failed fork could leave behind: records, mounts,
// snapshots, memory files, frozen layers and cgroups under the containers' parent.
func leftovers(t *testing.T, rt interface {
	List() ([]*store.Container, error)
}) string {
	t.Helper()
	recs, _ := rt.List()
	count := func(dir string) int { e, _ := os.ReadDir(dir); return len(e) }
	var names []string
	for _, c := range recs {
		names = append(names, c.ID+":"+c.State)
	}
	return strings.Join([]string{
		"records=" + strings.Join(names, ","),
		"mounts=" + itoa(len(fsutil.MountsUnder(paths.Root()))+len(fsutil.MountsUnder(paths.Run()))),
		"snapshots=" + itoa(count(paths.Snapshots())),
		"families=" + itoa(count(paths.Families())),
		"layers=" + itoa(count(fork.LayersDir())),
		"work=" + itoa(count(filepath.Join(paths.Run(), "work"))),
		"cgroups=" + itoa(countCgroupDirs()),
	}, " ")
}

func itoa(i int) string { return strconv.Itoa(i) }

func countCgroupDirs() int {
	n := 0
	_ = filepath.WalkDir("/sys/fs/cgroup", func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if strings.Count(p, "/") > 10 {
			return filepath.SkipDir
		}
		if filepath.Base(filepath.Dir(p)) == "lazyfork" {
			n++
		}
		return nil
	})
	return n
}

// requireUntouched checks the source still runs and counts on.
func requireUntouched(t *testing.T, rt interface{ State(*store.Container) string }, c *store.Container) {
	t.Helper()
	if st := rt.State(c); st != store.StateRunning {
		t.Fatalf("source is %s after a failed fork, want running", st)
	}
	n := lastInt(c)
	testutil.Eventually(t, 5*time.Second, "source to keep counting", func() bool { return lastInt(c) > n })
}

func TestForkBadStates(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src := create(t, rt, "src", "python3", "-c", counterPy)
	testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src) >= 1 })
	if _, err := rt.Containers.Resolve("nope"); err == nil || !strings.Contains(err.Error(), "lazyfork list") {
		t.Errorf("unknown container: %v", err)
	}
	if err := rt.Freeze(src); err != nil {
		t.Fatal(err)
	}
	_, _, err := fork.Fork(ctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1}})
	if err == nil || !strings.Contains(err.Error(), "lazyfork thaw") {
		t.Errorf("fork of a frozen container: %v, want it to say to thaw", err)
	}
	if err := rt.Thaw(src); err != nil {
		t.Fatal(err)
	}
	before := leftovers(t, rt.Containers)
	if _, _, err := fork.Fork(ctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 2, Names: []string{"src", "x"}}}); err == nil || !strings.Contains(err.Error(), "already in use") {
		t.Errorf("fork with a taken name: %v", err)
	}
	if _, _, err := fork.Fork(ctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 2, Names: []string{"x", "x"}}}); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Errorf("fork with one name twice: %v", err)
	}
	if after := leftovers(t, rt.Containers); after != before {
		t.Errorf("a refused fork left things behind:\n before %s\n after  %s", before, after)
	}
	requireUntouched(t, rt, src)

	// A stopped container cannot be dumped again; lf-dump says what to do instead.
	if _, err := fork.Stop(ctx, rt, src, hook.Options{}); err != nil {
		t.Fatal(err)
	}
	src, _ = rt.Containers.Get(src.ID)
	if _, err := fork.Dump(ctx, rt, src, fork.DumpOptions{}); err == nil || !strings.Contains(err.Error(), "lazyfork start") {
		t.Errorf("dump of a stopped container: %v", err)
	}
	// Every operation the stopped state does not allow is the same typed error.
	wantState := func(op guard.Op, err error) {
		t.Helper()
		var se *guard.StateError
		if !errors.As(err, &se) || se.Op != op || se.State != store.StateStopped {
			t.Errorf("%s of a stopped container: %v, want *guard.StateError{%s, stopped}", op, err, op)
		}
	}
	_, err = fork.Dump(ctx, rt, src, fork.DumpOptions{})
	wantState(guard.OpDump, err)
	_, err = fork.Stop(ctx, rt, src, hook.Options{})
	wantState(guard.OpStop, err)
	wantState(guard.OpFreeze, rt.Freeze(src))
	_, err = rt.Exec(ctx, src, container.ExecOptions{Args: []string{"true"}})
	wantState(guard.OpExec, err)
	if err := fork.Start(ctx, rt, src); err != nil {
		t.Fatal(err)
	}
	src, _ = rt.Containers.Get(src.ID)
	var se *guard.StateError
	if err := fork.Start(ctx, rt, src); !errors.As(err, &se) || se.Op != guard.OpStart || se.State != store.StateRunning {
		t.Errorf("start of a running container: %v, want *guard.StateError", err)
	}
	if err := rt.Thaw(src); !errors.As(err, &se) || se.Op != guard.OpThaw {
		t.Errorf("thaw of a running container: %v, want *guard.StateError", err)
	}
}

func TestAllocatorRefusedUnlessForced(t *testing.T) {
	rt := testutil.NewRuntime(t)
	// Any file whose name starts like jemalloc's, mapped into the workload, triggers the
	// check; its contents do not matter for detection.
	prog := "import mmap, time, shutil\nshutil.copy('/usr/lib/x86_64-linux-gnu/libz.so.1', '/tmp/libjemalloc.so.2')\nf = open('/tmp/libjemalloc.so.2', 'rb')\nm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\nprint('ready', flush=True)\nwhile True: time.sleep(1)\n"
	src := create(t, rt, "jem", "python3", "-c", prog)
	testutil.Eventually(t, 10*time.Second, "ready", func() bool { return len(logLines(src)) > 0 })
	before := leftovers(t, rt.Containers)
	_, _, err := fork.Fork(ctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1}})
	if !errors.Is(err, fork.ErrAllocator) || !strings.Contains(err.Error(), "libjemalloc") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("fork of a jemalloc workload: %v", err)
	}
	if after := leftovers(t, rt.Containers); after != before {
		t.Errorf("refusal left things behind:\n before %s\n after  %s", before, after)
	}
	if _, _, err := fork.Fork(ctx, rt, src, fork.Options{Force: true, RestoreOptions: fork.RestoreOptions{N: 1}}); err != nil {
		t.Fatalf("forced fork: %v", err)
	}
}

func TestMemfileBadImages(t *testing.T) {
	testutil.RequireRoot(t)
	// A snapshot document with the shape of a real one (stage input is checked first).
	run, err := os.MkdirTemp("/dev/shm", "lazyfork-test-run-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(run) })
	testutil.SetRoots(t, t.TempDir(), run)
	id := "s0000000000ba"
	dir := filepath.Join(paths.Snapshots(), id)
	s := &stage.Snapshot{Kind: stage.KindSnapshot, Version: stage.Version, ID: id, State: stage.SnapDumped,
		Dir: dir, CheckpointDir: filepath.Join(dir, "images"), FamilyDir: filepath.Join(paths.Families(), id),
		Family: id, Lower: []string{filepath.Join(paths.Layers(), "s0000000000aa")}}
	for _, d := range []string{s.CheckpointDir, s.Lower[0]} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(s.CheckpointDir, "junk"), []byte("x"), 0o600)
	_, err = fork.Memfile(ctx, s, fork.MemfileOptions{})
	if err == nil || !strings.Contains(err.Error(), "is not a checkpoint") || strings.Contains(err.Error(), "\n") {
		t.Errorf("memfile of a dir that is not a checkpoint: %v", err)
	}
	if ents, _ := os.ReadDir(s.FamilyDir); len(ents) > 0 {
		t.Errorf("memory files left: %v", ents)
	}
	if fsutil.IsMountPoint(filepath.Join(dir, "rootfs")) {
		t.Errorf("layer stack left mounted")
	}
	if _, err := fork.LoadSnapshot(t.TempDir()); err == nil || !strings.Contains(err.Error(), "not a LazyFork snapshot") {
		t.Errorf("load of a non-snapshot dir: %v", err)
	}
}

// A real dump whose pages image is cut short: lf-memfile must refuse it cleanly.
func TestMemfileTruncatedImage(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src, s := countingSnapshot(t, rt, "trunc", false)
	pages, _ := filepath.Glob(filepath.Join(s.CheckpointDir, "pages-*.img"))
	if len(pages) == 0 {
		t.Fatal("no pages image")
	}
	fi, _ := os.Stat(pages[0])
	if err := os.Truncate(pages[0], fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	_, err := fork.Memfile(ctx, s, fork.MemfileOptions{})
	if err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("memfile of a truncated image: %v", err)
	}
	if ents, _ := os.ReadDir(s.FamilyDir); len(ents) > 0 {
		t.Errorf("memory files left after a failed rewrite: %d", len(ents))
	}
	requireUntouched(t, rt, src)
}

func TestRestoreWithMemfilesGone(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src, s := countingSnapshot(t, rt, "gone", true)
	if err := fsutil.RemoveAll(s.FamilyDir); err != nil {
		t.Fatal(err)
	}
	before := leftovers(t, rt.Containers)
	_, err := fork.Restore(ctx, rt, s, fork.RestoreOptions{N: 3})
	if err == nil || !strings.Contains(err.Error(), "memory files") || !strings.Contains(err.Error(), "lf-dump") {
		t.Fatalf("restore with memfiles gone: %v", err)
	}
	if after := leftovers(t, rt.Containers); after != before {
		t.Errorf("failed restore left things behind:\n before %s\n after  %s", before, after)
	}
	// A single memory file gone (the directory still there): CRIU itself fails.
	s2, err := fork.Dump(ctx, rt, src, fork.DumpOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s2, err = fork.Memfile(ctx, s2, fork.MemfileOptions{}); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(s2.FamilyDir, "*anon.mem"))
	if len(files) == 0 {
		t.Fatal("no anonymous memory file")
	}
	os.Remove(files[0])
	before = leftovers(t, rt.Containers)
	if _, err = fork.Restore(ctx, rt, s2, fork.RestoreOptions{N: 3}); err == nil {
		t.Fatal("restore with a memory file missing succeeded")
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error is not one line: %q", err)
	}
	if after := leftovers(t, rt.Containers); after != before {
		t.Errorf("failed restore left things behind:\n before %s\n after  %s", before, after)
	}
	requireUntouched(t, rt, src)
}

// CRIU fails in the middle of a batch (the family's files vanish after two forks ran):
// the whole batch is undone.
func TestCriuFailsMidBatch(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src, s := countingSnapshot(t, rt, "mid", true)
	before := leftovers(t, rt.Containers)
	done := 0
	_, err := fork.Restore(ctx, rt, s, fork.RestoreOptions{N: 6, Parallel: 1, OnFork: func(stage.Fork) {
		if done++; done == 2 {
			files, _ := filepath.Glob(filepath.Join(s.FamilyDir, "*.mem"))
			for _, f := range files {
				os.Remove(f)
			}
		}
	}})
	if err == nil {
		t.Fatal("batch succeeded although CRIU could not open the memory files")
	}
	if after := leftovers(t, rt.Containers); after != before {
		t.Errorf("a failed batch left forks behind:\n before %s\n after  %s", before, after)
	}
	requireUntouched(t, rt, src)
}

// The command is interrupted mid-batch (Ctrl-C: its context ends): nothing half-made
// stays. A SIGKILLed command is covered by GC of records whose owner is gone.
func TestInterruptedBatch(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src := create(t, rt, "intr", "python3", "-c", counterPy)
	testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src) >= 1 })
	// A first fork moves the source onto its snapshot (the family and layer are then the
	// source's own); the interrupted batch comes after.
	first := doFork(t, rt, src, 1)
	if err := rt.Delete(first[0]); err != nil {
		t.Fatal(err)
	}
	before := leftovers(t, rt.Containers)
	cctx, cancel := context.WithCancel(ctx)
	n := 0
	_, _, err := fork.Fork(cctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 8, Parallel: 2, OnFork: func(stage.Fork) {
		if n++; n == 2 {
			cancel()
		}
	}}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted batch: %v", err)
	}
	if after := leftovers(t, rt.Containers); after != before {
		t.Errorf("an interrupted batch left things behind:\n before %s\n after  %s", before, after)
	}
	requireUntouched(t, rt, src)

	// A record abandoned by a killed command (its owner is gone) is collected by GC.
	c, err := rt.Reserve("", func(c *store.Container) error { c.Image = "x"; return nil })
	if err != nil {
		t.Fatal(err)
	}
	c.Owner = 1 << 22 // no such pid
	if err := rt.Containers.Put(c); err != nil {
		t.Fatal(err)
	}
	if err := fork.GC(rt); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Containers.Get(c.ID); err == nil {
		t.Errorf("abandoned record survived GC")
	}
}

// tmpfs full: the memory files cannot be written. Clear error; source untouched.
func TestTmpfsFull(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src := create(t, rt, "full", "python3", "-c", "import os, time, itertools\nheap = bytearray(os.urandom(32 << 20))\nfor i in itertools.count():\n    print(i, flush=True)\n    time.sleep(0.1)\n")
	testutil.Eventually(t, 20*time.Second, "counting", func() bool { return lastInt(src) >= 1 })
	// The family's tmpfs gets 8 MB: the CRIU image fits elsewhere, the 32 MB heap does not.
	small := filepath.Join(paths.Run(), "families")
	if err := os.MkdirAll(small, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=8m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(small, unix.MNT_DETACH) })
	before := leftovers(t, rt.Containers)
	_, _, err := fork.Fork(ctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 2}})
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "no space") {
		t.Fatalf("fork with tmpfs full: %v", err)
	}
	if after := leftovers(t, rt.Containers); after != before {
		t.Errorf("tmpfs full left things behind:\n before %s\n after  %s", before, after)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(small, &st); err == nil && st.Blocks != st.Bfree {
		t.Errorf("%d blocks still used on the full tmpfs", st.Blocks-st.Bfree)
	}
	requireUntouched(t, rt, src)
}

// countingSnapshot starts a counter container and dumps it once it counts; with memfile,
// the snapshot's memory is moved into memory files too.
func countingSnapshot(t *testing.T, rt *container.Runtime, name string, memfile bool) (*store.Container, *stage.Snapshot) {
	t.Helper()
	src := create(t, rt, name, "python3", "-c", counterPy)
	testutil.Eventually(t, 10*time.Second, "counting", func() bool { return lastInt(src) >= 1 })
	s, err := fork.Dump(ctx, rt, src, fork.DumpOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if memfile {
		if s, err = fork.Memfile(ctx, s, fork.MemfileOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return src, s
}
