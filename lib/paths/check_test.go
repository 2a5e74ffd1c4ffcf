package paths

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/lazyfork/lazyfork/lib/testutil/priv"
	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	priv.Root(t, "the state roots must be owned by root (chown)")
}

// roots gives a test its own LAZYFORK_ROOT and LAZYFORK_RUN paths (not yet created)
// below a fresh directory in /dev/shm, which is sticky like the real parent.
func roots(t *testing.T) (root, run string) {
	t.Helper()
	base, err := os.MkdirTemp("/dev/shm", "lf-paths-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	root, run = filepath.Join(base, "root"), filepath.Join(base, "run")
	setRoots(t, root, run)
	return root, run
}

// setRoots gives the roots as a main does (Set), and takes them back after the test.
func setRoots(t *testing.T, root, run string) {
	t.Helper()
	Set(root, run)
	t.Cleanup(func() { Set("", "") })
}

func mode(t *testing.T, p string) (uint32, uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode & 0o7777, st.Uid
}

func TestEnsureCreates(t *testing.T) {
	needRoot(t)
	root, run := roots(t)
	if err := Ensure(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{root, run, Containers(), Images(), Snapshots(), Families(), filepath.Join(run, "mem")} {
		if m, uid := mode(t, p); m != 0o700 || uid != 0 {
			t.Errorf("%s: mode %04o uid %d, want 0700 root", p, m, uid)
		}
	}
	// A root-owned 0755 tree (made by an older version) is tightened, not refused.
	os.Chmod(run, 0o755)
	os.Chmod(Snapshots(), 0o755)
	if err := Ensure(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{run, Snapshots()} {
		if m, _ := mode(t, p); m != 0o700 {
			t.Errorf("%s: mode %04o after Ensure, want 0700", p, m)
		}
	}
	// A root-owned symlink LAZYFORK_ROOT/images to a safe shared store is allowed.
	shared := filepath.Join(filepath.Dir(root), "shared-images")
	os.Mkdir(shared, 0o700)
	os.Remove(Images())
	if err := os.Symlink(shared, Images()); err != nil {
		t.Fatal(err)
	}
	if err := Ensure(); err != nil {
		t.Fatalf("images symlink to a safe store: %v", err)
	}
}

func TestEnsureRefusesUnsafeRoots(t *testing.T) {
	needRoot(t)
	cases := []struct {
		name string
		prep func(t *testing.T, root, run string)
		want string
	}{
		{"run owned by another uid", func(t *testing.T, root, run string) {
			os.Mkdir(run, 0o700)
			os.Chown(run, 1000, 1000)
		}, "run is owned by uid 1000, not root; remove it or set LAZYFORK_RUN to another directory"},
		{"run mode 0777", func(t *testing.T, root, run string) {
			os.Mkdir(run, 0o777)
			os.Chmod(run, 0o777)
		}, "run has mode 0777, writable by others; remove it or set LAZYFORK_RUN"},
		{"run group-writable", func(t *testing.T, root, run string) {
			os.Mkdir(run, 0o770)
			os.Chmod(run, 0o770)
		}, "writable by others"},
		{"run is a symlink", func(t *testing.T, root, run string) {
			target := filepath.Join(filepath.Dir(run), "elsewhere")
			os.Mkdir(target, 0o700)
			os.Symlink(target, run)
		}, "run is a symlink or not a directory; remove it or set LAZYFORK_RUN"},
		{"run is a file", func(t *testing.T, root, run string) {
			os.WriteFile(run, nil, 0o600)
		}, "not a directory"},
		{"root owned by another uid", func(t *testing.T, root, run string) {
			os.Mkdir(root, 0o700)
			os.Chown(root, 1000, 1000)
		}, "owned by uid 1000, not root; remove it or set LAZYFORK_ROOT"},
		{"child is a symlink", func(t *testing.T, root, run string) {
			os.Mkdir(run, 0o700)
			os.Symlink("/etc", filepath.Join(run, "snapshots"))
		}, "snapshots is a symlink"},
		{"child owned by another uid", func(t *testing.T, root, run string) {
			os.Mkdir(run, 0o700)
			os.Mkdir(filepath.Join(run, "families"), 0o700)
			os.Chown(filepath.Join(run, "families"), 1000, 1000)
		}, "families is owned by uid 1000"},
		{"child world-writable", func(t *testing.T, root, run string) {
			os.Mkdir(root, 0o700)
			os.Mkdir(filepath.Join(root, "containers"), 0o777)
			os.Chmod(filepath.Join(root, "containers"), 0o777)
		}, "containers has mode 0777"},
		{"images symlink to an unsafe store", func(t *testing.T, root, run string) {
			os.Mkdir(root, 0o700)
			bad := filepath.Join(filepath.Dir(root), "bad-images")
			os.Mkdir(bad, 0o755)
			os.Chown(bad, 1000, 1000)
			os.Symlink(bad, filepath.Join(root, "images"))
		}, "owned by uid 1000"},
		{"parent owned by another uid", func(t *testing.T, root, run string) {
			p := filepath.Join(filepath.Dir(run), "user")
			os.Mkdir(p, 0o755)
			os.Chown(p, 1000, 1000)
			setRoots(t, root, filepath.Join(p, "run"))
		}, "above the state directory, is owned by uid 1000"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root, run := roots(t)
			c.prep(t, root, run)
			base := filepath.Dir(root)
			before := listTree(t, base)
			err := Ensure()
			if err == nil {
				t.Fatal("Ensure accepted an unsafe state directory")
			}
			t.Log(err)
			if !errors.Is(err, ErrUnsafeRoot) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error = %q, want one line with %q", err, c.want)
			}
			if err := Check(); err == nil {
				t.Error("Check accepted it")
			}
			if after := listTree(t, base); after != before {
				t.Errorf("a refused Ensure changed the tree:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// listTree describes every entry below dir (name, mode, owner).
func listTree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		st := fi.Sys().(*syscall.Stat_t)
		fmt.Fprintf(&b, "%s %v %d;", p, fi.Mode(), st.Uid)
		return nil
	})
	return b.String()
}
