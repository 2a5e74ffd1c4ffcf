package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// withDaemon gives the env a socket of its own; the daemon is stopped at the end.
func (e *env) withDaemon() (socket, logPath string) {
	e.t.Helper()
	dir, err := os.MkdirTemp("/tmp", "lfd-e2e-")
	if err != nil {
		e.t.Fatal(err)
	}
	socket = filepath.Join(dir, "lazyfork.sock")
	e.vars = append(e.vars, "LAZYFORK_SOCKET="+socket)
	e.t.Cleanup(func() {
		e.sh("lazyfork daemon stop")
		os.RemoveAll(dir)
	})
	root := strings.TrimPrefix(e.vars[0], "LAZYFORK_ROOT=")
	return socket, filepath.Join(root, "daemon.log")
}

// Every porcelain command goes through the daemon while one runs, and works in-process
// again once it is stopped; containers outlive the daemon.
func TestPorcelainThroughDaemon(t *testing.T) {
	e := newEnv(t)
	socket, logPath := e.withDaemon()
	if _, _, code := e.sh("lazyfork daemon status"); code != 1 {
		t.Fatalf("daemon status without a daemon: exit %d, want 1", code)
	}
	e.must("lazyfork daemon start")
	if fi, err := os.Stat(socket); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v", fi, err)
	}
	e.must("lazyfork daemon start") // already running: fine
	if out := e.must("lazyfork daemon status"); !strings.Contains(out, "daemon running") {
		t.Errorf("daemon status: %s", out)
	}

	id := e.counting("c1", 2)
	if got := e.must("lazyfork exec c1 -- hostname"); got != id {
		t.Errorf("exec hostname %q, want %s", got, id)
	}
	if got := e.must("printf 'a\\nb\\n' | lazyfork exec c1 -- wc -l"); got != "2" {
		t.Errorf("exec with stdin: %q", got)
	}
	if _, _, code := e.sh("lazyfork exec c1 -- sh -c 'exit 9'"); code != 9 {
		t.Errorf("exec exit code %d, want 9", code)
	}
	if out := e.must("lazyfork exec --json c1 -- sh -c 'echo o; echo e >&2'"); !strings.Contains(out, `"stderr": "e\n"`) {
		t.Errorf("exec --json: %s", out)
	}
	forks := strings.Fields(e.must("lazyfork fork c1 -n 2 --name twin"))
	if len(forks) != 2 {
		t.Fatalf("fork printed %v", forks)
	}
	e.must("lazyfork freeze twin")
	e.must("lazyfork thaw twin")
	e.must("lazyfork stop twin")
	e.must("lazyfork start twin")
	if out := e.must("lazyfork tree"); !strings.Contains(out, "twin") {
		t.Errorf("tree: %s", out)
	}
	if out := e.must("lazyfork stats --csv twin"); !strings.Contains(out, "restore_ms") {
		t.Errorf("stats: %s", out)
	}
	if out := e.must("lazyfork status"); !strings.Contains(out, "daemon: pid") {
		t.Errorf("status does not show the daemon: %s", out)
	}
	if _, errOut, code := e.sh("lazyfork exec nosuch -- true"); code == 0 || !strings.Contains(errOut, "no such container") {
		t.Errorf("unknown container through the daemon: exit %d, %q", code, errOut)
	}
	if _, err := exec.LookPath("script"); err == nil {
		// An interactive shell on a terminal the daemon allocates.
		out, _, code := e.sh("(sleep 0.5; echo 'hostname; exit 3') | script -qec 'lazyfork shell c1' /dev/null")
		if code != 3 || !strings.Contains(out, id) {
			t.Errorf("shell through the daemon: exit %d, output %q", code, out)
		}
	}
	log, _ := os.ReadFile(logPath)
	for _, route := range []string{"POST path=/v1/containers ", "/v1/containers/c1/fork", "/v1/containers/c1/exec",
		"/v1/containers/twin/stop", "/v1/containers/twin/freeze", "path=/v1/status"} {
		if !strings.Contains(string(log), route) {
			t.Errorf("the daemon did not serve %s; its log:\n%s", route, log)
		}
	}

	// Stopped daemon: the containers keep running and the commands work in-process.
	e.must("lazyfork daemon stop")
	if _, err := os.Stat(socket); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
	out := e.must("lazyfork list")
	if strings.Count(out, "running") != 3 {
		t.Errorf("after daemon stop:\n%s", out)
	}
	e.must("lazyfork stop " + forks[1])
	if got := e.must("lazyfork daemon clean"); got != forks[1] {
		t.Errorf("daemon clean printed %q, want %s", got, forks[1])
	}
	// A daemon of another state root is not used.
	e.must("lazyfork daemon start")
	if out, errOut, code := e.sh("LAZYFORK_ROOT=" + t.TempDir() + " lazyfork list -q"); code != 0 || strings.TrimSpace(out) != "" {
		t.Errorf("list with another root went to the daemon: %q %s", out, errOut)
	}
}

