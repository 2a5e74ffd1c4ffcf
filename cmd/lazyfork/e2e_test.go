package main

// End-to-end tests of the binaries as a user runs them: the porcelain, and the stage
// pipeline in a shell. They build the binaries once (or use $LAZYFORK_BIN).

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

var binDir string

func TestMain(m *testing.M) {
	binDir = os.Getenv("LAZYFORK_BIN")
	if binDir == "" && os.Geteuid() == 0 {
		dir, err := os.MkdirTemp("", "lazyfork-bin-")
		if err != nil {
			panic(err)
		}
		defer os.RemoveAll(dir)
		for _, pkg := range []string{"./cmd/lazyfork", "./cmd/lazyfork-engine", "./cmd/lazyfork-helper", "./lf-dump", "./lf-memfile", "./lf-restore", "./lf-tree", "./lf-overlay", "./lf-cgroup", "./lf-inspect"} {
			out, err := exec.Command("go", "build", "-C", "../..", "-o", filepath.Join(dir, filepath.Base(pkg)), pkg).CombinedOutput()
			if err != nil {
				fmt.Fprintf(os.Stderr, "build %s: %v\n%s", pkg, err, out)
				os.Exit(2)
			}
		}
		binDir = dir
	}
	os.Exit(m.Run())
}

// env gives a test its own state roots (sharing the machine's image store) and removes
// every container it made when it ends.
type env struct {
	t    *testing.T
	vars []string
	run  string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	testutil.RequireRoot(t)
	root := t.TempDir()
	run, err := os.MkdirTemp("/dev/shm", "lazyfork-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	// Images come from the machine's store; everything else is private to the test.
	imgs := "/var/lib/lazyfork/images"
	if err := os.Symlink(imgs, filepath.Join(root, "images")); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, run: run, vars: []string{"LAZYFORK_ROOT=" + root, "LAZYFORK_RUN=" + run, "PATH=" + binDir + ":" + os.Getenv("PATH")}}
	t.Cleanup(func() {
		ids, _, _ := e.sh("lazyfork list -q")
		for _, id := range strings.Fields(ids) {
			if _, errOut, code := e.sh("lazyfork delete " + id); code != 0 {
				t.Errorf("cleanup delete %s: %s", id, errOut)
			}
		}
		if m := fsutil.MountsUnder(root); len(m) > 0 {
			t.Errorf("mounts left: %v", m)
		}
		_ = fsutil.RemoveAll(run)
	})
	return e
}

// sh runs a shell command line with the test's environment.
func (e *env) sh(cmd string) (stdout, stderr string, code int) {
	c := exec.Command("bash", "-o", "pipefail", "-c", cmd)
	c.Env = append(os.Environ(), e.vars...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
	}
	return out.String(), errb.String(), code
}

func (e *env) must(cmd string) string {
	e.t.Helper()
	out, errOut, code := e.sh(cmd)
	if code != 0 {
		e.t.Fatalf("%s: exit %d: %s", cmd, code, errOut)
	}
	return strings.TrimSpace(out)
}

const counter = `python3 -c 'import itertools, time; [print(i, flush=True) or time.sleep(0.2) for i in itertools.count()]'`

// counting starts a container called name running counter and waits until it has
// printed n; it returns the container's id.
func (e *env) counting(name string, n int) string {
	e.t.Helper()
	id := e.must("lazyfork create lazyfork/debian:bookworm --name " + name + " -- " + counter)
	testutil.Eventually(e.t, 10*time.Second, name+" to count", func() bool {
		out, _, _ := e.sh("lazyfork attach --no-follow " + name)
		return testutil.LastInt(out) >= n
	})
	return id
}

