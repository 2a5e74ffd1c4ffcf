package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/snaptree"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

func ptr[T any](v T) *T { return &v }

// createTree makes a tree through the daemon and prunes it when the test ends (through
// lib/snaptree, so that it goes even if the daemon was stopped).
func (d *testDaemon) createTree(req client.TreeCreateRequest) *client.SnapshotTree {
	d.t.Helper()
	t, err := d.cl.CreateTree(bg, req)
	if err != nil {
		d.t.Fatalf("create tree: %v", err)
	}
	d.pruneAtEnd(t)
	return t
}

func (d *testDaemon) pruneAtEnd(t *client.SnapshotTree) {
	d.t.Cleanup(func() {
		if _, err := os.Stat(snaptree.TreeDir(t.ID)); err != nil {
			return
		}
		m := &snaptree.Manager{RT: d.rt}
		if _, _, err := m.Prune(bg, t.ID, t.Root); err != nil && !errors.Is(err, snaptree.ErrDropped) {
			d.t.Errorf("cleanup: prune tree %s: %v", t.ID, err)
		}
	})
}

// watcher collects one tree's watch stream (another client than the test's).
type watcher struct {
	mu   sync.Mutex
	msgs []client.TreeWatchMessage
	done chan error
}

func (d *testDaemon) watch(ref string) *watcher {
	w := &watcher{done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(bg)
	d.t.Cleanup(cancel)
	go func() {
		w.done <- client.New(d.socket).WatchTree(ctx, ref, func(m client.TreeWatchMessage) error {
			w.mu.Lock()
			w.msgs = append(w.msgs, m)
			w.mu.Unlock()
			return nil
		})
	}()
	testutil.Eventually(d.t, 20*time.Second, "the watch's first message", func() bool { return w.len() > 0 })
	return w
}

func (w *watcher) len() int { w.mu.Lock(); defer w.mu.Unlock(); return len(w.msgs) }

func (w *watcher) events() []client.TreeEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []client.TreeEvent
	for _, m := range w.msgs {
		if m.Event != nil {
			out = append(out, *m.Event)
		}
	}
	return out
}

func nodeIDs(ns []*client.TreeNodeInfo) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.ID)
	}
	return out
}

