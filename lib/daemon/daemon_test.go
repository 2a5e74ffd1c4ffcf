package daemon_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/daemon"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

func TestMain(m *testing.M) {
	if sock := os.Getenv("LF_TEST_CONNECT"); sock != "" {
		// Child of TestBadInput, run as another user: can it connect?
		c, err := net.Dial("unix", sock)
		if errors.Is(err, syscall.EACCES) {
			os.Exit(13)
		}
		if err == nil {
			c.Close()
		}
		os.Exit(0)
	}
	if sock := os.Getenv("LF_TEST_HTTP"); sock != "" {
		// Child of the peer tests, run as another user: what does the daemon answer?
		os.Exit(probeHTTP(sock))
	}
	testutil.Setup()
	os.Exit(m.Run())
}

var bg = context.Background()

const image = testutil.DefaultImage

var counterCmd = []string{"python3", "-c", "import itertools, time\nfor i in itertools.count():\n    print(i, flush=True)\n    time.sleep(0.1)\n"}

// testDaemon is a real daemon (daemon.Run) on a temporary socket over a test runtime.
type testDaemon struct {
	t      *testing.T
	rt     *container.Runtime
	socket string
	cl     *client.Client
	stop   func()
}

// newDaemon gives a test its own state (testutil.NewRuntime) and a daemon serving it.
func newDaemon(t *testing.T) *testDaemon {
	t.Helper()
	rt := testutil.NewRuntime(t)
	dir, err := os.MkdirTemp("/tmp", "lfd-") // short: sun_path is 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := &testDaemon{t: t, rt: rt, socket: filepath.Join(dir, "run", "lazyfork.sock")}
	d.start()
	return d
}

func (d *testDaemon) start() {
	d.t.Helper()
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() { done <- daemon.Run(ctx, d.rt, daemon.Config{Socket: d.socket}) }()
	d.cl = client.New(d.socket)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := d.cl.Ping(bg); err == nil {
			break
		}
		select {
		case err := <-done:
			cancel()
			d.t.Fatalf("daemon exited at start: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cancel()
			d.t.Fatal("daemon did not answer")
		}
	}
	d.stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			d.t.Errorf("daemon: %v", err)
		}
	})
	d.t.Cleanup(d.stop)
}

func (d *testDaemon) create(name string, cmd ...string) *client.Info {
	d.t.Helper()
	in, err := d.cl.Create(bg, client.CreateRequest{Image: image, Name: name, Command: cmd})
	if err != nil {
		d.t.Fatalf("create %s: %v", name, err)
	}
	return in
}

// pair creates a cluster that talks over loopback: srv (testutil.LoopbackServer) and cl
// (testutil.LoopbackClient), which joins its network namespace.
func (d *testDaemon) pair() (srv, cl *client.Info) {
	d.t.Helper()
	srv = d.create("srv", "python3", "-c", testutil.LoopbackServer)
	cl, err := d.cl.Create(bg, client.CreateRequest{Image: image, Name: "cl", Join: "srv", Command: []string{"python3", "-c", testutil.LoopbackClient}})
	if err != nil {
		d.t.Fatalf("create cl: %v", err)
	}
	return srv, cl
}

func (d *testDaemon) exec(ref string, argv ...string) string {
	d.t.Helper()
	res, err := d.cl.Exec(bg, ref, client.ExecRequest{Argv: argv, Timeout: 30})
	if err != nil {
		d.t.Fatalf("exec %v in %s: %v", argv, ref, err)
	}
	if res.ExitCode != 0 {
		d.t.Fatalf("exec %v in %s: exit %d: %s", argv, ref, res.ExitCode, res.Stderr)
	}
	return strings.TrimSpace(res.Stdout)
}

// raw sends a request as bytes and returns the status and decoded error (if any).
func (d *testDaemon) raw(method, path string, body io.Reader) (int, *client.Error, []byte) {
	d.t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.socket)
	}}}
	req, _ := http.NewRequest(method, "http://lazyfork"+path, body)
	resp, err := hc.Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode < 300 {
		return resp.StatusCode, nil, b
	}
	var e client.Error
	if err := json.Unmarshal(b, &e); err != nil || e.Code == "" || e.Message == "" {
		d.t.Fatalf("%s %s: %d with a body that is not a JSON error: %q", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode, &e, b
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	var e *client.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("got %v, want error code %s", err, code)
	}
}

