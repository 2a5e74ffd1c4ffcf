// Package testutil holds what the privileged tests share: the root requirement (a skip
// on a developer's machine, a failure in CI) and waiting helpers.
package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup/owned"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/image"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil/priv"
	"github.com/lazyfork/lazyfork/lib/testutil/timescale"
)

// RequireRoot skips a test that needs root, or fails it where privileged tests must run
// (CI=true or LF_REQUIRE_PRIV=1).
func RequireRoot(t testing.TB) {
	t.Helper()
	priv.Root(t, "namespaces, mounts, cgroups, CRIU")
}

// Eventually polls cond every 50 ms until it holds or timeout (scaled by
// $LF_TEST_TIME_SCALE, see timescale) passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	timeout = timescale.Scale(timeout)
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The test binary is a main too: the roots and the operator's cgroup parent its
// environment names (make test, a CI job, make test-v2) reach lib the way a main's flags
// do.
func init() {
	paths.Set(os.Getenv("LAZYFORK_ROOT"), os.Getenv("LAZYFORK_RUN"))
	owned.SetParent(Config().CgroupParent)
}

// Config is the operator's settings NewRuntime uses, as a main's flags read them from
// this test run's environment (kong's env tags on container.Config). The network ones
// stay the defaults: tests that need others set them on the Runtime.
func Config() container.Config {
	return container.Config{CgroupParent: os.Getenv("LAZYFORK_CGROUP_PARENT"), CRIU: os.Getenv("LAZYFORK_CRIU"),
		MaxLayerBytes: os.Getenv("LAZYFORK_MAX_LAYER_BYTES")}
}

// ExecHelper is the exec helper a test's runtime starts: the built lazyfork-helper in
// $LAZYFORK_BIN (what make test runs with; the test fails when it is missing there), else
// the test binary exe, which runs the same code (lib/helper, dispatched in Setup).
func ExecHelper(t *testing.T, exe string) string {
	t.Helper()
	dir := os.Getenv("LAZYFORK_BIN")
	if dir == "" {
		return exe
	}
	p := filepath.Join(dir, container.HelperName)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is not in LAZYFORK_BIN=%s: run `make build`", container.HelperName, dir)
	}
	return p
}

// SetRoots gives a test its own state roots: lib/paths gets them (paths.Set, as a main
// would) and so do the binaries the test runs (the environment); both are restored after.
func SetRoots(t *testing.T, root, run string) {
	t.Helper()
	oldRoot, oldRun := paths.Root(), paths.Run()
	t.Setenv("LAZYFORK_ROOT", root)
	t.Setenv("LAZYFORK_RUN", run)
	paths.Set(root, run)
	t.Cleanup(func() { paths.Set(oldRoot, oldRun) })
}

// DefaultImage is the offline image `make image` builds; privileged tests run on it.
const DefaultImage = "lazyfork/debian:bookworm"

// NewRuntime gives a test its own container store, tmpfs state and persistent root, while
// sharing the machine's image store (the default image is built by `make image`).
// Every container left at the end is deleted and the test fails if anything remains.
func NewRuntime(t *testing.T) *container.Runtime {
	t.Helper()
	RequireRoot(t)
	imageRoot := os.Getenv("LAZYFORK_ROOT")
	if imageRoot == "" {
		imageRoot = "/var/lib/lazyfork"
	}
	imgs, err := image.Open(filepath.Join(imageRoot, "images"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := imgs.Resolve(DefaultImage); err != nil {
		t.Fatalf("default image missing (run `make image`): %v", err)
	}
	run, err := os.MkdirTemp("/dev/shm", "lazyfork-test-run-")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	// The image store is the machine's, reached as the product reaches it: through
	// $LAZYFORK_ROOT/images (stage input may only name paths inside the state roots).
	if err := os.Symlink(filepath.Join(imageRoot, "images"), filepath.Join(root, "images")); err != nil {
		t.Fatal(err)
	}
	SetRoots(t, root, run)
	ts, err := store.Open(filepath.Join(root, "containers"))
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config()
	imgs.MaxLayerBytes = cfg.MaxLayerBytes
	rt := &container.Runtime{Containers: ts, Images: imgs, Exe: exe, Helper: ExecHelper(t, exe), CgroupParent: cfg.CgroupParent, CRIU: cfg.CRIU}
	t.Cleanup(func() {
		all, _ := ts.List()
		for _, c := range all {
			if err := rt.Delete(c); err != nil {
				t.Errorf("cleanup: %v", err)
				out, _ := exec.Command("sh", "-c", "for f in $(grep -l "+c.ID+" /proc/[0-9]*/mountinfo /proc/[0-9]*/task/*/mountinfo); do echo $f $(cat $(dirname $f)/comm) $(readlink $(dirname $f)/ns/mnt); grep "+c.ID+" $f; done; readlink /proc/self/ns/mnt").CombinedOutput()
				t.Logf("%s", out)
			}
		}
		if m := fsutil.MountsUnder(root); len(m) > 0 {
			t.Errorf("mounts left under %s: %v", root, m)
		}
		if m := fsutil.MountsUnder(run); len(m) > 0 {
			t.Errorf("mounts left under %s: %v", run, m)
		}
		_ = fsutil.RemoveAll(run)
	})
	return rt
}

// LastInt is the last word of s (a counting workload's output) as a number, -1 when s is
// empty or that word is not one.
func LastInt(s string) int {
	f := strings.Fields(s)
	if len(f) == 0 {
		return -1
	}
	n, err := strconv.Atoi(f[len(f)-1])
	if err != nil {
		return -1
	}
	return n
}
