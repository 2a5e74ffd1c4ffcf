package hook_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

var ctx = context.Background()

// repo is the repository root (examples/ and python/ live there).
func repo(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// waitScript starts CMD once the test has copied /app in.
const waitScript = `until [ -e /app/ready ]; do sleep 0.05; done; exec "$@"`

// createWithApp creates a container with a hook at /run/agent.sock that runs argv once
// the test has installed examples/agent.py and python/lazyfork/hook.py under /app.
func createWithApp(t *testing.T, rt *container.Runtime, name string, files map[string]string, argv ...string) *store.Container {
	t.Helper()
	cmd := append([]string{"sh", "-c", waitScript, "sh"}, argv...)
	c, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: name, Command: cmd,
		Hook: "/run/agent.sock", Env: []string{hook.EnvVar + "=/run/agent.sock", "AGENT_INTERVAL=0.05"}})
	if err != nil {
		t.Fatal(err)
	}
	for dst, src := range map[string]string{
		"/app/examples/agent.py":       filepath.Join(repo(t), "examples", "agent.py"),
		"/app/python/lazyfork/hook.py": filepath.Join(repo(t), "python", "lazyfork", "hook.py"),
	} {
		files[dst] = src
	}
	for dst, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			b = []byte(src) // inline content
		}
		if err := os.MkdirAll(filepath.Dir(c.RootFS+dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(c.RootFS+dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(c.RootFS+"/app/ready", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return c
}

func logOf(c *store.Container) string {
	b, _ := os.ReadFile(container.LogPath(c))
	return string(b)
}

func waitLog(t *testing.T, c *store.Container, what string, re *regexp.Regexp) {
	t.Helper()
	testutil.Eventually(t, 20*time.Second, what, func() bool { return re.MatchString(logOf(c)) })
}

var tokenRe = regexp.MustCompile(`step=(\d+) token=([0-9a-f]{8}) memory=(\d+) fork=(\S+)`)

// tokensAfterReseed returns the tokens a fork drew after its reseed line (skipping the
// first step, which may have been drawn before the reseed landed).
func tokensAfterReseed(t *testing.T, c *store.Container, n int) (reseedStep string, tokens []string) {
	t.Helper()
	re := regexp.MustCompile(`reseed fork=` + c.ID + ` step=(\d+) memory=(\d+)`)
	testutil.Eventually(t, 20*time.Second, "tokens after reseed in "+c.ID, func() bool {
		log := logOf(c)
		loc := re.FindStringSubmatchIndex(log)
		if loc == nil {
			return false
		}
		reseedStep = log[loc[2]:loc[3]]
		tokens = tokens[:0]
		for _, m := range tokenRe.FindAllStringSubmatch(log[loc[1]:], -1) {
			if m[4] == c.ID {
				tokens = append(tokens, m[2])
			}
		}
		return len(tokens) > n
	})
	return reseedStep, tokens[1 : n+1]
}

// The agent example: forks continue from the parent's step with its memory, get RESEED
// with their own id, and from then on draw different tokens from each other and from
// the parent.
func TestAgentForksDivergeAfterReseed(t *testing.T) {
	rt := testutil.NewRuntime(t)
	c := createWithApp(t, rt, "agent", map[string]string{}, "python3", "-u", "/app/examples/agent.py")
	waitLog(t, c, "agent steps", regexp.MustCompile(`step=5 `))

	forks, _, err := fork.Fork(ctx, rt, c, fork.Options{RestoreOptions: fork.RestoreOptions{N: 3}})
	if err != nil {
		t.Fatalf("fork agent: %v", err)
	}
	if !strings.Contains(logOf(c), "quiesce step=") {
		t.Errorf("the parent never logged QUIESCE:\n%s", logOf(c))
	}
	seen := map[string]string{}
	var steps []string
	for _, f := range forks {
		fc, err := rt.Containers.Get(f.ID)
		if err != nil {
			t.Fatal(err)
		}
		step, toks := tokensAfterReseed(t, fc, 4)
		steps = append(steps, step)
		key := strings.Join(toks, ",")
		if other, dup := seen[key]; dup {
			t.Errorf("forks %s and %s drew the same tokens after RESEED: %s", other, f.ID, key)
		}
		seen[key] = f.ID
	}
	// Each fork continued from the parent's step at the snapshot: its log (the parent's,
	// copied at the dump) counts on from the quiesce line without a gap or a restart, and
	// RESEED found it at that step or later. (How many steps a fork took before its RESEED
	// depends on how fast restores run: under emulation, seconds apart.)
	q := regexp.MustCompile(`quiesce step=(\d+)`).FindAllStringSubmatch(logOf(c), -1)
	if len(q) == 0 {
		t.Fatalf("no quiesce line in the parent's log")
	}
	quiesced, _ := strconv.Atoi(q[len(q)-1][1])
	for i, f := range forks {
		fc, _ := rt.Containers.Get(f.ID)
		prev := 0
		for _, m := range tokenRe.FindAllStringSubmatch(logOf(fc), -1) {
			n, _ := strconv.Atoi(m[1])
			if prev != 0 && n != prev+1 {
				t.Errorf("fork %s counts %d after %d: it did not continue from the parent's step", f.ID, n, prev)
				break
			}
			prev = n
		}
		if n, _ := strconv.Atoi(steps[i]); n < quiesced || prev <= quiesced {
			t.Errorf("fork %s: reseed at step %s, last step %d, parent quiesced at %d", f.ID, steps[i], prev, quiesced)
		}
	}
	// Each fork's memory kept the parent's tokens: memory count == step at reseed.
	for _, f := range forks {
		fc, _ := rt.Containers.Get(f.ID)
		m := regexp.MustCompile(`reseed fork=\S+ step=(\d+) memory=(\d+)`).FindStringSubmatch(logOf(fc))
		if m == nil || m[1] != m[2] || m[1] == "0" {
			t.Errorf("fork %s: reseed line %v: memory should hold one token per step", f.ID, m)
		}
	}
}

// A runtime that does not answer QUIESCE: the fork fails with ErrNoAnswer and leaves
// nothing behind, unless the caller chose a forced snapshot.
func TestQuiesceNoAnswer(t *testing.T) {
	rt := testutil.NewRuntime(t)
	// Listens, never accepts: the connection sits in the backlog (a runtime that accepts
	// and then hangs is the easier case: its end is dumped as a closed socket).
	deaf := "import socket, time\ns = socket.socket(socket.AF_UNIX)\ns.bind('/run/agent.sock')\ns.listen(1)\nprint('listening', flush=True)\nwhile True: time.sleep(1)\n"
	c := createWithApp(t, rt, "deaf", map[string]string{"/app/deaf.py": deaf}, "python3", "/app/deaf.py")
	waitLog(t, c, "listening", regexp.MustCompile(`listening`))

	_, _, err := fork.Fork(ctx, rt, c, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1, Hook: hook.Options{Timeout: 300 * time.Millisecond}}})
	if !errors.Is(err, hook.ErrNoAnswer) {
		t.Fatalf("fork of a deaf runtime: got %v, want ErrNoAnswer", err)
	}
	t.Logf("error: %v", err)
	if all, _ := rt.Containers.List(); len(all) != 1 {
		t.Errorf("%d containers after a refused fork, want 1", len(all))
	}
	if snaps, _ := os.ReadDir(paths.Snapshots()); len(snaps) != 0 {
		t.Errorf("snapshots left: %v", snaps)
	}
	if st := rt.State(c); st != store.StateRunning {
		t.Errorf("source is %s after a refused fork", st)
	}

	// Forced: the snapshot is taken anyway and the fork runs.
	forks, _, err := fork.Fork(ctx, rt, c, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1, Hook: hook.Options{Timeout: 300 * time.Millisecond, Force: true}}})
	if err != nil {
		t.Fatalf("forced fork: %v", err)
	}
	fc, _ := rt.Containers.Get(forks[0].ID)
	if st := rt.State(fc); st != store.StateRunning {
		t.Errorf("forced fork is %s", st)
	}
}

