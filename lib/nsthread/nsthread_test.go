package nsthread

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/testutil/priv"
)

// fn runs in the other process's UTS namespace, and the caller's stays as it was.
func TestRunPidJoinsAndLeavesTheCallerAlone(t *testing.T) {
	priv.Root(t, "joining another UTS namespace")
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUTS}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	own, _ := os.Hostname()
	var inside string
	if err := RunPid(cmd.Process.Pid, "uts", unix.CLONE_NEWUTS, func() error {
		if err := unix.Sethostname([]byte("lf-nsthread-test")); err != nil {
			return err
		}
		var err error
		inside, err = os.Hostname()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if now, _ := os.Hostname(); inside != "lf-nsthread-test" || now != own {
		t.Errorf("hostname inside %q, the caller's %q (was %q)", inside, now, own)
	}
	if err := RunPid(1<<30, "uts", unix.CLONE_NEWUTS, func() error { return nil }); err == nil {
		t.Error("a process that does not exist was joined")
	}
}

// A process whose root is not what is stacked on its mount namespace's "/" (here: a tmpfs
// mounted over "/" after it started; in the v2 guest: a root made by pivot_root): joining
// the namespace alone lands on the tmpfs, RunInRoot on the process's own root.
func TestRunInRootSeesTheProcessRoot(t *testing.T) {
	priv.Root(t, "joining another mount namespace")
	dir := t.TempDir()
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
		"mount -t tmpfs lf-nsthread-test / && exec sleep 60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(b)) == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the process did not mount over its root and exec sleep within 10 s")
		}
	}
	sees := func(run func(func() error) error) bool {
		seen := false
		if err := run(func() error { _, err := os.Stat(dir); seen = err == nil; return nil }); err != nil {
			t.Fatal(err)
		}
		return seen
	}
	if sees(func(fn func() error) error { return RunPid(pid, "mnt", unix.CLONE_NEWNS, fn) }) {
		t.Fatalf("joining the namespace alone saw %s: the test does not set up what it checks", dir)
	}
	if !sees(func(fn func() error) error { return RunInRoot(pid, fn) }) {
		t.Errorf("RunInRoot did not see %s in the process's root", dir)
	}
	if err := RunInRoot(1<<30, func() error { return nil }); err == nil {
		t.Error("a process that does not exist was entered")
	}
}
