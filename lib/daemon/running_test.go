package daemon_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/daemon"
	"github.com/lazyfork/lazyfork/lib/paths"
)

// TestRunningFromLockFile: while a daemon listens, its lock file says which state
// directories it serves (Running, which lets a command skip the ping); a second daemon's
// refusal names the pid alone; once it stops, or when the file names a process that is not
// the one recorded, Running is not sure and the command asks the socket.
func TestRunningFromLockFile(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "d", "lazyfork.sock")
	if _, _, ok := client.Running(socket); ok {
		t.Fatal("Running before any daemon")
	}
	_, closeFn, err := daemon.Listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	root, run, ok := client.Running(socket)
	if !ok || root != paths.Root() || run != paths.Run() {
		t.Errorf("Running while listening: %q %q %v, want %q %q", root, run, ok, paths.Root(), paths.Run())
	}
	if _, _, err := daemon.Listen(socket); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("(pid %d)", os.Getpid())) {
		t.Errorf("second daemon: %v", err)
	}
	closeFn()
	if _, _, ok := client.Running(socket); ok {
		t.Error("Running after the daemon stopped")
	}
	// Forged or stale: a pid that is gone, or a start time that is not its process's.
	for _, body := range []string{
		"1\n{\"pid\": 1, \"start\": 123456789123, \"root\": \"/\", \"run\": \"/\"}\n",
		"999999999\n{\"pid\": 999999999, \"start\": 5, \"root\": \"/\", \"run\": \"/\"}\n",
		fmt.Sprintf("%d\n", os.Getpid()),
		fmt.Sprintf("%d\n{\"pid\": %d}\n", os.Getpid(), os.Getpid()),
	} {
		if err := os.WriteFile(socket+".lock", []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, ok := client.Running(socket); ok {
			t.Errorf("Running with lock file %q", body)
		}
	}
}