// A runtime that answers ERR refuses the snapshot; Force does not override an answer.
func TestQuiesceRefused(t *testing.T) {
	rt := testutil.NewRuntime(t)
	app := "import sys, time\nsys.path.insert(0, '/app/python')\nfrom lazyfork.hook import Hook\n" +
		"def no():\n    raise RuntimeError('busy writing a checkpoint')\n" +
		"Hook(on_quiesce=no).start()\nprint('up', flush=True)\nwhile True: time.sleep(1)\n"
	c := createWithApp(t, rt, "refuser", map[string]string{"/app/refuser.py": app}, "python3", "/app/refuser.py")
	waitLog(t, c, "up", regexp.MustCompile(`up`))
	_, _, err := fork.Fork(ctx, rt, c, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1, Hook: hook.Options{Force: true}}})
	if !errors.Is(err, hook.ErrRefused) || !strings.Contains(err.Error(), "busy writing a checkpoint") {
		t.Fatalf("got %v, want ErrRefused with the runtime's reason", err)
	}
	if st := rt.State(c); st != store.StateRunning {
		t.Errorf("source is %s after a refused fork", st)
	}
}

// A symlink in the container must not lead the host to one of its own sockets.
func TestSymlinkStaysInContainer(t *testing.T) {
	rt := testutil.NewRuntime(t)
	hostSock := filepath.Join(t.TempDir(), "host.sock")
	l, err := net.Listen("unix", hostSock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan string, 1)
	go func() {
		if conn, err := l.Accept(); err == nil {
			got <- "host socket reached"
			conn.Close()
		}
	}()
	c, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Hook: "/run/agent.sock",
		Command: []string{"sh", "-c", fmt.Sprintf("ln -s %s /run/agent.sock; echo linked; sleep 1000", hostSock)}})
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, c, "linked", regexp.MustCompile(`linked`))
	err = hook.Send(ctx, c.RootFS, c.Hook, "QUIESCE", time.Second)
	if err == nil {
		t.Fatal("QUIESCE through a symlink succeeded")
	}
	select {
	case s := <-got:
		t.Fatal(s)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestValidatePath(t *testing.T) {
	for _, p := range []string{"/run/agent.sock", "/a"} {
		if err := hook.ValidatePath(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	for _, p := range []string{"run/agent.sock", "/run/../x", "/", "/run/", "/" + strings.Repeat("x", 101)} {
		if err := hook.ValidatePath(p); err == nil {
			t.Errorf("%s accepted", p)
		}
	}
}