func snapshots(t *testing.T) []string {
	ents, _ := os.ReadDir(paths.Snapshots())
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// events collects the daemon's event stream in the background.
type events struct {
	mu  sync.Mutex
	got []client.Event
}

func (d *testDaemon) subscribe() *events {
	ev := &events{}
	ctx, cancel := context.WithCancel(bg)
	ready := make(chan struct{})
	go func() {
		close(ready)
		_ = d.cl.Events(ctx, func(e client.Event) error {
			ev.mu.Lock()
			ev.got = append(ev.got, e)
			ev.mu.Unlock()
			return nil
		})
	}()
	<-ready
	time.Sleep(100 * time.Millisecond) // the subscription is registered
	d.t.Cleanup(cancel)
	return ev
}

func (ev *events) types() []string {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var out []string
	for _, e := range ev.got {
		out = append(out, e.Type+":"+e.ID)
	}
	return out
}

// Every route, through the Go client, on real containers; the event stream sees each
// lifecycle change.
func TestRoutes(t *testing.T) {
	d := newDaemon(t)
	ev := d.subscribe()

	fi, err := os.Stat(d.socket)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %s: mode %v (%v), want a 0600 socket", d.socket, fi.Mode(), err)
	}
	if fi, _ := os.Stat(filepath.Dir(d.socket)); fi.Mode().Perm() != 0o700 {
		t.Errorf("socket directory mode %v, want 0700", fi.Mode().Perm())
	}

	web := d.create("web", counterCmd...)
	if web.State != store.StateRunning || web.Pid == 0 {
		t.Fatalf("created %+v", web)
	}
	if got := d.exec("web", "hostname"); got != web.ID {
		t.Errorf("hostname %q, want the id %s", got, web.ID)
	}
	res, err := d.cl.Exec(bg, web.ID[:6], client.ExecRequest{Argv: []string{"sh", "-c", "cat; echo $X; pwd; echo oops >&2; exit 3"},
		Stdin: "in\n", Env: []string{"X=ex"}, Cwd: "/tmp"})
	if err != nil || res.Stdout != "in\nex\n/tmp\n" || res.Stderr != "oops\n" || res.ExitCode != 3 {
		t.Errorf("exec by id prefix: %+v, %v", res, err)
	}
	bin := []byte{0, 1, 2, 'x'}
	res, err = d.cl.Exec(bg, "web", client.ExecRequest{Argv: []string{"od", "-An", "-tx1"}, StdinBase64: base64.StdEncoding.EncodeToString(bin)})
	if err != nil || strings.Join(strings.Fields(res.Stdout), "") != "00010278" {
		t.Errorf("binary stdin: %+v, %v", res, err)
	}
	_, err = d.cl.Exec(bg, "web", client.ExecRequest{Argv: []string{"sleep", "10"}, Timeout: 0.3})
	wantCode(t, err, client.CodeExecTimeout)

	// Streamed exec: stdin in, stdout and stderr out, exit code.
	var out, errb bytes.Buffer
	code, err := d.cl.ExecStream(bg, "web", client.ExecRequest{Argv: []string{"sh", "-c", "tr a-z A-Z; echo e >&2; exit 5"}},
		client.Stdio{Stdin: strings.NewReader("stream me\n"), Stdout: &out, Stderr: &errb})
	if err != nil || code != 5 || out.String() != "STREAM ME\n" || errb.String() != "e\n" {
		t.Errorf("stream exec: code %d, %v, stdout %q, stderr %q", code, err, out.String(), errb.String())
	}
	// On a terminal.
	out.Reset()
	code, err = d.cl.ExecStream(bg, "web", client.ExecRequest{Argv: []string{"sh", "-c", "test -t 0 && stty size"}, TTY: true, Rows: 33, Cols: 101},
		client.Stdio{Stdout: &out})
	if err != nil || code != 0 || strings.TrimSpace(out.String()) != "33 101" {
		t.Errorf("tty exec: code %d, %v, output %q", code, err, out.String())
	}

	if err := d.cl.Freeze(bg, "web"); err != nil {
		t.Fatal(err)
	}
	if in, _ := d.cl.Get(bg, "web"); in.State != store.StateFrozen {
		t.Errorf("after freeze: %s", in.State)
	}
	_, err = d.cl.Exec(bg, "web", client.ExecRequest{Argv: []string{"true"}})
	wantCode(t, err, client.CodeInvalidState)
	wantCode(t, d.cl.Freeze(bg, "web"), client.CodeInvalidState)
	if err := d.cl.Thaw(bg, "web"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, d.cl.Thaw(bg, "web"), client.CodeInvalidState)

	// Fork, streamed, with names.
	var seen []string
	fr, err := d.cl.Fork(bg, "web", client.ForkRequest{N: 2, Names: []string{"web-a"}}, func(f client.Fork) { seen = append(seen, f.ID) })
	if err != nil {
		t.Fatal(err)
	}
	if len(fr.Forks) != 2 || len(seen) != 2 || fr.Snapshot == "" {
		t.Fatalf("fork: %+v, progress %v", fr, seen)
	}
	named := slices.IndexFunc(fr.Forks, func(f client.Fork) bool { return f.Name == "web-a" })
	if named < 0 || fr.Forks[0].Parent != web.ID || fr.Forks[0].Depth != 1 {
		t.Errorf("forks %+v", fr.Forks)
	}
	if got := d.exec("web-a", "hostname"); got != fr.Forks[named].ID {
		t.Errorf("fork hostname %q", got)
	}
	// A fork of a fork, not streamed.
	gr, err := d.cl.Fork(bg, "web-a", client.ForkRequest{}, nil)
	if err != nil || len(gr.Forks) != 1 || gr.Forks[0].Depth != 2 {
		t.Fatalf("fork of a fork: %+v, %v", gr, err)
	}

	rows, err := d.cl.List(bg)
	if err != nil || len(rows) != 4 {
		t.Fatalf("list: %d rows, %v", len(rows), err)
	}
	forest, err := d.cl.Tree(bg)
	if err != nil || len(forest) != 1 || len(forest[0].Children) != 2 {
		t.Fatalf("tree: %+v, %v", forest, err)
	}
	st, err := d.cl.Stats(bg, "web-a")
	if err != nil || st.Family == "" || st.FamilyBytes == 0 || st.Timings["restore_ms"] == 0 || st.MemoryBytes == 0 {
		t.Errorf("stats: %+v, %v", st, err)
	}
	status, err := d.cl.Status(bg)
	if err != nil || status.Containers != 4 || status.Running != 4 || status.Daemon == nil || status.Daemon.Pid != os.Getpid() || len(status.Host) == 0 {
		t.Errorf("status: %+v, %v", status, err)
	}
	var logs bytes.Buffer
	if err := d.cl.Logs(bg, "web", false, &logs); err != nil || !strings.HasPrefix(logs.String(), "0\n1\n") {
		t.Errorf("logs: %v, %q", err, logs.String())
	}
	// A followed log ends when the client goes.
	lctx, lcancel := context.WithTimeout(bg, 500*time.Millisecond)
	logs.Reset()
	if err := d.cl.Logs(lctx, "web", true, &logs); err != nil || logs.Len() == 0 {
		t.Errorf("followed logs: %v, %d bytes", err, logs.Len())
	}
	lcancel()

	// Stop, fork the stopped container, start it again.
	in, err := d.cl.Stop(bg, "web", client.StopRequest{})
	if err != nil || in.State != store.StateStopped {
		t.Fatalf("stop: %+v, %v", in, err)
	}
	_, err = d.cl.Exec(bg, "web", client.ExecRequest{Argv: []string{"true"}})
	wantCode(t, err, client.CodeInvalidState)
	_, err = d.cl.Stop(bg, "web", client.StopRequest{})
	wantCode(t, err, client.CodeInvalidState)
	fs, err := d.cl.Fork(bg, "web", client.ForkRequest{N: 1}, nil)
	if err != nil {
		t.Fatalf("fork of a stopped container: %v", err)
	}
	if in, err = d.cl.Start(bg, "web"); err != nil || in.State != store.StateRunning {
		t.Fatalf("start: %+v, %v", in, err)
	}
	_, err = d.cl.Start(bg, "web")
	wantCode(t, err, client.CodeInvalidState)

	// Delete a parent: its children keep running. Clean removes stopped ones.
	if err := d.cl.Delete(bg, "web-a"); err != nil {
		t.Fatal(err)
	}
	if in, err := d.cl.Get(bg, gr.Forks[0].ID); err != nil || in.State != store.StateRunning {
		t.Errorf("grandchild after its parent's deletion: %+v, %v", in, err)
	}
	wantCode(t, d.cl.Delete(bg, "web-a"), client.CodeNotFound)
	if _, err := d.cl.Stop(bg, fs.Forks[0].ID, client.StopRequest{}); err != nil {
		t.Fatal(err)
	}
	deleted, err := d.cl.Clean(bg)
	if err != nil || len(deleted) != 1 || deleted[0] != fs.Forks[0].ID {
		t.Errorf("clean: %v, %v", deleted, err)
	}
	if err := d.cl.GC(bg); err != nil {
		t.Errorf("gc: %v", err)
	}

	want := []string{"create:" + web.ID, "freeze:" + web.ID, "thaw:" + web.ID,
		"fork:" + fr.Forks[0].ID, "fork:" + fr.Forks[1].ID, "fork:" + gr.Forks[0].ID,
		"stop:" + web.ID, "fork:" + fs.Forks[0].ID, "start:" + web.ID,
		"delete:" + fr.Forks[named].ID, "stop:" + fs.Forks[0].ID, "delete:" + fs.Forks[0].ID}
	testutil.Eventually(t, 5*time.Second, "events", func() bool { return len(ev.types()) >= len(want) })
	got := ev.types()
	// The two forks of one batch may come in either order.
	if !slices.Equal(got[:3], want[:3]) || !slices.Equal(got[5:], want[5:]) ||
		!slices.Equal(sorted(got[3:5]), sorted(want[3:5])) {
		t.Errorf("events:\n got %v\nwant %v", got, want)
	}
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// Bad input gets a JSON error with a stable code, and changes nothing.
func TestBadInput(t *testing.T) {
	d := newDaemon(t)
	c := d.create("victim", "sleep", "1000")
	cases := []struct {
		method, path, body string
		status             int
		code               string
		msg                string // a fragment of the message
	}{
		{"POST", "/v1/containers", `{"image": `, 400, client.CodeBadJSON, "not valid JSON"},
		{"POST", "/v1/containers", `not json`, 400, client.CodeBadJSON, "not valid JSON"},
		{"POST", "/v1/containers", ``, 400, client.CodeBadJSON, "empty"},
		{"POST", "/v1/containers", `{"image": "x"} {"image": "y"}`, 400, client.CodeBadJSON, "after the JSON object"},
		{"POST", "/v1/containers", `{"image": 42}`, 400, client.CodeBadRequest, `"image" must be a string`},
		{"POST", "/v1/containers", `["image"]`, 400, client.CodeBadRequest, "must be a JSON object"},
		{"POST", "/v1/containers", `{"image": "` + image + `", "colour": "red"}`, 400, client.CodeBadRequest, `unknown field "colour"`},
		{"POST", "/v1/containers", `{}`, 400, client.CodeBadRequest, "image is required"},
		{"POST", "/v1/containers", `{"image": "` + image + `", "name": "no/slash"}`, 400, client.CodeInvalidName, "invalid name"},
		{"POST", "/v1/containers", `{"image": "` + image + `", "name": "victim", "command": ["true"]}`, 409, client.CodeNameInUse, "already in use"},
		{"POST", "/v1/containers", `{"image": "` + image + `", "hook": "relative.sock", "command": ["true"]}`, 400, client.CodeBadRequest, "hook path"},
		{"POST", "/v1/containers", `{"image": "` + image + `", "env": ["NOEQUALS"], "command": ["true"]}`, 400, client.CodeBadRequest, "KEY=VALUE"},
		// lib/image does not wrap os.ErrNotExist here yet: any JSON error naming it.
		{"POST", "/v1/containers", `{"image": "/no/such/layout", "command": ["true"]}`, 0, "", ""},
		{"GET", "/v1/containers/nosuch", ``, 404, client.CodeNotFound, "no such container"},
		{"POST", "/v1/containers/nosuch/fork", `{}`, 404, client.CodeNotFound, "no such container"},
		{"POST", "/v1/containers/victim/fork", `{"n": "ten"}`, 400, client.CodeBadRequest, `"n" must be an integer`},
		{"POST", "/v1/containers/victim/fork", `{"n": 1.5}`, 400, client.CodeBadRequest, `"n" must be an integer`},
		{"POST", "/v1/containers/victim/fork", `{"n": -1}`, 400, client.CodeBadRequest, "at least 1"},
		{"POST", "/v1/containers/victim/fork", `{"n": 100000}`, 400, client.CodeBadRequest, "at most"},
		{"POST", "/v1/containers/victim/fork", `{"names": ["ok", "bad name"]}`, 400, client.CodeInvalidName, "invalid name"},
		{"POST", "/v1/containers/victim/fork", `{"names": ["victim"]}`, 409, client.CodeNameInUse, "already in use"},
		{"POST", "/v1/containers/victim/exec", `{"argv": []}`, 400, client.CodeBadRequest, "argv is required"},
		{"POST", "/v1/containers/victim/exec", `{"argv": "hostname"}`, 400, client.CodeBadRequest, `"argv" must be an array`},
		{"POST", "/v1/containers/victim/exec", `{"argv": ["cat"], "stdin_base64": "%%%"}`, 400, client.CodeBadRequest, "stdin_base64"},
		{"POST", "/v1/containers/victim/exec", `{"argv": ["true"], "timeout": "soon"}`, 400, client.CodeBadRequest, `"timeout" must be a number`},
		{"POST", "/v1/containers/victim/exec", `{"argv": ["true"], "tty": true}`, 400, client.CodeBadRequest, "streamed exec"},
		{"POST", "/v1/containers/victim/freeze", `{"now": true}`, 400, client.CodeBadRequest, "unknown field"},
		{"POST", "/v1/containers/victim/stop", `{"hook_timeout": -1}`, 400, client.CodeBadRequest, "negative"},
		{"GET", "/v1/nothing/here", ``, 404, client.CodeUnknownRoute, "no route"},
		{"GET", "/", ``, 404, client.CodeUnknownRoute, "no route"},
		{"PUT", "/v1/containers", `{}`, 405, client.CodeMethod, "not allowed"},
		{"GET", "/v1/containers/victim/fork", ``, 405, client.CodeMethod, "use POST"},
		{"DELETE", "/v1/ping", ``, 405, client.CodeMethod, "use GET"},
	}
	for _, tc := range cases {
		status, e, body := d.raw(tc.method, tc.path, strings.NewReader(tc.body))
		if tc.status == 0 { // any JSON error will do
			if e == nil {
				t.Errorf("%s %s %s: status %d, want an error (%s)", tc.method, tc.path, tc.body, status, body)
			} else {
				t.Logf("%s %s %s: %d %s: %s", tc.method, tc.path, tc.body, status, e.Code, e.Message)
			}
			continue
		}
		if e == nil || status != tc.status || e.Code != tc.code || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("%s %s %s: got %d %+v, want %d %s containing %q", tc.method, tc.path, tc.body, status, e, tc.status, tc.code, tc.msg)
		}
	}

	// Oversized body.
	big := `{"argv": ["cat"], "stdin": "` + strings.Repeat("x", daemon.DefaultMaxBody) + `"}`
	if status, e, _ := d.raw("POST", "/v1/containers/victim/exec", strings.NewReader(big)); status != 413 || e.Code != client.CodeTooLarge {
		t.Errorf("oversized body: %d %+v", status, e)
	}

	// Nothing changed: still exactly the one container, running, no snapshots.
	rows, _ := d.cl.List(bg)
	if len(rows) != 1 || rows[0].ID != c.ID || rows[0].State != store.StateRunning {
		t.Errorf("containers after bad input: %+v", rows)
	}
	if s := snapshots(t); len(s) != 0 {
		t.Errorf("snapshots left: %v", s)
	}

	// Only root may use the socket: its mode refuses anyone else.
	if err := os.Chmod(filepath.Dir(d.socket), 0o755); err != nil {
		t.Fatal(err)
	}
	probe := probeCmd(t, "LF_TEST_CONNECT="+d.socket, &syscall.Credential{Uid: 65534, Gid: 65534})
	if out, err := probe.CombinedOutput(); probe.ProcessState == nil || probe.ProcessState.ExitCode() != 13 {
		t.Errorf("user nobody connecting to the socket: %v %s (want permission denied)", err, out)
	}
}

