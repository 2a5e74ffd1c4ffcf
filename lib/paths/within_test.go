package paths

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWithin(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	for _, d := range []string{"a/b", "in"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"out":      outside,                        // leads out
		"etc":      "/etc",                         // leads out
		"rel":      "../" + filepath.Base(outside), // relative, leads out
		"a/up":     "../../",                       // the root's parent
		"self":     root,                           // the root itself
		"good":     filepath.Join(root, "in"),      // stays inside
		"dangling": filepath.Join(root, "nosuch"),
		"loop":     "loop",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	ok := []string{"a", "a/b", "a/b/c/d", "in", "nosuch/x", "good", "good/x/y", "a//b/", "self/a"}
	for _, p := range ok {
		got, err := Within(filepath.Join(root, p), root)
		if err != nil {
			t.Errorf("Within(%s) refused: %v", p, err)
		} else if got != filepath.Join(root, p) {
			t.Errorf("Within(%s) = %s", p, got)
		}
	}
	bad := []string{"/", "/etc", "/etc/passwd", root, root + "/", root + "/../" + filepath.Base(outside),
		root + "/a/../../etc", "relative/path", "", outside + "/x",
		root + "/out", root + "/out/x", root + "/etc/passwd", root + "/rel/x", root + "/a/up/x",
		root + "/self", root + "/dangling", root + "/loop/x"}
	for _, p := range bad {
		_, err := Within(p, root)
		if !errors.Is(err, ErrOutside) {
			t.Errorf("Within(%q) = %v, want ErrOutside", p, err)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("Within(%q): error is not one line: %q", p, err)
		}
	}
	// Several roots: inside any one is fine; a link from one root into another too.
	if err := os.Symlink(outside, filepath.Join(root, "other")); err != nil {
		t.Fatal(err)
	}
	if _, err := Within(filepath.Join(root, "other", "x"), root, outside); err != nil {
		t.Errorf("link to a second root refused: %v", err)
	}
	if _, err := Within(filepath.Join(root, "other"), root, outside); err == nil {
		t.Errorf("link naming a second root itself accepted")
	}
	if _, err := Within(filepath.Join(outside, "x"), root, outside); err != nil {
		t.Errorf("second root refused: %v", err)
	}
}

// A root that is itself a symlink (LAZYFORK_ROOT=/data/lf -> /mnt/lf) is configuration:
// paths under either spelling are inside it.
func TestWithinSymlinkedRoot(t *testing.T) {
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "root")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(link, "x"), filepath.Join(real, "x")} {
		if _, err := Within(p, link); err != nil {
			t.Errorf("Within(%s, %s): %v", p, link, err)
		}
	}
}

func TestStateRootsFollowSet(t *testing.T) {
	root, run := t.TempDir(), t.TempDir()
	setRoots(t, root, run)
	for _, p := range []string{Layers() + "/s1", Families() + "/f", Snapshots() + "/s", Containers() + "/c/upper"} {
		if _, err := InState(p); err != nil {
			t.Errorf("InState(%s): %v", p, err)
		}
	}
	for _, p := range []string{"/var/lib/lazyfork/layers/x", "/dev/shm/x", "/tmp"} {
		if _, err := InState(p); err == nil {
			t.Errorf("InState(%s) accepted", p)
		}
	}
}