func TestShellPipelineForksTen(t *testing.T) {
	e := newEnv(t)
	e.counting("c1", 3)
	out := e.must("lf-dump c1 | lf-memfile | lf-restore -n 10")
	lines := strings.Split(out, "\n")
	if len(lines) != 10 {
		t.Fatalf("lf-restore printed %d lines, want 10:\n%s", len(lines), out)
	}
	for _, l := range lines {
		var f struct {
			Kind, ID, Parent, Hostname string
			Depth                      int
		}
		if err := json.Unmarshal([]byte(l), &f); err != nil || f.Kind != "lazyfork.fork" || f.Depth != 1 || f.Hostname != f.ID {
			t.Fatalf("bad fork line %q (%v)", l, err)
		}
		testutil.Eventually(t, 10*time.Second, "fork to count past the parent's dump", func() bool {
			o, _, _ := e.sh("lazyfork attach --no-follow " + f.ID)
			return testutil.LastInt(o) >= 5
		})
		if h := e.must("lazyfork exec " + f.ID + " -- hostname"); h != f.ID {
			t.Errorf("hostname %q", h)
		}
	}
	// Each stage alone, on files, for debugging.
	e.must("lf-dump c1 > " + e.run + "/d.json && lf-memfile < " + e.run + "/d.json > " + e.run + "/m.json && lf-restore -n 1 --rm < " + e.run + "/m.json")
	if list := e.must("lazyfork list"); strings.Count(list, " c1 ") != 12 {
		t.Errorf("list shows %d rows naming c1, want c1 and its 11 forks:\n%s", strings.Count(list, " c1 "), list)
	}
	tree := e.must("lazyfork tree")
	if !strings.HasPrefix(tree, "") || strings.Count(tree, "├──")+strings.Count(tree, "└──") != 11 {
		t.Errorf("tree:\n%s", tree)
	}
	csv := e.must("lazyfork stats --csv " + lines[0][strings.Index(lines[0], `"id":"`)+6:][:12])
	if rows := strings.Split(csv, "\n"); len(rows) != 2 || !strings.HasPrefix(rows[0], "id,name,state") {
		t.Errorf("stats --csv:\n%s", csv)
	}
}

func TestReadmeTwinContinuesCount(t *testing.T) {
	e := newEnv(t)
	e.must("lazyfork create lazyfork/debian:bookworm --name counter -- " + counter)
	time.Sleep(time.Second)
	e.must("lazyfork fork counter --name twin")
	parentAt := testutil.LastInt(e.must("lazyfork attach --no-follow counter"))
	testutil.Eventually(t, 10*time.Second, "twin to continue", func() bool {
		out, _, _ := e.sh("lazyfork attach --no-follow twin")
		return testutil.LastInt(out) > parentAt
	})
	out := e.must("lazyfork attach --no-follow twin")
	for i, l := range strings.Fields(out) {
		if l != strconv.Itoa(i) {
			t.Fatalf("twin's output restarts or skips at line %d: %s", i, l)
		}
	}
	e.must("lazyfork delete counter")
	if st := e.must("lazyfork list --json"); !strings.Contains(st, `"state": "running"`) {
		t.Errorf("twin not running after its parent was deleted: %s", st)
	}
}

