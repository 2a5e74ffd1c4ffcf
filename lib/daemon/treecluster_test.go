package daemon_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/snaptree"
	"github.com/lazyfork/lazyfork/lib/testutil"
	"github.com/lazyfork/lazyfork/lib/testutil/timescale"
)

// A cluster as a snapshot-tree node through the daemon's routes: adopting a member roots
// the tree at the cluster (kind cluster, two members); fork, suspend and resume act on
// both members (the pair goes on talking in the fork and after the resume); prepare is
// refused as an invalid state; prune of the root deletes every member.
func TestTreeClusterRoutes(t *testing.T) {
	d := newDaemon(t)
	srv, cl := d.pair()
	talking := func(ref string) {
		t.Helper()
		n := -1
		testutil.Eventually(t, timescale.Scale(20*time.Second), ref+" to go on talking", func() bool {
			var c int
			fmt.Sscan(d.exec(ref, "sh", "-c", "grep -c pong /var/log/lazyfork/output.log || true"), &c)
			if n < 0 {
				n = c
			}
			return c > n+5
		})
	}
	talking("cl")

	tr, err := d.cl.AdoptTree(bg, "cl", client.TreeCreateRequest{Name: "pod", Label: "pair"})
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	d.pruneAtEnd(tr)
	root := tr.Nodes[tr.Root]
	if tr.Root != srv.ID || root == nil || root.Kind != snaptree.NodeKindCluster || root.Members != 2 || len(root.MemberIDs) != 2 || root.MemberIDs[1] != cl.ID {
		t.Fatalf("adopted tree: root %s %+v", tr.Root, root)
	}
	talking("cl")

	_, err = d.cl.PrepareNode(bg, "pod", "cl", false)
	wantCode(t, err, client.CodeInvalidState)

	res, err := d.cl.ForkNode(bg, "pod", "srv", client.TreeForkRequest{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	f := res.Nodes[0]
	if f.Kind != snaptree.NodeKindCluster || f.Members != 2 || f.Parent != srv.ID {
		t.Fatalf("fork node %+v", f)
	}
	talking(f.MemberIDs[1])

	sus, err := d.cl.SuspendNode(bg, "pod", f.ID)
	if err != nil {
		t.Fatal(err)
	}
	if sus.Node.State != client.NodeSuspended || len(sus.Node.Packed) != 2 {
		t.Fatalf("suspended: %+v", sus.Node)
	}
	for _, id := range f.MemberIDs {
		if in, err := d.cl.Get(bg, id); err != nil || in.State != "stopped" {
			t.Errorf("member %s of the suspended node: %+v %v", id, in, err)
		}
	}
	if _, err := d.cl.ResumeNode(bg, "pod", f.MemberIDs[1]); err != nil { // a member names its node
		t.Fatal(err)
	}
	talking(f.MemberIDs[1])

	if _, err := d.cl.PruneNode(bg, "pod", tr.Root); err != nil {
		t.Fatal(err)
	}
	for _, id := range append(root.MemberIDs, f.MemberIDs...) {
		if _, err := d.cl.Get(bg, id); err == nil {
			t.Errorf("%s survived the prune of the tree", id)
		}
	}
}
