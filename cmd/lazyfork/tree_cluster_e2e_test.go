package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/testutil"
	"github.com/lazyfork/lazyfork/lib/testutil/timescale"
)

// A cluster as a snapshot-tree node through the porcelain: `tree adopt` of a member roots
// the tree at the whole cluster (kind cluster, 2 members); `tree fork` forks the cluster;
// suspend and resume act on both members, whose connection goes on; prune of the root
// deletes every member.
func TestTreeClusterCLI(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	for name, prog := range map[string]string{"srv.py": testutil.LoopbackServer, "cl.py": testutil.PortClient} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(prog), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e.must(fmt.Sprintf(`lazyfork create lazyfork/debian:bookworm --name srv -- python3 -c "$(cat %s/srv.py)"`, dir))
	e.must(fmt.Sprintf(`lazyfork create lazyfork/debian:bookworm --name cl --join srv -- python3 -c "$(cat %s/cl.py)"`, dir))
	// lines is how many round trips ref's client made, all on one connection.
	lines := func(ref string) int {
		out, _, _ := e.sh("lazyfork attach --no-follow " + ref)
		if strings.TrimSpace(out) == "" {
			return 0
		}
		ls := strings.Split(strings.TrimSpace(out), "\n")
		port := strings.Fields(ls[0])[0]
		for _, l := range ls {
			if f := strings.Fields(l); len(f) < 2 || f[0] != port || f[1] != "pong" {
				t.Fatalf("%s's client: %q after %q (want one connection)", ref, l, ls[0])
			}
		}
		return len(ls)
	}
	goesOn := func(ref string) {
		n := lines(ref)
		testutil.Eventually(t, timescale.Scale(20*time.Second), ref+"'s pair to go on", func() bool { return lines(ref) > n+5 })
	}
	goesOn("cl")

	var tr struct {
		ID, Root string
		Nodes    map[string]struct {
			Kind      string
			State     string
			Members   int      `json:"member_count"`
			MemberIDs []string `json:"member_ids"`
		}
	}
	if err := json.Unmarshal([]byte(e.must("lazyfork tree adopt cl --name tc --json")), &tr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if out, _, _ := e.sh("lazyfork tree ls --json"); strings.Contains(out, tr.ID) {
			if _, errOut, code := e.sh("lazyfork tree prune tc srv"); code != 0 {
				t.Errorf("cleanup prune: %s", errOut)
			}
		}
	})
	// state of each container by id and by name.
	state := func() map[string]string {
		var all []struct{ ID, Name, State string }
		if err := json.Unmarshal([]byte(e.must("lazyfork list --json")), &all); err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, c := range all {
			out[c.ID] = c.State
			if c.Name != "" {
				out[c.Name] = c.ID
			}
		}
		return out
	}
	srvID := state()["srv"]
	if r := tr.Nodes[tr.Root]; tr.Root != srvID || r.Kind != "cluster" || r.Members != 2 || len(r.MemberIDs) != 2 {
		t.Fatalf("adopted tree: root %s (srv %s) %+v", tr.Root, srvID, r)
	}
	goesOn("cl")

	var f struct {
		ID, Kind  string
		Members   int      `json:"member_count"`
		MemberIDs []string `json:"member_ids"`
	}
	if err := json.Unmarshal([]byte(e.must("lazyfork tree fork tc cl --label f --json")), &f); err != nil {
		t.Fatal(err)
	}
	if f.Kind != "cluster" || f.Members != 2 || len(f.MemberIDs) != 2 {
		t.Fatalf("fork node: %+v", f)
	}
	goesOn(f.MemberIDs[1])
	if row := e.must("lazyfork tree nodes tc | grep " + f.ID); !strings.Contains(row, "cluster/2") {
		t.Fatalf("nodes row: %s", row)
	}

	e.must("lazyfork tree suspend tc " + f.ID)
	for _, id := range f.MemberIDs {
		if st := state()[id]; st != "stopped" {
			t.Errorf("member %s of the suspended node: %s", id, st)
		}
	}
	e.must("lazyfork tree resume tc " + f.ID)
	goesOn(f.MemberIDs[1])

	if got := strings.Fields(e.must("lazyfork tree prune tc srv")); len(got) != 2 {
		t.Fatalf("prune printed %v", got)
	}
	if out := e.must("lazyfork list -q"); out != "" {
		t.Fatalf("containers left: %s", out)
	}
}
