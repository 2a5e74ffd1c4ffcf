package overlay_test

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/overlay"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// TestUnmount: a target that is a mount (stacked twice, with a mount below it) and a target
// that is not one but has a mount below it are both left with nothing mounted at or under
// them, in this process's mount namespace only.
func TestUnmount(t *testing.T) {
	testutil.RequireRoot(t)
	// A mount namespace of its own: nothing the test mounts is seen by the machine.
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		// The thread is thrown away (never unlocked): it holds the private namespace.
		if err = enterPrivateNS(); err != nil {
			return
		}
		err = checkUnmount(t)
	}()
	<-done
	if err != nil {
		t.Fatal(err)
	}
}

func enterPrivateNS() error {
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
		return err
	}
	return unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "")
}

func checkUnmount(t *testing.T) error {
	dir := t.TempDir()
	mount := func(p string) {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Error(err)
			return
		}
		if err := unix.Mount("tmpfs", p, "tmpfs", 0, "size=1m"); err != nil {
			t.Errorf("mount %s: %v", p, err)
		}
	}
	a := filepath.Join(dir, "a")
	mount(a)
	mount(a)
	mount(filepath.Join(a, "sub"))
	if err := overlay.Unmount(a); err != nil {
		t.Errorf("Unmount(mount point): %v", err)
	}
	b := filepath.Join(dir, "b")
	mount(filepath.Join(b, "sub"))
	if err := overlay.Unmount(b); err != nil {
		t.Errorf("Unmount(dir with a mount below): %v", err)
	}
	for _, d := range []string{a, b} {
		if left := fsutil.MountsUnder(d); len(left) > 0 {
			t.Errorf("still mounted under %s: %v", d, left)
		}
	}
	return nil
}
