package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A dump cancelled at any point leaves no criu process behind: neither criu itself nor
// anything it forked (these were seen as orphan "criu swrk" processes). The test process
// is a child subreaper meanwhile, so whatever a killed criu leaves becomes our child and
// shows up here instead of under init.
func TestCancelledDumpLeavesNoCriu(t *testing.T) {
	requirePriv(t)
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })
	root := filepath.Join(t.TempDir(), "root")
	pid := startContained(t, root)
	kdat := kdatTempDir(t)
	before := ourChildren(t)
	cancelled := 0
	for _, after := range []time.Duration{0, 10 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond, 150 * time.Millisecond, 300 * time.Millisecond} {
		ctx, cancel := context.WithCancel(context.Background())
		timer := time.AfterFunc(after, cancel)
		_, err := Dump(ctx, DumpOptions{Pid: pid, CheckpointDir: t.TempDir(), LeaveRunning: true, KdatDir: kdat,
			ExternalMounts: map[string]string{"/usr": "usr"}, FreezeCgroup: ""})
		timer.Stop()
		cancel()
		if err == nil {
			continue
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("dump cancelled after %v: %v", after, err)
		}
		cancelled++
		// Orphans reach us asynchronously: give them a moment, then none may be left.
		var left []string
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			left = strangers(before)
		}
		if len(left) != 0 {
			t.Fatalf("dump cancelled after %v left processes behind: %s", after, strings.Join(left, "; "))
		}
	}
	if cancelled == 0 {
		t.Fatal("no dump was cancelled mid-way")
	}
	t.Logf("%d of 6 dumps cancelled mid-way, nothing left", cancelled)
	// The workload was not left stopped.
	n := len(counts(t, filepath.Join(root, "cnt.log")))
	waitCount(t, filepath.Join(root, "cnt.log"), n+2)
}

// strangers lists our live children that were not in before; zombies (what the kill
// left with us, a subreaper) are reaped.
func strangers(before []int) []string {
	var out []string
	tasks, _ := filepath.Glob("/proc/self/task/*/children")
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, p := range strings.Fields(string(b)) {
			var pid int
			fmt.Sscan(p, &pid)
			if slices.Contains(before, pid) {
				continue
			}
			if st, _ := os.ReadFile("/proc/" + p + "/stat"); strings.Contains(string(st), ") Z ") {
				var ws unix.WaitStatus
				_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
				continue
			}
			cmd, _ := os.ReadFile("/proc/" + p + "/cmdline")
			out = append(out, p+" "+strings.ReplaceAll(strings.TrimSpace(string(cmd)), "\x00", " "))
		}
	}
	return out
}