// Every bad input: one line on stderr naming the problem, non-zero exit, nothing left.
func TestBadInputOneLineErrors(t *testing.T) {
	e := newEnv(t)
	e.must("lazyfork create lazyfork/debian:bookworm --name taken -- sleep 1000")
	e.must("lazyfork create lazyfork/debian:bookworm --name frozen -- sleep 1000 && lazyfork freeze frozen")
	bad := filepath.Join(t.TempDir(), "bad.tar")
	writeCorruptTar(t, bad)
	notImage := t.TempDir()
	os.WriteFile(filepath.Join(notImage, "x"), []byte("x"), 0o644)
	cases := []struct{ cmd, want string }{
		{"lazyfork create no-such-image-here -- true", "no-such-image-here"},
		{"lazyfork create lazyfork/debian:bookworm --name taken -- true", "already in use"},
		{"lazyfork create lazyfork/debian:bookworm --name 'bad name' -- true", "invalid name"},
		{"lazyfork create lazyfork/debian:bookworm --name nocmd", "no command"},
		{"lazyfork create lazyfork/debian:bookworm --name nobin -- no-such-binary", "not found in the image"},
		{"lazyfork create " + bad + " -- true", "docker save"},
		{"lazyfork exec nope -- true", "no such container"},
		{"lazyfork exec '' -- true", "no such container"},
		{"lazyfork fork nope", "no such container"},
		{"lazyfork fork frozen", "thaw"},
		{"lazyfork delete nope", "no such container"},
		{"lf-dump nope", "no such container"},
		{"echo '{}' | lf-memfile", "lf-dump"},
		{"lf-memfile " + notImage, "not a LazyFork snapshot"},
		{"echo 'garbage' | lf-restore -n 2", "snapshot JSON"},
		{"lf-restore -n 2 < /dev/null", "no input"},
	}
	before := e.must("lazyfork list -q | sort; ls " + e.run + "; find /sys/fs/cgroup -path '*lazyfork*' -type d | sort")
	for _, tc := range cases {
		out, errOut, code := e.sh(tc.cmd)
		errOut = strings.TrimSpace(errOut)
		if code == 0 {
			t.Errorf("%s: exit 0 (stdout %q)", tc.cmd, out)
			continue
		}
		if strings.Count(errOut, "\n") > 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%s: stderr %q, want one line mentioning %q", tc.cmd, errOut, tc.want)
		}
	}
	if after := e.must("lazyfork list -q | sort; ls " + e.run + "; find /sys/fs/cgroup -path '*lazyfork*' -type d | sort"); after != before {
		t.Errorf("bad input left things behind:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// Ambiguous prefix: make two containers whose ids share a first digit.
	ids := strings.Fields(e.must("lazyfork list -q"))
	seen := map[byte]bool{}
	for len(ids) < 40 {
		prefixHit := false
		for _, id := range ids {
			if seen[id[0]] {
				prefixHit = true
				_, errOut, code := e.sh("lazyfork exec " + id[:1] + " -- true")
				if code == 0 || !strings.Contains(errOut, "ambiguous") {
					t.Errorf("ambiguous prefix %s: %q", id[:1], errOut)
				}
				break
			}
			seen[id[0]] = true
		}
		if prefixHit {
			break
		}
		ids = append(ids, e.must("lazyfork create lazyfork/debian:bookworm -- sleep 1000"))
		seen = map[byte]bool{}
	}
}

func writeCorruptTar(t *testing.T, path string) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "manifest.json", Mode: 0o644, Size: 400})
	tw.Write([]byte(`[{"Config":"c.json","RepoTags":["x:1"],"Layers":["l.tar"]}]`))
	os.WriteFile(path, b.Bytes()[:700], 0o644)
}

func TestDeleteLeavesNothing(t *testing.T) {
	e := newEnv(t)
	before := e.must("find /sys/fs/cgroup -path '*lazyfork*' -type d | sort; grep -c lazyfork /proc/self/mountinfo || true")
	e.must("lazyfork create lazyfork/debian:bookworm --name a -- sh -c 'sleep 1000 & sleep 1000'")
	e.must("lazyfork fork a -n 2")
	e.must("lazyfork stop a")
	for i, id := range strings.Fields(e.must("lazyfork list -q")) {
		cmd := "lazyfork delete "
		if i%2 == 1 {
			cmd = "lazyfork rm -f " // docker's habit, running forks too
		}
		e.must(cmd + id)
	}
	if after := e.must("find /sys/fs/cgroup -path '*lazyfork*' -type d | sort; grep -c lazyfork /proc/self/mountinfo || true"); after != before {
		t.Errorf("delete left cgroups or mounts:\nbefore %s\nafter %s", before, after)
	}
	if left := e.must("ls -A " + e.run + "/families " + e.run + "/snapshots 2>/dev/null | grep -v : || true"); left != "" {
		t.Errorf("tmpfs files left: %s", left)
	}
}