// --trace prints the command's steps with the daemon's own (the header and the exec
// stream's trace frame), in both the fork and the exec of a fork, and changes nothing
// on stdout; without a daemon it traces the steps run in-process.
func TestTraceThroughDaemon(t *testing.T) {
	e := newEnv(t)
	e.withDaemon()
	e.must("lazyfork daemon start")
	e.counting("c1", 1)
	steps := func(stderr string) map[string]bool {
		got := map[string]bool{}
		for _, line := range strings.Split(stderr, "\n") {
			if f := strings.Fields(line); len(f) > 2 {
				got[strings.Join(f[2:], " ")] = true
			}
		}
		return got
	}
	for i, want := range [][]string{
		// The first fork moves c1 onto its snapshot; the second dumps what it changed.
		{"find the daemon", "daemon: dump", "daemon: criu: request DUMP until the answer", "daemon: criu restore", "daemon: write the record"},
		{"daemon: dump", "daemon: memfile: move the memory into the family's files", "daemon: criu restore"},
	} {
		out, errOut, code := e.sh("lazyfork --trace fork c1 --json")
		if code != 0 {
			t.Fatalf("fork %d: exit %d: %s", i, code, errOut)
		}
		var f struct{ ID string }
		if err := json.Unmarshal([]byte(out), &f); err != nil || f.ID == "" {
			t.Fatalf("fork %d: stdout is not the fork's JSON line: %q", i, out)
		}
		got := steps(errOut)
		for _, w := range want {
			if !got[w] {
				t.Errorf("fork %d: no step %q in the trace:\n%s", i, w, errOut)
			}
		}
		out, errOut, code = e.sh("lazyfork --trace exec " + f.ID + " -- hostname")
		if code != 0 || strings.TrimSpace(out) != f.ID {
			t.Fatalf("exec: exit %d, stdout %q: %s", code, out, errOut)
		}
		if got := steps(errOut); !got["daemon: exec "+f.ID] || !got["daemon: the command runs"] {
			t.Errorf("exec trace without the daemon's steps:\n%s", errOut)
		}
	}
	if _, errOut, _ := e.sh("lazyfork list"); strings.Contains(errOut, "start ms") {
		t.Errorf("a command without --trace printed a trace: %s", errOut)
	}
	e.must("lazyfork daemon stop")
	if _, errOut, code := e.sh("lazyfork --trace exec c1 -- true"); code != 0 || !steps(errOut)["exec c1"] {
		t.Errorf("in-process exec trace: exit %d:\n%s", code, errOut)
	}
}

// lazyfork runs the container commands through a daemon by itself and hands everything
// else to lazyfork-engine next to it: a copy of lazyfork alone (no engine beside it) forks,
// execs, lists and deletes through a running daemon; for a command line no daemon serves
// (--local, doctor, tree, help, a usage error) it names the missing engine in one line and
// exits 1.
func TestClientHandsOverToEngine(t *testing.T) {
	e := newEnv(t)
	e.withDaemon()
	e.must("lazyfork daemon start")
	id := e.counting("c1", 1)
	alone := filepath.Join(t.TempDir(), "lazyfork")
	b, err := os.ReadFile(filepath.Join(binDir, "lazyfork"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(alone, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := e.must(alone + " exec c1 -- hostname"); got != id {
		t.Errorf("exec hostname through the daemon: %q, want %s", got, id)
	}
	fork := e.must(alone + " fork c1 --name f1")
	if got := e.must(alone + " exec f1 -- hostname"); got != fork {
		t.Errorf("exec in the fork: %q, want %s", got, fork)
	}
	if out := e.must(alone + " list -q"); !strings.Contains(out, id) || !strings.Contains(out, fork) {
		t.Errorf("list through the daemon: %q", out)
	}
	e.must(alone + " delete f1")
	for _, args := range []string{"--local list", "doctor", "tree", "--help", "fork"} {
		_, errOut, code := e.sh(alone + " " + args)
		if code != 1 || !strings.Contains(errOut, "lazyfork-engine") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("lazyfork %s without lazyfork-engine: exit %d, %q", args, code, errOut)
		}
	}
}
