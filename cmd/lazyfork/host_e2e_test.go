package main

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/lazyfork/lazyfork/lib/testutil"
	"github.com/lazyfork/lazyfork/lib/testutil/timescale"
)

// busyboxLayoutDir writes busyboxImage as an OCI layout and returns its directory.
func busyboxLayoutDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bb")
	p, err := layout.Write(dir, empty.Index)
	if err == nil {
		err = p.AppendImage(busyboxImage(t))
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// oneLineError fails unless a command failed with exactly one line on stderr holding want.
func oneLineError(t *testing.T, what, stderr string, code int, want string) {
	t.Helper()
	t.Logf("%s: exit %d: %s", what, code, strings.TrimSpace(stderr))
	if code == 0 {
		t.Fatalf("%s succeeded", what)
	}
	if strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, want) {
		t.Errorf("%s: stderr %q, want one line with %q", what, stderr, want)
	}
}

// listDir names the entries of dir, sorted.
func listDir(t *testing.T, dir string) string {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}

// TestImageRmWhileUsed: `image rm` refuses while a running or stopped container (and its
// snapshot) needs the image's layers, names them, and leaves the store as it was; once
// they are deleted the image goes.
func TestImageRmWhileUsed(t *testing.T) {
	e := newPrivateEnv(t)
	root := strings.TrimPrefix(e.vars[0], "LAZYFORK_ROOT=")
	e.must("lazyfork create " + busyboxLayoutDir(t) + " --name web -- sh -c 'echo up; sleep 100000'")
	waitOutput(t, e, "web", "up")
	name := e.must("lazyfork image list --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0][\"name\"])'")
	id := e.must("lazyfork list --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0][\"id\"])'")
	store := func() string {
		return listDir(t, filepath.Join(root, "images", "refs")) + " | " + listDir(t, filepath.Join(root, "images", "layers"))
	}
	before := store()

	_, errOut, code := e.sh("lazyfork image rm " + name)
	oneLineError(t, "image rm of a running container's image", errOut, code, "image still in use by container web ("+id+"); delete them first")
	if got := store(); got != before {
		t.Errorf("store changed: %s -> %s", before, got)
	}

	e.must("lazyfork stop web")
	_, errOut, code = e.sh("lazyfork image rm " + name)
	oneLineError(t, "image rm of a stopped container's image", errOut, code, "image still in use by container web ("+id+"), snapshot ")
	if !strings.Contains(errOut, "(of web ("+id+"))") {
		t.Errorf("the snapshot is not named with its container: %s", errOut)
	}
	if got := store(); got != before {
		t.Errorf("store changed: %s -> %s", before, got)
	}

	e.must("lazyfork delete web")
	e.must("lazyfork gc")
	e.must("lazyfork image rm " + name)
	if got := listDir(t, filepath.Join(root, "images", "layers")); got != "" {
		t.Errorf("layers left after image rm: %s", got)
	}
}

// TestHostileContainerOutputs: a container that swaps its output log for a symlink to a
// host file does not make `attach` print that file; exec --json output over the bound is
// a one-line error, not a daemon or CLI eating memory.
func TestHostileContainerOutputs(t *testing.T) {
	e := newPrivateEnv(t)
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("HOST-SECRET\n"), 0o600)
	e.must("lazyfork create " + busyboxLayoutDir(t) + " --name liar -- sh -c 'echo hi; sleep 100000'")
	waitOutput(t, e, "liar", "hi")
	e.must("lazyfork exec liar -- sh -c 'cd /var/log/lazyfork && rm output.log && ln -s " + secret + " output.log'")
	out, errOut, code := e.sh("lazyfork attach --no-follow liar")
	if strings.Contains(out+errOut, "HOST-SECRET") {
		t.Fatalf("attach printed a host file: %q %q", out, errOut)
	}
	oneLineError(t, "attach of a symlinked log", errOut, code, "/var/log/lazyfork/output.log is a symlink inside the container; not reading it")

	start := time.Now()
	out, errOut, code = e.sh("lazyfork exec --json liar -- busybox head -c 17000000 /dev/zero")
	oneLineError(t, "exec --json over the bound", errOut, code, "the command wrote more than 16 MiB to stdout and was killed")
	if out != "" {
		t.Errorf("exec printed %d bytes of JSON after failing", len(out))
	}
	if time.Since(start) > timescale.Scale(30*time.Second) {
		t.Errorf("exec over the bound took %v", time.Since(start))
	}
	// Streamed, the same output is fine.
	if n := e.must("lazyfork exec liar -- busybox head -c 17000000 /dev/zero | wc -c"); n != "17000000" {
		t.Errorf("streamed exec gave %s bytes", n)
	}
}

// TestUnsafeStateRoots: a LAZYFORK_RUN another user made (or anyone may write, or that is
// a symlink) is refused by the porcelain and by the stages that use the state roots, with
// the fix in the message,
// and nothing is created in it.
func TestUnsafeStateRoots(t *testing.T) {
	testutil.RequireRoot(t)
	cases := []struct {
		name string
		prep func(run string)
		want string
	}{
		{"owned by uid 1000", func(run string) { os.Mkdir(run, 0o700); os.Chown(run, 1000, 1000) }, "is owned by uid 1000, not root; remove it or set LAZYFORK_RUN"},
		{"mode 0777", func(run string) { os.Mkdir(run, 0o777); os.Chmod(run, 0o777) }, "has mode 0777, writable by others; remove it or set LAZYFORK_RUN"},
		{"symlink", func(run string) {
			os.Mkdir(run+"-real", 0o700)
			os.Symlink(run+"-real", run)
		}, "is a symlink or not a directory; remove it or set LAZYFORK_RUN"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base, err := os.MkdirTemp("/dev/shm", "lazyfork-unsafe-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(base) })
			run := filepath.Join(base, "run")
			c.prep(run)
			e := &env{t: t, vars: []string{"LAZYFORK_ROOT=" + t.TempDir(), "LAZYFORK_RUN=" + run, "PATH=" + binDir + ":" + os.Getenv("PATH")}}
			before := listDir(t, run) + "|" + listDir(t, run+"-real")
			_, errOut, code := e.sh("lazyfork list")
			oneLineError(t, "lazyfork list", errOut, code, c.want)
			for _, stage := range []string{"lf-dump nosuch", "lf-tree list", "lf-overlay teardown < /dev/null"} {
				_, errOut, code = e.sh(stage)
				oneLineError(t, stage, errOut, code, c.want)
			}
			if after := listDir(t, run) + "|" + listDir(t, run+"-real"); after != before {
				t.Errorf("something was created in the refused directory: %q -> %q", before, after)
			}
		})
	}
}
