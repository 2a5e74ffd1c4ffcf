package fork_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// stateListing is every file and directory under the state roots, with modes.
func stateListing(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, d := range []string{paths.Root(), paths.Run()} {
		_ = filepath.WalkDir(d, func(p string, de fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if de.IsDir() && (de.Name() == "upper" || de.Name() == "rootfs" || de.Name() == "work") {
				fmt.Fprintf(&b, "%s/\n", p) // a running container writes inside
				return filepath.SkipDir
			}
			if strings.HasSuffix(p, ".log") || de.Name() == "state.lock" {
				return nil
			}
			fmt.Fprintf(&b, "%s %v\n", p, de.Type())
			return nil
		})
	}
	return b.String()
}

// GC must not delete anything when a record cannot be read: the unreadable record may be
// the only one that holds a family and a layer (here: a fork whose source was deleted).
func TestGCStopsOnUnreadableRecord(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src := create(t, rt, "gcsrc", "python3", "-c", counterPy)
	testutil.Eventually(t, 10*time.Second, "source to count", func() bool { return lastInt(src) >= 2 })
	f1 := doFork(t, rt, src, 1)[0]
	if err := rt.Delete(src); err != nil {
		t.Fatal(err)
	}
	if err := fork.GC(rt); err != nil {
		t.Fatal(err)
	}
	famDir := filepath.Join(paths.Families(), f1.Family)
	if _, err := os.Stat(famDir); err != nil {
		t.Fatalf("family of the fork: %v", err)
	}
	recPath := filepath.Join(rt.Containers.Path(f1.ID), "container.json")
	good, err := os.ReadFile(recPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.WriteFile(recPath, good, 0o644) }) // so the runtime's cleanup finds f1

	for name, corrupt := range map[string]func() error{
		"not JSON":       func() error { return os.WriteFile(recPath, []byte("{\"id\": \"x"), 0o644) },
		"empty":          func() error { return os.WriteFile(recPath, nil, 0o644) },
		"wrong version":  func() error { return os.WriteFile(recPath, []byte(`{"version": 99, "id": "`+f1.ID+`"}`), 0o644) },
		"unreadable":     func() error { os.Remove(recPath); return os.Mkdir(recPath, 0o700) },
		"missing record": func() error { return os.Remove(recPath) },
	} {
		if err := corrupt(); err != nil {
			t.Fatal(err)
		}
		before := stateListing(t)
		err := fork.GC(rt)
		if err == nil {
			t.Errorf("%s: GC went ahead", name)
		} else if !strings.Contains(err.Error(), f1.ID) || !strings.Contains(err.Error(), "nothing was deleted") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: GC error does not name the record in one line: %q", name, err)
		}
		if after := stateListing(t); after != before {
			t.Errorf("%s: GC changed the state:\n before:\n%s\n after:\n%s", name, before, after)
		}
		_ = os.Remove(recPath)
		if err := os.WriteFile(recPath, good, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := execOut(t, rt, f1, "cat", "/proc/sys/kernel/hostname"); got != f1.ID {
		t.Errorf("fork after the refused GCs: hostname %q", got)
	}

	// An unreadable snapshot record holds its family and layers the same way.
	s, err := fork.Stop(ctx, rt, f1, hook.Options{})
	if err != nil {
		t.Fatal(err)
	}
	snapJSON := filepath.Join(s.Dir, "snapshot.json")
	goodSnap, _ := os.ReadFile(snapJSON)
	if err := os.WriteFile(snapJSON, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := stateListing(t)
	if err := fork.GC(rt); err == nil || !strings.Contains(err.Error(), s.ID) {
		t.Errorf("GC with a corrupt snapshot: %v", err)
	}
	if after := stateListing(t); after != before {
		t.Errorf("GC with a corrupt snapshot changed the state:\n before:\n%s\n after:\n%s", before, after)
	}
	if err := os.WriteFile(snapJSON, goodSnap, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fork.GC(rt); err != nil {
		t.Fatalf("GC once the records are whole: %v", err)
	}
	if err := fork.Start(ctx, rt, f1); err != nil {
		t.Fatalf("start after GC: %v", err)
	}

	// A reservation killed while writing its record leaves only the pending temp file:
	// that one GC removes (nothing refers to it, nothing is mounted there).
	half := rt.Containers.Path("00000000abcd")
	if err := os.MkdirAll(half, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(half, ".container.json1234567"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := fork.GC(rt); err != nil {
		t.Fatalf("GC with a half-written reservation: %v", err)
	}
	if _, err := os.Stat(half); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("half-written reservation left: %v", err)
	}
}

// Dumps, rewrites and restores hold the state lock shared; GC takes it exclusively: it
// waits for them (bounded by GCLockWait, then fails deleting nothing), and a dump waits
// for a GC in progress.
func TestGCAndDumpShareALock(t *testing.T) {
	rt := testutil.NewRuntime(t)
	garbage := filepath.Join(fork.LayersDir(), "s00000000000a")
	if err := os.MkdirAll(garbage, 0o700); err != nil {
		t.Fatal(err)
	}
	unlock, err := fork.LockState(ctx, false, 0) // as a dump in progress does
	if err != nil {
		t.Fatal(err)
	}
	old := fork.GCLockWait
	t.Cleanup(func() { fork.GCLockWait = old })
	fork.GCLockWait = 300 * time.Millisecond
	begin := time.Now()
	err = fork.GC(rt)
	if !errors.Is(err, fork.ErrStateBusy) || strings.Contains(err.Error(), "\n") {
		t.Errorf("GC while a dump holds the lock: %v", err)
	}
	if d := time.Since(begin); d < 250*time.Millisecond || d > 5*time.Second {
		t.Errorf("GC gave up after %v, want about %v", d, fork.GCLockWait)
	}
	if _, err := os.Stat(garbage); err != nil {
		t.Fatalf("GC deleted while refused: %v", err)
	}
	// A GC started during the dump waits for it, then collects.
	fork.GCLockWait = 20 * time.Second
	done := make(chan error, 1)
	go func() { done <- fork.GC(rt) }()
	select {
	case err := <-done:
		t.Fatalf("GC did not wait for the dump: %v", err)
	case <-time.After(400 * time.Millisecond):
	}
	if _, err := os.Stat(garbage); err != nil {
		t.Fatalf("GC deleted under the dump: %v", err)
	}
	unlock()
	if err := <-done; err != nil {
		t.Fatalf("GC after the dump: %v", err)
	}
	if _, err := os.Stat(garbage); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("garbage layer left after GC: %v", err)
	}

	// A real dump waits while GC holds the lock.
	c := create(t, rt, "gclock", "sleep", "1000")
	unlockGC, err := fork.LockState(ctx, true, 0)
	if err != nil {
		t.Fatal(err)
	}
	dumped := make(chan error, 1)
	go func() { _, err := fork.Dump(ctx, rt, c, fork.DumpOptions{}); dumped <- err }()
	select {
	case err := <-dumped:
		unlockGC()
		t.Fatalf("dump ran while GC held the lock: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	if ents, _ := os.ReadDir(paths.Snapshots()); len(ents) != 0 {
		t.Errorf("dump made %d snapshots while GC held the lock", len(ents))
	}
	unlockGC()
	select {
	case err := <-dumped:
		if err != nil {
			t.Fatalf("dump after GC: %v", err)
		}
	case <-time.After(fork.DumpTimeout):
		t.Fatal("dump did not finish")
	}
}

// Family memory files are private to root: 0400 files in 0700 directories.
func TestMemoryFilesArePrivate(t *testing.T) {
	rt := testutil.NewRuntime(t)
	c := create(t, rt, "private", "python3", "-c", "b = bytearray(8 << 20)\nimport time\nwhile True: time.sleep(1)")
	time.Sleep(300 * time.Millisecond)
	s, err := fork.Dump(ctx, rt, c, fork.DumpOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s, err = fork.Memfile(ctx, s, fork.MemfileOptions{}); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(s.FamilyDir, "*"))
	if len(files) == 0 {
		t.Fatal("no memory files")
	}
	check := func(p string, want os.FileMode) {
		t.Helper()
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm() != want || st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s: mode %v uid %d gid %d, want %v root:root", p, fi.Mode().Perm(), st.Uid, st.Gid, want)
		}
	}
	check(s.FamilyDir, 0o700)
	check(paths.Families(), 0o700)
	for _, f := range files {
		check(f, 0o400)
	}
	// CRIU (root) still opens them: the snapshot forks.
	forks, err := fork.Restore(ctx, rt, s, fork.RestoreOptions{N: 1})
	if err != nil {
		t.Fatalf("restore from 0400 memory files: %v", err)
	}
	f, err := rt.Containers.Get(forks[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := execOut(t, rt, f, "python3", "-c", "print(1+1)"); got != "2" {
		t.Errorf("fork runs: %q", got)
	}
	// Another user reads nothing.
	out, err := runAs(65534, "cat", files[0])
	if err == nil {
		t.Errorf("user nobody read a memory file: %q", out)
	}
}

// runAs runs argv as uid (and gid) uid, with no supplementary groups.
func runAs(uid uint32, argv ...string) (string, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}
