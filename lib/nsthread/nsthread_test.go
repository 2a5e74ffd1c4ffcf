package nsthread

import (
	"os"
	"os/exec"
	"syscall"
	"testing"

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