// Every tree route through the Go client, on real containers, while another client
// watches: the watch gets the tree, then each mutation in order with its latency.
func TestTreeRoutes(t *testing.T) {
	d := newDaemon(t)
	tr := d.createTree(client.TreeCreateRequest{Name: "search", Label: "root",
		Root:   &client.CreateRequest{Image: image, Name: "troot", Command: counterCmd},
		Budget: &client.TreeBudgetRequest{MaxLive: ptr(8)}})
	root := tr.Root
	if n := tr.Nodes[root]; n == nil || !n.HasKeyframe || n.Label != "root" || n.State != client.NodeLive || n.Name != "troot" {
		t.Fatalf("created tree: root %+v", tr.Nodes[root])
	}
	def := snaptree.DefaultBudget()
	if tr.Budget.MaxLive != 8 || tr.Budget.MaxRAMBytes != def.MaxRAMBytes || tr.Budget.MaxChainDepth != def.MaxChainDepth {
		t.Errorf("budget %+v: want max_live 8 and the rest default (%+v)", tr.Budget, def)
	}
	if st, err := d.cl.GetTree(bg, tr.ID); err != nil || st.Kind != snaptree.Kind || len(st.Nodes) != 1 {
		t.Fatalf("GET tree: %+v, %v", st, err)
	}
	for _, ref := range []string{tr.ID, tr.ID[:5], "search"} {
		if got, err := d.cl.GetTree(bg, ref); err != nil || got.ID != tr.ID {
			t.Errorf("get tree %q: %v", ref, err)
		}
	}

	w := d.watch("search")
	w.mu.Lock()
	first := w.msgs[0]
	w.mu.Unlock()
	if first.Tree == nil || first.Tree.ID != tr.ID || first.Tree.Nodes[root] == nil {
		t.Fatalf("watch: first message %+v, want the tree", first)
	}
	cl := client.New(d.socket) // the operations come from another client than the watch

	res, err := cl.ForkNode(bg, tr.ID, root, client.TreeForkRequest{N: 2, Labels: []string{"a", "b"}, Names: []string{"ta"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Nodes) != 2 || res.Tree == nil || len(res.Tree.Nodes) != 3 {
		t.Fatalf("fork: %+v", res)
	}
	a, b := res.Nodes[0].ID, res.Nodes[1].ID
	if len(res.Events) != 1 || res.Events[0].Kind != "fork" || !slices.Equal(res.Events[0].Nodes, []string{a, b}) {
		t.Errorf("fork's events: %+v", res.Events)
	}
	if res.Nodes[0].Parent != root || res.Nodes[0].Label != "a" || res.Nodes[0].Name != "ta" || res.Nodes[1].Label != "b" {
		t.Errorf("fork nodes %+v", res.Nodes)
	}
	if got := d.exec("ta", "hostname"); got != a {
		t.Errorf("hostname of fork a: %q, want %s", got, a)
	}
	// A fork of a fork (by the container's name): the node gets a keyframe first.
	res, err = cl.ForkNode(bg, "search", "ta", client.TreeForkRequest{})
	if err != nil || len(res.Nodes) != 1 || res.Nodes[0].Parent != a || !res.Tree.Nodes[a].HasKeyframe {
		t.Fatalf("fork of a fork: %+v, %v", res, err)
	}
	a1 := res.Nodes[0].ID
	// Refresh the root's keyframe: a new generation.
	gen := res.Tree.Nodes[root].Generation
	res, err = cl.PrepareNode(bg, tr.ID, root, true)
	if err != nil || res.Node.Generation != gen+1 {
		t.Fatalf("prepare refresh: %+v, %v", res, err)
	}
	// Suspend and resume b.
	res, err = cl.SuspendNode(bg, tr.ID, b)
	if err != nil || res.Node.State != client.NodeSuspended || res.Node.DeltaBytes == 0 {
		t.Fatalf("suspend: %+v, %v", res.Node, err)
	}
	res, err = cl.ResumeNode(bg, tr.ID, b)
	if err != nil || res.Node.State != client.NodeLive {
		t.Fatalf("resume: %+v, %v", res.Node, err)
	}
	if got := d.exec(b, "hostname"); got != b {
		t.Errorf("hostname of resumed b: %q", got)
	}
	for _, on := range []bool{true, false, true} {
		op := cl.ProtectNode
		if !on {
			op = cl.UnprotectNode
		}
		if res, err = op(bg, tr.ID, a); err != nil || res.Node.Protected != on {
			t.Fatalf("protect %v: %+v, %v", on, res.Node, err)
		}
	}
	res, err = cl.RollbackNode(bg, tr.ID, root, client.TreeRollbackRequest{Name: "rb", Label: "again"})
	if err != nil || res.Node.Parent != root || res.Node.From == "" || res.Node.Name != "rb" {
		t.Fatalf("rollback: %+v, %v", res.Node, err)
	}
	rb := res.Node.ID
	// A RAM budget only the protected a and the memory files (which eviction does not
	// free) fit: eviction suspends every unprotected live node, never a.
	cur, err := cl.GetTree(bg, tr.ID)
	if err != nil {
		t.Fatal(err)
	}
	small := cur.Nodes[a].RAMBytes + 64<<10
	for _, n := range cur.Nodes {
		small += n.SharedRAMBytes
	}
	res, err = cl.SetTreeBudget(bg, tr.ID, client.TreeBudgetRequest{MaxRAMBytes: &small})
	if err != nil {
		t.Fatal(err)
	}
	nt := res.Tree
	if nt.Budget.MaxRAMBytes != small || nt.Budget.MaxLive != 8 {
		t.Errorf("budget after change: %+v", nt.Budget)
	}
	// The answer lists the operation's events: the change, then what it evicted.
	if len(res.Events) != 2 || res.Events[0].Kind != "budget" || res.Events[1].Kind != "evict" || len(res.Events[1].Nodes) != 4 || res.Events[1].LatencyNs <= 0 {
		t.Errorf("budget change's events: %+v", res.Events)
	}
	for id, n := range nt.Nodes {
		want := client.NodeSuspended
		if id == a {
			want = client.NodeLive
		}
		if n.State != want {
			t.Errorf("after eviction %s (%s) is %s, want %s", id, n.Label, n.State, want)
		}
	}
	// One live node at most: a resume cannot fit (a is protected), fails naming the
	// budget, and changes nothing.
	if _, err := cl.SetTreeBudget(bg, tr.ID, client.TreeBudgetRequest{MaxLive: ptr(1)}); err != nil {
		t.Fatal(err)
	}
	_, err = cl.ResumeNode(bg, tr.ID, b)
	wantCode(t, err, client.CodeOverBudget)
	if !strings.Contains(err.Error(), "max_live") {
		t.Errorf("over budget error does not name the budget: %v", err)
	}
	if nt, _ := cl.GetTree(bg, tr.ID); nt.Nodes[b].State != client.NodeSuspended {
		t.Errorf("b after a refused resume: %s", nt.Nodes[b].State)
	}
	big := int64(4 << 30)
	if _, err := cl.SetTreeBudget(bg, tr.ID, client.TreeBudgetRequest{MaxRAMBytes: &big, MaxLive: ptr(8)}); err != nil {
		t.Fatal(err)
	}
	if res, err = cl.EvictTree(bg, tr.ID); err != nil || len(res.Suspended) != 0 {
		t.Fatalf("evict within budget: %+v, %v", res, err)
	}
	if res, err = cl.ResumeNode(bg, tr.ID, root); err != nil || res.Node.State != client.NodeLive {
		t.Fatalf("resume root: %+v, %v", res, err)
	}
	nodes, err := cl.TreeNodes(bg, tr.ID)
	if err != nil || len(nodes) != 5 || nodes[0].ID != root {
		t.Fatalf("nodes: %v, %v", nodeIDs(nodes), err)
	}
	trees, err := cl.ListTrees(bg)
	if err != nil || len(trees) != 1 || trees[0].ID != tr.ID {
		t.Fatalf("list: %+v, %v", trees, err)
	}
	var na client.TreeNodeInfo
	if _, _, raw := d.raw("GET", "/v1/trees/"+tr.ID+"/nodes/ta", nil); json.Unmarshal(raw, &na) != nil {
		t.Fatalf("GET node ta: %s", raw)
	}
	if na.ID != a || !na.Protected || !slices.Equal(na.Children, []string{a1}) {
		t.Errorf("GET node a: %+v", na)
	}
	// Prune a's subtree: a1 and a go; the rest stays.
	res, err = cl.PruneNode(bg, tr.ID, a)
	if err != nil || !slices.Equal(sorted(res.Pruned), sorted([]string{a, a1})) || res.TreeRemoved || len(res.Tree.Nodes) != 3 {
		t.Fatalf("prune a: %+v, %v", res, err)
	}
	if _, err := d.cl.Get(bg, a1); !client.IsCode(err, client.CodeNotFound) {
		t.Errorf("a1's container after the prune: %v", err)
	}
	// Prune the root: the tree goes, and the watch ends.
	res, err = cl.PruneNode(bg, tr.ID, root)
	if err != nil || !res.TreeRemoved || res.Tree != nil || len(res.Pruned) != 3 {
		t.Fatalf("prune root: %+v, %v", res, err)
	}
	select {
	case err := <-w.done:
		if err != nil {
			t.Errorf("watch ended with %v, want nil (tree removed)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not end when the tree was removed")
	}
	if _, err := os.Stat(snaptree.TreeDir(tr.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("tree directory after pruning the root: %v", err)
	}
	if rows, _ := d.cl.List(bg); len(rows) != 0 {
		t.Errorf("containers left after pruning the root: %+v", rows)
	}
	_, err = cl.GetTree(bg, tr.ID)
	wantCode(t, err, client.CodeNotFound)

	// The watch saw every mutation, in order, each with the daemon's latency.
	evs := w.events()
	var got []string
	for i, e := range evs {
		got = append(got, e.Kind+":"+e.Node)
		if e.Tree != tr.ID || e.LatencyNs <= 0 || e.Time.IsZero() {
			t.Errorf("event %d: %+v: want this tree and a latency", i, e)
		}
		if i > 0 && (e.Seq <= evs[i-1].Seq || e.Time.Before(evs[i-1].Time)) {
			t.Errorf("event %d out of order: %+v after %+v", i, e, evs[i-1])
		}
	}
	want := []string{"fork:" + root, "prepare:" + a, "fork:" + a, "prepare:" + root, "suspend:" + b, "resume:" + b,
		"protect:" + a, "unprotect:" + a, "protect:" + a, "rollback:" + root, "budget:", "evict:", "budget:", "budget:",
		"resume:" + root, "prune:" + a, "prune:" + root}
	if !slices.Equal(got, want) {
		t.Fatalf("watched events:\n got %v\nwant %v", got, want)
	}
	if !slices.Equal(evs[0].Nodes, []string{a, b}) || !slices.Equal(evs[2].Nodes, []string{a1}) || !slices.Equal(evs[9].Nodes, []string{rb}) {
		t.Errorf("fork/rollback events name %v, %v, %v", evs[0].Nodes, evs[2].Nodes, evs[9].Nodes)
	}
	if ev := evs[11]; slices.Contains(ev.Nodes, a) || !slices.Contains(ev.Nodes, b) || !slices.Contains(ev.Nodes, rb) || !slices.Contains(ev.Nodes, root) {
		t.Errorf("evict event %v: want every live node but the protected a", ev.Nodes)
	}
	for _, e := range evs {
		t.Logf("%-9s %-13s %v latency %v", e.Kind, e.Node, e.Nodes, time.Duration(e.LatencyNs))
	}
}

// Bad input to the tree routes gets a one-line JSON error with a stable code, and
// changes nothing.
func TestTreeBadInput(t *testing.T) {
	d := newDaemon(t)
	d.create("victim", "sleep", "1000")
	tr := d.createTree(client.TreeCreateRequest{Name: "t1", Root: &client.CreateRequest{Image: image, Command: []string{"sleep", "1000"}}})
	nodes := "/v1/trees/" + tr.ID + "/nodes/" + tr.Root
	mk := `{"root": {"image": "` + image + `", "command": ["sleep", "1000"]}`
	cases := []struct {
		method, path, body string
		status             int
		code               string
		msg                string
	}{
		{"POST", "/v1/trees", `{}`, 400, client.CodeBadRequest, "give root"},
		{"POST", "/v1/trees", ``, 400, client.CodeBadJSON, "empty"},
		{"POST", "/v1/trees", `{"root": {"image": "x"}, "adopt": "victim"}`, 400, client.CodeBadRequest, "not both"},
		{"POST", "/v1/trees", `{"root": {}}`, 400, client.CodeBadRequest, "image is required"},
		{"POST", "/v1/trees", `{"root": {"image": "/no/such/layout"}}`, 0, "", ""},
		{"POST", "/v1/trees", `{"adopt": "nosuch"}`, 404, client.CodeNotFound, "nosuch"},
		{"POST", "/v1/trees", `{"adopt": "` + tr.Root + `"}`, 0, "", "already a node of tree"},
		{"POST", "/v1/trees", mk + `, "budget": {"max_live": 0}}`, 400, client.CodeBadRequest, "max_live"},
		{"POST", "/v1/trees", mk + `, "budget": {"max_ram_bytes": -1}}`, 400, client.CodeBadRequest, "max_ram_bytes"},
		{"POST", "/v1/trees", mk + `, "budget": {"max_chain_depth": -1}}`, 400, client.CodeBadRequest, "max_chain_depth"},
		{"POST", "/v1/trees", mk + `, "budget": {"max_live": "many"}}`, 400, client.CodeBadRequest, "must be an integer"},
		{"POST", "/v1/trees", mk + `, "budget": {"colour": 1}}`, 400, client.CodeBadRequest, "unknown field"},
		{"POST", "/v1/trees", mk + `, "name": "bad name"}`, 400, client.CodeInvalidName, "invalid name"},
		{"POST", "/v1/trees", mk + `, "name": "t1"}`, 409, client.CodeNameInUse, "already in use"},
		{"GET", "/v1/trees/tnosuch", ``, 404, client.CodeNotFound, "no such tree"},
		{"GET", "/v1/trees/t000000000000", ``, 404, client.CodeNotFound, "no such tree"},
		{"GET", "/v1/trees/..%2F..%2Fetc/nodes", ``, 404, client.CodeNotFound, "no such tree"},
		{"GET", "/v1/trees/t1/watch/extra", ``, 404, client.CodeUnknownRoute, "no route"},
		{"DELETE", "/v1/trees/tnosuch", ``, 404, client.CodeNotFound, "no such tree"},
		{"POST", "/v1/trees/t1/nodes/nosuch/fork", `{}`, 404, client.CodeNotFound, "nosuch"},
		{"POST", "/v1/trees/t1/nodes/victim/suspend", ``, 404, client.CodeNotFound, "not a node"},
		{"GET", "/v1/trees/t1/nodes/victim", ``, 404, client.CodeNotFound, "not a node"},
		{"POST", nodes + "/fork", `{"n": -1}`, 400, client.CodeBadRequest, "at least 1"},
		{"POST", nodes + "/fork", `{"n": 100000}`, 400, client.CodeBadRequest, "at most"},
		{"POST", nodes + "/fork", `{"n": 1.5}`, 400, client.CodeBadRequest, "must be an integer"},
		{"POST", nodes + "/fork", `{"labels": "x"}`, 400, client.CodeBadRequest, "must be an array"},
		{"POST", nodes + "/fork", `{"names": ["ok", "bad name"]}`, 400, client.CodeInvalidName, "invalid name"},
		{"POST", nodes + "/fork", `{"names": ["victim"]}`, 409, client.CodeNameInUse, "already in use"},
		{"POST", nodes + "/fork", `{"labels": ["ok", "a\u001b[2Jb"]}`, 400, client.CodeBadRequest, "control character"},
		{"POST", nodes + "/rollback", `{"label": "` + strings.Repeat("x", 300) + `"}`, 400, client.CodeBadRequest, "at most 256"},
		{"POST", "/v1/trees", mk + `, "label": "line\nbreak"}`, 400, client.CodeBadRequest, "control character"},
		{"POST", nodes + "/prepare", `{"refresh": "yes"}`, 400, client.CodeBadRequest, "true or false"},
		{"POST", nodes + "/rollback", `{"name": "no/slash"}`, 400, client.CodeInvalidName, "invalid name"},
		{"POST", nodes + "/suspend", `{"now": true}`, 400, client.CodeBadRequest, "unknown field"},
		{"POST", "/v1/trees/t1/budget", ``, 400, client.CodeBadJSON, "empty"},
		{"POST", "/v1/trees/t1/budget", `{"max_disk_bytes": 0}`, 400, client.CodeBadRequest, "max_disk_bytes"},
		{"PUT", "/v1/trees", `{}`, 405, client.CodeMethod, "not allowed"},
		{"GET", nodes + "/fork", ``, 405, client.CodeMethod, "use POST"},
		{"POST", "/v1/trees/t1/watch", ``, 405, client.CodeMethod, "use GET"},
	}
	for _, tc := range cases {
		status, e, body := d.raw(tc.method, tc.path, strings.NewReader(tc.body))
		if e == nil {
			t.Errorf("%s %s %s: status %d, want an error (%s)", tc.method, tc.path, tc.body, status, body)
			continue
		}
		if strings.Contains(e.Message, "\n") {
			t.Errorf("%s %s: a message of several lines: %q", tc.method, tc.path, e.Message)
		}
		if (tc.status != 0 && (status != tc.status || e.Code != tc.code)) || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("%s %s %s: got %d %+v, want %d %s containing %q", tc.method, tc.path, tc.body, status, e, tc.status, tc.code, tc.msg)
		}
	}
	// Nothing changed: one tree of one node, two containers.
	trees, err := d.cl.ListTrees(bg)
	if err != nil || len(trees) != 1 || len(trees[0].Nodes) != 1 {
		t.Errorf("trees after bad input: %+v, %v", trees, err)
	}
	if rows, _ := d.cl.List(bg); len(rows) != 2 {
		t.Errorf("containers after bad input: %+v", rows)
	}
	// A dropped tree refuses operations with invalid_state and says where its state is.
	res, err := d.cl.DropTree(bg, "t1")
	if err != nil || !slices.Equal(res.Suspended, []string{tr.Root}) || res.Dir != snaptree.TreeDir(tr.ID) || !res.Tree.Dropped {
		t.Fatalf("drop: %+v, %v", res, err)
	}
	_, err = d.cl.ForkNode(bg, "t1", tr.Root, client.TreeForkRequest{})
	wantCode(t, err, client.CodeInvalidState)
	if !strings.Contains(err.Error(), res.Dir) {
		t.Errorf("dropped tree's error does not say where the state is: %v", err)
	}
}

// A tree adopted from a running container; a daemon restarted in the middle sees the
// tree as it was, its suspended node resumes; drop keeps the state, and a prune of the
// dropped tree's root deletes it.
func TestTreeDaemonRestart(t *testing.T) {
	d := newDaemon(t)
	c := d.create("adoptee", counterCmd...)
	tr, err := d.cl.AdoptTree(bg, "adoptee", client.TreeCreateRequest{Label: "adopted"})
	if err != nil {
		t.Fatal(err)
	}
	d.pruneAtEnd(tr)
	if r := tr.Nodes[tr.Root]; tr.Root != c.ID || r.Name != "adoptee" || r.Label != "adopted" || !r.HasKeyframe || r.State != client.NodeLive {
		t.Fatalf("adopted tree: root %s %+v", tr.Root, r)
	}
	res, err := d.cl.ForkNode(bg, tr.ID, tr.Root, client.TreeForkRequest{N: 2})
	if err != nil {
		t.Fatal(err)
	}
	a, b := res.Nodes[0].ID, res.Nodes[1].ID
	if _, err := d.cl.SuspendNode(bg, tr.ID, a); err != nil {
		t.Fatal(err)
	}
	if _, err := d.cl.ProtectNode(bg, tr.ID, b); err != nil {
		t.Fatal(err)
	}
	before, err := d.cl.GetTree(bg, tr.ID)
	if err != nil {
		t.Fatal(err)
	}
	d.stop()
	d.start()
	after, err := d.cl.GetTree(bg, tr.ID)
	if err != nil {
		t.Fatal(err)
	}
	for id, n := range before.Nodes {
		m := after.Nodes[id]
		if m == nil || m.State != n.State || m.Protected != n.Protected || m.Parent != n.Parent || m.Keyframe != n.Keyframe {
			t.Errorf("node %s before the restart %+v, after %+v", id, n, m)
		}
	}
	if len(after.Nodes) != 3 || after.Nodes[a].State != client.NodeSuspended || !after.Nodes[b].Protected {
		t.Fatalf("after the restart: %+v", after.Nodes)
	}
	if res, err = d.cl.ResumeNode(bg, tr.ID, a); err != nil || res.Node.State != client.NodeLive {
		t.Fatalf("resume after the restart: %+v, %v", res, err)
	}
	if got := d.exec(a, "hostname"); got != a {
		t.Errorf("hostname %q", got)
	}
	res, err = d.cl.DropTree(bg, tr.ID)
	if err != nil || len(res.Suspended) != 3 || !res.Tree.Dropped {
		t.Fatalf("drop: %+v, %v", res, err)
	}
	dir := res.Dir
	if _, err := os.Stat(dir); err != nil || dir != snaptree.TreeDir(tr.ID) {
		t.Errorf("dropped tree's state in %s: %v", dir, err)
	}
	if res, err = d.cl.PruneNode(bg, tr.ID, tr.Root); err != nil || !res.TreeRemoved {
		t.Fatalf("prune the dropped tree's root: %+v, %v", res, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dropped tree's directory after the prune: %v", err)
	}
	if rows, _ := d.cl.List(bg); len(rows) != 0 {
		t.Errorf("containers left: %+v", rows)
	}
}

// The Python SDK's snapshot trees (lazyfork.tree), installed as pip installs it, against
// the daemon: testdata/sdk_tree.py reports what it saw.
func TestPythonTreeSDK(t *testing.T) {
	d := newDaemon(t)
	site := t.TempDir()
	pip := exec.Command("python3", "-m", "pip", "install", "--quiet", "--no-index", "--target", site, filepath.Join(repoDir(), "python"))
	if out, err := pip.CombinedOutput(); err != nil {
		t.Fatalf("pip install ./python: %v\n%s", err, out)
	}
	cmd, _ := json.Marshal(counterCmd)
	py := exec.Command("python3", filepath.Join(repoDir(), "lib", "daemon", "testdata", "sdk_tree.py"), image, string(cmd))
	py.Dir = t.TempDir()
	py.Env = append(os.Environ(), "LAZYFORK_SOCKET="+d.socket, "PYTHONPATH="+site)
	var stderr bytes.Buffer
	py.Stderr = &stderr
	out, err := py.Output()
	t.Cleanup(func() { // a failed script leaves its tree
		m := &snaptree.Manager{RT: d.rt}
		if all, _ := m.List(); len(all) > 0 {
			for _, tr := range all {
				_, _, _ = m.Prune(bg, tr.ID, tr.Root)
			}
		}
	})
	if err != nil {
		t.Fatalf("python: %v\n%s", err, stderr.String())
	}
	var r struct {
		TreeID          string            `json:"tree_id"`
		RootKeyframe    bool              `json:"root_keyframe"`
		Budget          client.TreeBudget `json:"budget"`
		Forks           []string          `json:"forks"`
		ForkLabels      []string          `json:"fork_labels"`
		ForkHostname    string            `json:"fork_hostname"`
		Suspended       string            `json:"suspended"`
		SuspendedState  string            `json:"suspended_state"`
		Resumed         string            `json:"resumed"`
		ResumedHostname string            `json:"resumed_hostname"`
		Protected       bool              `json:"protected"`
		Unprotected     bool              `json:"unprotected"`
		RollbackParent  string            `json:"rollback_parent"`
		Nodes           []string          `json:"nodes"`
		OverBudget      []any             `json:"over_budget"`
		EvictedNow      []string          `json:"evicted_now"`
		NotFound        []any             `json:"not_found"`
		BadBudget       string            `json:"bad_budget"`
		PrunedX         []string          `json:"pruned_x"`
		Trees           []string          `json:"trees"`
		TreeRemoved     bool              `json:"tree_removed"`
		WatchEnded      bool              `json:"watch_ended"`
		WatchFirst      []string          `json:"watch_first"`
		WatchEvents     [][]any           `json:"watch_events"`
		TreesAfter      []string          `json:"trees_after"`
		Adopted         []any             `json:"adopted"`
		Dropped         []bool            `json:"dropped"`
		DroppedFork     string            `json:"dropped_fork"`
		DroppedPruned   bool              `json:"dropped_pruned"`
		ContainersAfter int               `json:"containers_after"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("report %q: %v\n%s", out, err, stderr.String())
	}
	t.Logf("report: %s", out)
	if !r.RootKeyframe || r.Budget.MaxLive != 4 || len(r.Forks) != 2 || !slices.Equal(r.ForkLabels, []string{"x", "y"}) || r.ForkHostname != r.Forks[0] {
		t.Errorf("create and fork: %+v", r)
	}
	if r.Suspended != "suspended" || r.SuspendedState != "suspended" || r.Resumed != "live" || r.ResumedHostname != r.Forks[0] {
		t.Errorf("suspend and resume: %q %q %q %q", r.Suspended, r.SuspendedState, r.Resumed, r.ResumedHostname)
	}
	if !r.Protected || r.Unprotected || len(r.Nodes) != 4 || r.RollbackParent != r.Nodes[0] {
		t.Errorf("protect, rollback, nodes: %+v", r)
	}
	if len(r.OverBudget) != 3 || r.OverBudget[0] != client.CodeOverBudget || r.OverBudget[1] != float64(409) || !strings.Contains(r.OverBudget[2].(string), "max_live") {
		t.Errorf("over budget: %v", r.OverBudget)
	}
	if len(r.EvictedNow) != 0 || len(r.NotFound) != 2 || r.NotFound[0] != client.CodeNotFound || !strings.Contains(r.BadBudget, "max_ram") {
		t.Errorf("evict, not found, bad budget: %v %v %q", r.EvictedNow, r.NotFound, r.BadBudget)
	}
	if len(r.PrunedX) != 1 || r.PrunedX[0] != r.Forks[0] || !slices.Equal(r.Trees, []string{r.TreeID}) || !r.TreeRemoved || len(r.TreesAfter) != 0 {
		t.Errorf("prune: %+v", r)
	}
	if !r.WatchEnded || !slices.Contains(r.WatchFirst, "tree") {
		t.Errorf("watch: ended %v, first message keys %v", r.WatchEnded, r.WatchFirst)
	}
	if len(r.Adopted) != 2 || r.Adopted[0] != true || r.Adopted[1] != "adopted" || !slices.Equal(r.Dropped, []bool{true, true, true}) ||
		r.DroppedFork != client.CodeInvalidState || !r.DroppedPruned || r.ContainersAfter != 0 {
		t.Errorf("adopt, drop, prune of a dropped tree: %v %v %q %v, %d containers left", r.Adopted, r.Dropped, r.DroppedFork, r.DroppedPruned, r.ContainersAfter)
	}
	var kinds []string
	for _, e := range r.WatchEvents {
		kinds = append(kinds, e[0].(string))
		if e[2].(float64) <= 0 {
			t.Errorf("event %v without latency", e)
		}
	}
	want := []string{"fork", "suspend", "resume", "protect", "unprotect", "rollback", "protect", "budget", "evict", "budget", "prune", "prune"}
	if !slices.Equal(kinds, want) {
		t.Errorf("watched %v, want %v", kinds, want)
	}
}

// examples/tree_search.py, as a user runs it (the SDK pip-installed), against the daemon:
// under its budget of 4 live containers the search evicts and resumes nodes, and every
// node on the winner's path answers from its memory with the moves that led to it.
func TestTreeSearchExample(t *testing.T) {
	d := newDaemon(t)
	site := t.TempDir()
	pip := exec.Command("python3", "-m", "pip", "install", "--quiet", "--no-index", "--target", site, filepath.Join(repoDir(), "python"))
	if out, err := pip.CombinedOutput(); err != nil {
		t.Fatalf("pip install ./python: %v\n%s", err, out)
	}
	t.Cleanup(func() { // a failed run may leave its tree
		m := &snaptree.Manager{RT: d.rt}
		all, _ := m.List()
		for _, tr := range all {
			_, _, _ = m.Prune(bg, tr.ID, tr.Root)
		}
	})
	py := exec.Command("python3", filepath.Join(repoDir(), "examples", "tree_search.py"), "--image", image)
	py.Dir = t.TempDir()
	py.Env = append(os.Environ(), "LAZYFORK_SOCKET="+d.socket, "PYTHONPATH="+site)
	out, err := py.CombinedOutput()
	t.Logf("examples/tree_search.py:\n%s", out)
	if err != nil {
		t.Fatalf("examples/tree_search.py: %v", err)
	}
	for _, want := range []string{"event evict", "event resume", "winner ", "protected", "pruned the tree"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the example's output has no %q", want)
		}
	}
	if strings.Contains(string(out), "WRONG") {
		t.Error("a node on the winner's path answered with other moves")
	}
	if trees, _ := d.cl.ListTrees(bg); len(trees) != 0 {
		t.Errorf("trees left: %d", len(trees))
	}
	if rows, _ := d.cl.List(bg); len(rows) != 0 {
		t.Errorf("containers left: %d", len(rows))
	}
}