// Several clients fork one container at once: the forks are serialized, each succeeds,
// and the family is consistent.
func TestConcurrentForks(t *testing.T) {
	d := newDaemon(t)
	src := d.create("src", counterCmd...)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	results := make([]*client.ForkResult, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = client.New(d.socket).Fork(bg, "src", client.ForkRequest{N: 2}, nil)
		}()
	}
	wg.Wait()
	ids := map[string]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		if results[i].Snapshot == "" {
			t.Errorf("client %d: no snapshot", i)
		}
		for _, f := range results[i].Forks {
			ids[f.ID] = true
			if got := d.exec(f.ID, "hostname"); got != f.ID {
				t.Errorf("fork %s: hostname %q", f.ID, got)
			}
		}
	}
	if len(ids) != 6 {
		t.Errorf("%d distinct forks, want 6", len(ids))
	}
	// The first fork moved the source onto its snapshot (new host pid, same container).
	if in, _ := d.cl.Get(bg, src.ID); in.State != store.StateRunning || in.ID != src.ID {
		t.Errorf("source after concurrent forks: %+v", in)
	}
	if s := snapshots(t); len(s) != 0 {
		t.Errorf("snapshots left: %v", s)
	}
}

// A client that goes away in the middle of a fork: the fork is undone as a whole.
func TestClientDisconnectMidFork(t *testing.T) {
	d := newDaemon(t)
	ev := d.subscribe()
	src := d.create("src", counterCmd...)
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() {
		_, err := client.New(d.socket).Fork(ctx, "src", client.ForkRequest{N: 3}, nil)
		done <- err
	}()
	// Hang up once the dump has begun.
	testutil.Eventually(t, 20*time.Second, "the snapshot to start", func() bool { return len(snapshots(t)) > 0 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v", err)
	}
	// The daemon finishes the fork, sees the client gone, and deletes what it made.
	testutil.Eventually(t, 60*time.Second, "the fork to be undone", func() bool {
		all, _ := d.rt.Containers.List()
		return len(all) == 1 && len(snapshots(t)) == 0
	})
	// Running, under its id: on its old processes or, if the swap had finished before the
	// hang-up, on the new ones.
	in, err := d.cl.Get(bg, "src")
	if err != nil || in.State != store.StateRunning || in.ID != src.ID {
		t.Fatalf("source after an abandoned fork: %+v, %v", in, err)
	}
	d.exec("src", "true")
	for _, e := range ev.types() {
		if strings.HasPrefix(e, "fork:") {
			t.Errorf("event %s for an abandoned fork", e)
		}
	}
	// It still forks.
	if _, err := d.cl.Fork(bg, "src", client.ForkRequest{}, nil); err != nil {
		t.Fatal(err)
	}
}

// A daemon restart leaves containers running; the new daemon sees them all from the
// tree, and a second daemon on the same socket is refused.
func TestDaemonRestart(t *testing.T) {
	d := newDaemon(t)
	src := d.create("src", counterCmd...)
	fr, err := d.cl.Fork(bg, "src", client.ForkRequest{N: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := daemon.Run(bg, d.rt, daemon.Config{Socket: d.socket}); err == nil || !strings.Contains(err.Error(), "already runs") {
		t.Errorf("second daemon on one socket: %v", err)
	}
	before, _ := d.cl.List(bg)

	d.stop()
	if _, err := os.Stat(d.socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after stop: %v", err)
	}
	_, err = d.cl.Ping(bg)
	wantCode(t, err, client.CodeDaemonUnreached)
	for _, in := range before {
		c, err := d.rt.Containers.Get(in.ID)
		if err != nil || !container.Alive(c) {
			t.Errorf("%s not alive while no daemon runs: %v", in.ID, err)
		}
	}
	time.Sleep(300 * time.Millisecond)

	d.start()
	after, err := d.cl.List(bg)
	if err != nil || len(after) != len(before) {
		t.Fatalf("after restart: %d containers (%v), want %d", len(after), err, len(before))
	}
	for i := range after {
		if after[i].ID != before[i].ID || after[i].Pid != before[i].Pid || after[i].State != store.StateRunning {
			t.Errorf("after restart %+v, before %+v", after[i], before[i])
		}
	}
	// The count went on meanwhile, in the source and in the forks.
	for _, id := range []string{src.ID, fr.Forks[0].ID} {
		var l bytes.Buffer
		_ = d.cl.Logs(bg, id, false, &l)
		if n := len(strings.Fields(l.String())); n < 5 {
			t.Errorf("%s logged only %d lines", id, n)
		}
	}
	if got := d.exec(fr.Forks[1].ID, "hostname"); got != fr.Forks[1].ID {
		t.Errorf("hostname %q", got)
	}
	if _, err := d.cl.Fork(bg, fr.Forks[0].ID, client.ForkRequest{}, nil); err != nil {
		t.Errorf("fork after restart: %v", err)
	}
	if err := d.cl.Delete(bg, "src"); err != nil {
		t.Errorf("delete after restart: %v", err)
	}
}

func repoDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// The spec's Python example, run with python3 against the daemon: fork 10, exec hostname
// in each, fork a fork; plus the rest of the SDK.
func TestPythonSDK(t *testing.T) {
	d := newDaemon(t)
	d.create("agent", counterCmd...)
	// The package as pip installs it (offline: its build backend is in the repository).
	site := t.TempDir()
	pip := exec.Command("python3", "-m", "pip", "install", "--quiet", "--no-index", "--target", site, filepath.Join(repoDir(), "python"))
	if out, err := pip.CombinedOutput(); err != nil {
		t.Fatalf("pip install ./python: %v\n%s", err, out)
	}
	py := exec.Command("python3", filepath.Join(repoDir(), "lib", "daemon", "testdata", "sdk_example.py"))
	py.Dir = t.TempDir() // not the repository: the installed package must be the one used
	py.Env = append(os.Environ(), "LAZYFORK_SOCKET="+d.socket, "PYTHONPATH="+site)
	var stderr bytes.Buffer
	py.Stderr = &stderr
	out, err := py.Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, stderr.String())
	}
	var r struct {
		ForkIDs             []string      `json:"fork_ids"`
		Outputs             []string      `json:"outputs"`
		Grandchildren       []client.Info `json:"grandchildren"`
		GrandchildHostnames []string      `json:"grandchild_hostnames"`
		AfterWith           []client.Info `json:"after_with"`
		NotFound            []any         `json:"not_found"`
		ArgvStr             string        `json:"argv_str"`
		Stdin               string        `json:"stdin"`
		ExitCode            int           `json:"exit_code"`
		Env                 string        `json:"env"`
		StatsState          string        `json:"stats_state"`
		Stopped, Started    string
		NamesAfterDelete    []string `json:"names_after_delete"`
		Events              []string `json:"events"`
		FinalCount          int      `json:"final_count"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("report %q: %v", out, err)
	}
	if len(r.Outputs) != 10 || len(r.ForkIDs) != 10 {
		t.Fatalf("%d outputs from %d forks, want 10", len(r.Outputs), len(r.ForkIDs))
	}
	for i, o := range r.Outputs {
		if strings.TrimSpace(o) != r.ForkIDs[i] {
			t.Errorf("fork %d: hostname %q, want its id %s", i, o, r.ForkIDs[i])
		}
	}
	if len(r.Grandchildren) != 3 {
		t.Fatalf("%d grandchildren", len(r.Grandchildren))
	}
	for i, g := range r.Grandchildren {
		if g.Depth != 2 || g.Parent != r.ForkIDs[0] || g.State != store.StateRunning || strings.TrimSpace(r.GrandchildHostnames[i]) != g.ID {
			t.Errorf("grandchild %+v, hostname %q", g, r.GrandchildHostnames[i])
		}
	}
	// Leaving the with block deleted the ten forks; the grandchildren kept running.
	if len(r.AfterWith) != 4 {
		t.Errorf("after the with block: %d containers, want agent + 3 grandchildren", len(r.AfterWith))
	}
	for _, in := range r.AfterWith {
		if in.Name != "agent" && (in.Depth != 2 || in.State != store.StateRunning) {
			t.Errorf("after the with block: %+v", in)
		}
	}
	if len(r.NotFound) != 2 || r.NotFound[0] != client.CodeNotFound || r.NotFound[1] != float64(404) {
		t.Errorf("not found: %v", r.NotFound)
	}
	if r.ArgvStr == "" || r.Stdin != "bin\x01ary" || r.ExitCode != 7 || strings.TrimSpace(r.Env) != "from-sdk" {
		t.Errorf("sdk: %+v", r)
	}
	if r.StatsState != "running" || r.Stopped != "stopped" || r.Started != "running" {
		t.Errorf("lifecycle: stats %s, stop %s, start %s", r.StatsState, r.Stopped, r.Started)
	}
	if !slices.Equal(r.Events, []string{"create", "stop", "start", "delete"}) {
		t.Errorf("events seen by the SDK: %v", r.Events)
	}
	if slices.Contains(r.NamesAfterDelete, "sdk-made") || r.FinalCount != 1 {
		t.Errorf("after deletes: %v, %d left", r.NamesAfterDelete, r.FinalCount)
	}
}

// tarOf packs files (container path → host file) for an exec of `tar -x`.
func tarOf(t *testing.T, files map[string]string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write(b)
	}
	tw.Close()
	return buf.Bytes()
}

// The hook through the API: examples/agent.py installed with an exec, forked; forks
// diverge after RESEED. A runtime that never answers gives hook_no_answer, or a forced
// snapshot on request.
func TestHookThroughDaemon(t *testing.T) {
	d := newDaemon(t)
	wait := `until [ -e /app/examples/agent.py ]; do sleep 0.05; done; exec python3 -u /app/examples/agent.py`
	agent, err := d.cl.Create(bg, client.CreateRequest{Image: image, Name: "agent", Hook: "/run/agent.sock",
		Env: []string{"AGENT_INTERVAL=0.05"}, Command: []string{"sh", "-c", wait}})
	if err != nil {
		t.Fatal(err)
	}
	if agent.Hook != "/run/agent.sock" {
		t.Errorf("info.hook = %q", agent.Hook)
	}
	archive := tarOf(t, map[string]string{
		"examples/agent.py":       filepath.Join(repoDir(), "examples", "agent.py"),
		"python/lazyfork/hook.py": filepath.Join(repoDir(), "python", "lazyfork", "hook.py"),
	})
	res, err := d.cl.Exec(bg, "agent", client.ExecRequest{Argv: []string{"sh", "-c", "mkdir -p /app && tar -x -C /app"},
		StdinBase64: base64.StdEncoding.EncodeToString(archive)})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("install agent: %+v, %v", res, err)
	}
	logOf := func(ref string) string {
		var b bytes.Buffer
		_ = d.cl.Logs(bg, ref, false, &b)
		return b.String()
	}
	testutil.Eventually(t, 20*time.Second, "agent steps", func() bool { return strings.Contains(logOf("agent"), "step=3 ") })

	fr, err := d.cl.Fork(bg, "agent", client.ForkRequest{N: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logOf("agent"), "quiesce step=") {
		t.Error("no QUIESCE in the parent's log")
	}
	tokens := map[string]string{}
	for _, f := range fr.Forks {
		re := regexp.MustCompile(`(?s)reseed fork=` + f.ID + ` step=\d+ memory=\d+\n(.*)`)
		var after []string
		testutil.Eventually(t, 20*time.Second, "tokens after reseed", func() bool {
			m := re.FindStringSubmatch(logOf(f.ID))
			if m == nil {
				return false
			}
			after = regexp.MustCompile(`token=([0-9a-f]+) memory=\d+ fork=`+f.ID).FindAllString(m[1], -1)
			return len(after) >= 4
		})
		key := strings.Join(after[1:4], ",")
		if other, dup := tokens[key]; dup {
			t.Errorf("forks %s and %s drew the same tokens after RESEED", other, f.ID)
		}
		tokens[key] = f.ID
	}

	// Nothing listens: an error naming the hook, or a forced snapshot.
	d.create("deaf", "sleep", "1000")
	deaf, _ := d.rt.Containers.Resolve("deaf")
	deaf.Hook = "/run/none.sock" // as if created with --hook by a runtime that never listened
	if err := d.rt.Containers.Put(deaf); err != nil {
		t.Fatal(err)
	}
	_, err = d.cl.Fork(bg, "deaf", client.ForkRequest{HookOptions: client.HookOptions{HookTimeout: 0.2}}, nil)
	wantCode(t, err, client.CodeHookNoAnswer)
	if !strings.Contains(err.Error(), "/run/none.sock") {
		t.Errorf("error does not name the hook: %v", err)
	}
	if _, err := d.cl.Fork(bg, "deaf", client.ForkRequest{HookOptions: client.HookOptions{HookTimeout: 0.2, HookForce: true}}, nil); err != nil {
		t.Errorf("forced fork: %v", err)
	}
	_, err = d.cl.Stop(bg, "deaf", client.StopRequest{HookOptions: client.HookOptions{HookTimeout: 0.2}})
	wantCode(t, err, client.CodeHookNoAnswer)
	if in, _ := d.cl.Get(bg, "deaf"); in.State != store.StateRunning {
		t.Errorf("deaf after a refused stop: %s", in.State)
	}
}
