package snaptree_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/ksm"
	"github.com/lazyfork/lazyfork/lib/snaptree"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
	"github.com/lazyfork/lazyfork/lib/testutil/timescale"
)

// pairServer answers each message on 127.0.0.1:8080 with "pong <n>", n counting every
// message it served (state in memory).
const pairServer = `import socket, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 8080)); srv.listen(8)
n = [0]
def serve(c):
    while True:
        d = c.recv(64)
        if not d:
            return
        n[0] += 1
        c.sendall(b"pong %d" % n[0])
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
`

func logOf(t *testing.T, rt *container.Runtime, id string) []string {
	t.Helper()
	b, _ := os.ReadFile(container.LogPath(testutil.MustGet(t, rt, id)))
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// talking waits until the client member of a cluster node has printed five more round
// trips, all over the connection on port.
func talking(t *testing.T, rt *container.Runtime, client, port string) {
	t.Helper()
	n := len(logOf(t, rt, client))
	testutil.Eventually(t, timescale.Scale(20*time.Second), client+"'s pair to go on talking", func() bool {
		return len(logOf(t, rt, client)) > n+5
	})
	for _, l := range logOf(t, rt, client)[n:] {
		if f := strings.Fields(l); len(f) != 3 || f[0] != port || f[1] != "pong" {
			t.Fatalf("%s: %q (want the same connection, port %s, answered)", client, l, port)
		}
	}
}

func memberStates(rt *container.Runtime, ids []string) string {
	var out []string
	for _, id := range ids {
		c, err := rt.Containers.Get(id)
		if err != nil {
			out = append(out, "gone")
			continue
		}
		out = append(out, rt.State(c))
	}
	return strings.Join(out, ",")
}

// A cluster (server and client on loopback, one connection) as a snapshot-tree node:
// adopting a member roots the tree at the whole cluster (kind cluster, 2 members, both
// moved into the tree cgroup); tree fork forks the cluster; suspend stops and packs
// every member together, and resume brings them back with the connection intact; a
// suspended cluster node forks and rolls back; eviction suspends a cluster as a unit and
// never the protected root; prune deletes every member of a subtree, then the tree.
func TestClusterNode(t *testing.T) {
	rt := testutil.NewRuntime(t)
	m := &snaptree.Manager{RT: rt}
	srv, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "srv", Command: []string{"python3", "-c", pairServer}})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "cl", Join: "srv", Command: []string{"python3", "-c", testutil.PortClient}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timescale.Scale(20*time.Second), "the pair to talk", func() bool { return len(logOf(t, rt, cl.ID)) > 3 })
	port := strings.Fields(logOf(t, rt, cl.ID)[0])[0]

	b := snaptree.DefaultBudget()
	b.MaxLive, b.MaxRAMBytes = 8, 1<<30
	tr, err := m.Adopt(ctx, "cl", snaptree.CreateOptions{Budget: &b, Label: "pair"})
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	testutil.PruneAtEnd(t, m, tr)
	root := nodeOf(t, tr, srv.ID)
	if tr.Root != srv.ID || root.Kind != snaptree.NodeKindCluster || root.Members != 2 || strings.Join(root.MemberIDs, ",") != srv.ID+","+cl.ID || root.HasKeyframe {
		t.Fatalf("root node: %+v", root)
	}
	for _, id := range root.MemberIDs {
		for k, p := range testutil.MustGet(t, rt, id).Cgroup {
			if !strings.HasPrefix(p, tr.Cgroup[k]+"/") {
				t.Errorf("member %s's cgroup %s:%s is not inside the tree's %s", id, k, p, tr.Cgroup[k])
			}
		}
	}
	talking(t, rt, cl.ID, port)
	if _, err := m.Adopt(ctx, "srv", snaptree.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "already a node") {
		t.Errorf("adopting the cluster twice: %v", err)
	}
	if _, _, err := m.Prepare(ctx, tr.ID, "", false); err == nil || !strings.Contains(err.Error(), "no keyframe") {
		t.Errorf("prepare of a cluster node: %v", err)
	}

	// Fork, naming the node by its client member.
	forks, tr, err := m.Fork(ctx, tr.ID, "cl", snaptree.ForkOptions{N: 2, Labels: []string{"a", "b"}})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	if len(forks) != 2 {
		t.Fatalf("%d forks", len(forks))
	}
	for _, f := range forks {
		if f.Kind != snaptree.NodeKindCluster || f.Members != 2 || len(f.MemberIDs) != 2 || f.Parent != srv.ID || f.MemberIDs[0] != f.ID {
			t.Fatalf("fork node: %+v", f)
		}
		if c := testutil.MustGet(t, rt, f.MemberIDs[1]); c.Cluster != f.ID || c.Parent != cl.ID {
			t.Errorf("fork %s's client: cluster %q parent %q", f.ID, c.Cluster, c.Parent)
		}
		talking(t, rt, f.MemberIDs[1], port)
	}
	talking(t, rt, cl.ID, port)

	// Suspend: every member stopped, packed, its RAM freed; then forked from disk.
	a := forks[0]
	sus, tr, err := m.Suspend(ctx, tr.ID, a.ID)
	if err != nil {
		t.Fatalf("suspend: %v", err)
	}
	if sus.State != snaptree.StateSuspended || len(sus.Packed) != 2 || sus.DeltaBytes <= 0 {
		t.Fatalf("suspended node: state %s, %d packed, %d delta bytes", sus.State, len(sus.Packed), sus.DeltaBytes)
	}
	if got := memberStates(rt, a.MemberIDs); got != store.StateStopped+","+store.StateStopped {
		t.Fatalf("members of the suspended node: %s", got)
	}
	for _, id := range a.MemberIDs {
		if n := cgroupBytes(rt, id); n != 0 {
			t.Errorf("suspended member %s still charged %d bytes", id, n)
		}
	}
	grand, tr, err := m.Fork(ctx, tr.ID, a.ID, snaptree.ForkOptions{N: 1})
	if err != nil {
		t.Fatalf("fork of the suspended cluster: %v", err)
	}
	if nodeOf(t, tr, a.ID).State != snaptree.StateSuspended || grand[0].Kind != snaptree.NodeKindCluster {
		t.Fatalf("after the fork from disk: source %s, fork %+v", nodeOf(t, tr, a.ID).State, grand[0])
	}
	talking(t, rt, grand[0].MemberIDs[1], port)

	// Resume: the same containers, the same connection.
	if _, tr, err = m.Resume(ctx, tr.ID, a.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if n := nodeOf(t, tr, a.ID); n.State != snaptree.StateLive || len(n.Packed) != 0 || memberStates(rt, a.MemberIDs) != "running,running" {
		t.Fatalf("resumed node: %s, %d packed, members %s", n.State, len(n.Packed), memberStates(rt, a.MemberIDs))
	}
	ca, sa := testutil.MustGet(t, rt, a.MemberIDs[1]), testutil.MustGet(t, rt, a.MemberIDs[0])
	if ca.Cluster != a.ID || sa.Pid == 0 {
		t.Fatalf("resumed members: %+v %+v", ca, sa)
	}
	talking(t, rt, ca.ID, port)

	// Eviction: with the root protected and room for 3 live nodes of 4, one unprotected
	// cluster is suspended whole.
	if _, _, err := m.Protect(ctx, tr.ID, tr.Root, true); err != nil {
		t.Fatal(err)
	}
	b.MaxLive = 3
	if tr, err = m.SetBudget(ctx, tr.ID, b); err != nil {
		t.Fatalf("budget: %v", err)
	}
	var evicted *snaptree.Node
	for _, n := range tr.Nodes {
		if n.State == snaptree.StateSuspended {
			if evicted != nil {
				t.Fatalf("two nodes evicted: %s and %s", evicted.ID, n.ID)
			}
			evicted = n
		}
	}
	if evicted == nil || evicted.ID == tr.Root || tr.Usage.Live != 3 {
		t.Fatalf("eviction: %+v, %d live", evicted, tr.Usage.Live)
	}
	if got := memberStates(rt, evicted.MemberIDs); got != "stopped,stopped" {
		t.Errorf("evicted cluster's members: %s", got)
	}
	talking(t, rt, cl.ID, port) // the protected root runs on

	// Rollback from the evicted node's suspended state: a new live branch.
	b.MaxLive = 8
	if tr, err = m.SetBudget(ctx, tr.ID, b); err != nil {
		t.Fatal(err)
	}
	rb, tr, err := m.Rollback(ctx, tr.ID, evicted.ID, "", "again")
	if err != nil {
		t.Fatalf("rollback: %v", err)
	}
	if rb.Kind != snaptree.NodeKindCluster || rb.Parent != evicted.ID || rb.Members != 2 {
		t.Fatalf("rollback node: %+v", rb)
	}
	talking(t, rt, rb.MemberIDs[1], port)

	// Prune fork a's subtree: its members and its fork's are deleted; then the tree.
	// a, its fork from disk, and the rollback when the evicted node was one of those.
	want := tr.Subtree(a.ID)
	if len(want) < 2 {
		t.Fatalf("subtree of %s: %v", a.ID, want)
	}
	res, tr, err := m.Prune(ctx, tr.ID, a.ID)
	if err != nil {
		t.Fatalf("prune: %v", err)
	}
	if strings.Join(res.Pruned, ",") != strings.Join(want, ",") {
		t.Errorf("pruned %v, want %v", res.Pruned, want)
	}
	for _, id := range append(append([]string{}, a.MemberIDs...), grand[0].MemberIDs...) {
		if _, err := rt.Containers.Get(id); err == nil {
			t.Errorf("member %s of a pruned node is still recorded", id)
		}
	}
	talking(t, rt, cl.ID, port)
	if res, _, err = m.Prune(ctx, tr.ID, tr.Root); err != nil || !res.TreeRemoved {
		t.Fatalf("prune root: %v %+v", err, res)
	}
	if all, _ := rt.Containers.List(); len(all) != 0 {
		var ids []string
		for _, c := range all {
			ids = append(ids, c.ID+":"+c.State)
		}
		t.Fatalf("records left after the tree was pruned: %v", ids)
	}
}

// In a ksm tree a cluster node's forks map their memory mergeable too, every member.
func TestKSMClusterNode(t *testing.T) {
	if err := ksm.Available(); err != nil {
		t.Fatal(err)
	}
	rt := testutil.NewRuntime(t)
	m := &snaptree.Manager{RT: rt}
	if _, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "srv", Command: []string{"python3", "-c", pairServer}}); err != nil {
		t.Fatal(err)
	}
	cl, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "cl", Join: "srv", Command: []string{"python3", "-c", testutil.PortClient}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timescale.Scale(20*time.Second), "the pair to talk", func() bool { return len(logOf(t, rt, cl.ID)) > 3 })
	tr, err := m.Adopt(ctx, "cl", snaptree.CreateOptions{KSM: true})
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	testutil.PruneAtEnd(t, m, tr)
	forks, _, err := m.Fork(ctx, tr.ID, tr.Root, snaptree.ForkOptions{N: 1})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	for _, id := range forks[0].MemberIDs {
		if n := mergeable(t, rt, id); n == 0 {
			c := testutil.MustGet(t, rt, id)
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", c.Pid))
			t.Errorf("member %s of the ksm tree's cluster fork maps nothing mergeable; maps:\n%s", id, b)
		}
	}
}
