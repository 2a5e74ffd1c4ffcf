package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/lazyfork/lazyfork/lib/exitcode"
)

// An operation the container's state does not allow fails the same way from every entry
// point (a stage binary, the porcelain in-process, the porcelain through the daemon):
// exit status 4 and a one-line error naming the operation and the state; nothing runs.
func TestInvalidStateFromEveryEntryPoint(t *testing.T) {
	e := newEnv(t)
	e.withDaemon()
	e.must("lazyfork create lazyfork/debian:bookworm --name c1 -- sleep 1000")
	e.must("lazyfork stop c1")
	want := func(how, cmd, inErr string) {
		t.Helper()
		out, errOut, code := e.sh(cmd)
		line := strings.TrimSpace(errOut)
		if code != exitcode.InvalidState || strings.Contains(line, "\n") || !strings.Contains(line, inErr) || strings.TrimSpace(out) != "" {
			t.Errorf("%s: %s: exit %d, stdout %q, stderr %q; want exit %d and one line saying %q", how, cmd, code, out, errOut, exitcode.InvalidState, inErr)
		}
	}
	for _, how := range []string{"in-process", "daemon"} {
		if how == "daemon" {
			e.must("lazyfork daemon start")
		}
		want(how, "lf-dump c1", "dump c1: it is stopped")
		want(how, "lf-tree get c1 | lf-dump -", "dump c1: it is stopped")
		want(how, "lazyfork stop c1", "stop c1: it is stopped")
		want(how, "lazyfork freeze c1", "freeze c1: it is stopped")
		want(how, "lazyfork thaw c1", "thaw c1: it is stopped")
		want(how, "lazyfork exec c1 -- true", "exec c1: it is stopped")
		e.must("lazyfork start c1")
		want(how, "lazyfork start c1", "start c1: it is running")
		want(how, "lazyfork thaw c1", "thaw c1: it is running")
		e.must("lazyfork freeze c1")
		want(how, "lf-dump c1", "dump c1: it is frozen")
		want(how, "lazyfork fork c1", "fork c1: it is frozen")
		e.must("lazyfork thaw c1 && lazyfork stop c1")
	}
	// Not found and usage have their own statuses, the same from a stage and the porcelain.
	for cmd, code := range map[string]int{
		"lf-dump nosuch": exitcode.NotFound, "lazyfork stop nosuch": exitcode.NotFound,
		"lf-restore nosuch": exitcode.NotFound, "lf-dump": exitcode.Usage, "lazyfork stop --bogus c1": exitcode.Usage,
	} {
		if _, errOut, got := e.sh(cmd); got != code {
			t.Errorf("%s: exit %d (%s), want %d", cmd, got, strings.TrimSpace(errOut), code)
		}
	}
}

// lf-dump and `lazyfork stop` racing on one container take its lock in turn: whichever
// runs second sees the first one's outcome (a dump of a stopped container is refused with
// status 4; a stop after a dump just stops), never a half-dumped or half-stopped one.
func TestDumpAndStopSerialised(t *testing.T) {
	e := newEnv(t)
	for round := range 3 {
		name := fmt.Sprintf("race%d", round)
		e.must("lazyfork create lazyfork/debian:bookworm --name " + name + " -- " + counter)
		var wg sync.WaitGroup
		var dumpCode, stopCode int
		var dumpErr, stopErr string
		wg.Add(2)
		go func() { defer wg.Done(); _, dumpErr, dumpCode = e.sh("lf-dump " + name + " > /dev/null") }()
		go func() { defer wg.Done(); _, stopErr, stopCode = e.sh("lazyfork stop " + name) }()
		wg.Wait()
		if stopCode != 0 {
			t.Fatalf("round %d: stop failed (exit %d): %s", round, stopCode, stopErr)
		}
		if dumpCode != 0 && (dumpCode != exitcode.InvalidState || !strings.Contains(dumpErr, "it is stopped")) {
			t.Fatalf("round %d: dump: exit %d: %s; want success or exit 4 (it is stopped)", round, dumpCode, dumpErr)
		}
		t.Logf("round %d: dump exit %d, stop exit %d", round, dumpCode, stopCode)
		var rec struct{ State string }
		if err := json.Unmarshal([]byte(e.must("lf-tree get "+name)), &rec); err != nil || rec.State != "stopped" {
			t.Errorf("round %d: %s is %q after the race (%v), want stopped", round, name, rec.State, err)
		}
		// It starts again from the stop's snapshot and keeps counting.
		e.must("lazyfork start " + name)
		e.must("lazyfork delete " + name)
	}
}