// `lazyfork fork` SIGKILLed in the middle of a batch: whole forks may stay (they are
// complete containers), half-made ones are collected by the next gc, and the source runs on.
func TestKilledMidBatch(t *testing.T) {
	e := newEnv(t)
	e.must("lazyfork create lazyfork/debian:bookworm --name src -- " + counter)
	time.Sleep(time.Second)
	cmd := exec.Command(filepath.Join(binDir, "lazyfork"), "fork", "src", "-n", "12")
	cmd.Env = append(os.Environ(), e.vars...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the batch to be under way", func() bool {
		out, _, _ := e.sh("lazyfork list --json | grep -c '\"parent\": \"'")
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n >= 2
	})
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	// The killed command's criu workers hold the state lock until they finish or die (seconds
	// under emulation): gc says so and is run again, as its message tells a user to.
	testutil.Eventually(t, 30*time.Second, "gc to run once the killed batch's workers are gone", func() bool {
		_, stderr, code := e.sh("lazyfork gc")
		if code != 0 && !strings.Contains(stderr, "run gc again when it ends") {
			t.Fatalf("lazyfork gc: exit %d: %s", code, stderr)
		}
		return code == 0
	})
	out := e.must("lazyfork list --json")
	if strings.Contains(out, `"creating"`) {
		t.Errorf("half-made forks left after gc:\n%s", out)
	}
	var rows []struct{ ID, State string }
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.State != "running" {
			t.Errorf("%s is %s after the kill", r.ID, r.State)
			continue
		}
		e.must("lazyfork exec " + r.ID + " -- true")
	}
	if snaps := e.must("ls -A " + e.run + "/snapshots 2>/dev/null || true"); snaps != "" {
		t.Errorf("transient snapshot of the killed command left: %s", snaps)
	}
}

func TestOverlayAndTreeStagesAlone(t *testing.T) {
	e := newEnv(t)
	d := filepath.Join(e.run, "overlay-alone") // stage input must lie inside the state roots
	low := filepath.Join(d, "low")
	os.MkdirAll(low, 0o755)
	os.WriteFile(filepath.Join(low, "f"), []byte("lower"), 0o644)
	layer := e.must("lf-overlay prepare --lower " + low + " --upper " + d + "/up --work " + d + "/wk --target " + d + "/mnt")
	if b, _ := os.ReadFile(filepath.Join(d, "mnt", "f")); string(b) != "lower" {
		t.Fatalf("overlay does not show the lower layer: %q", b)
	}
	os.WriteFile(filepath.Join(d, "mnt", "g"), []byte("up"), 0o644)
	if _, err := os.Stat(filepath.Join(d, "up", "g")); err != nil {
		t.Errorf("write did not land in the upper: %v", err)
	}
	e.must("echo '" + layer + "' | lf-overlay teardown")
	if fsutil.IsMountPoint(filepath.Join(d, "mnt")) {
		t.Errorf("still mounted after teardown")
	}
	if _, err := os.Stat(filepath.Join(low, "f")); err != nil {
		t.Errorf("teardown touched the lower layer: %v", err)
	}
	id := e.must("lazyfork create lazyfork/debian:bookworm --name treeme -- sleep 1000")
	rec := e.must("lf-tree get treeme")
	if !strings.Contains(rec, `"id":"`+id+`"`) {
		t.Errorf("lf-tree get: %s", rec)
	}
	if n := len(strings.Split(e.must("lf-tree list"), "\n")); n != 1 {
		t.Errorf("lf-tree list: %d lines", n)
	}
}

// Several containers in one `lazyfork delete`, with a reference that names none: each one
// found is deleted and printed, the unknown one is reported with the not-found status, and
// what they shared (memory files, snapshots) is collected once at the end.
func TestDeleteSeveralInOneCall(t *testing.T) {
	e := newEnv(t)
	e.must("lazyfork create lazyfork/debian:bookworm --name a -- sleep 1000")
	e.must("lazyfork fork a -n 2")
	ids := strings.Fields(e.must("lazyfork list -q"))
	if len(ids) != 3 {
		t.Fatalf("want a source and 2 forks, got %v", ids)
	}
	out, errOut, code := e.sh("lazyfork delete " + strings.Join(ids, " ") + " nope")
	if code != 3 || !strings.Contains(errOut, `"nope"`) || strings.Count(errOut, "\n") != 1 {
		t.Errorf("delete with an unknown reference: exit %d, stderr %q; want 3 and one line naming it", code, errOut)
	}
	if got := strings.Fields(out); strings.Join(got, " ") != strings.Join(ids, " ") {
		t.Errorf("delete printed %v, want %v", got, ids)
	}
	if left := e.must("lazyfork list -q"); left != "" {
		t.Errorf("containers left: %s", left)
	}
	if left := e.must("ls -A " + e.run + "/families " + e.run + "/snapshots 2>/dev/null | grep -v : || true"); left != "" {
		t.Errorf("tmpfs files left: %s", left)
	}
}
