package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/testutil"
)

// The porcelain in bridge mode: a web server and its forks each get an address (list,
// stats, lf-restore's lines show it), a fork reaches its parent across the bridge, exec
// works inside, and deleting everything removes the bridge. Traffic stays between the
// test's own namespaces.
func TestBridgeModeFromTheCLI(t *testing.T) {
	br := fmt.Sprintf("lfbre%05d", rand.IntN(100000))
	t.Cleanup(func() { // after newEnv's clean-up deleted the containers
		if out, err := exec.Command("ip", "link", "show", br).CombinedOutput(); err == nil {
			t.Errorf("bridge left: %s", out)
		}
	})
	e := newEnv(t)
	e.vars = append(e.vars, "LAZYFORK_BRIDGE="+br, fmt.Sprintf("LAZYFORK_SUBNET=10.213.%d.0/24", rand.IntN(256)))
	e.must("lazyfork create lazyfork/debian:bookworm --name web --net bridge -- python3 -m http.server 8080")
	e.must("lazyfork fork web -n 2")
	forkLines := strings.Split(e.must("lf-dump web | lf-memfile | lf-restore -n 1"), "\n")
	var fk struct{ Address string }
	if err := json.Unmarshal([]byte(forkLines[0]), &fk); err != nil || fk.Address == "" {
		t.Fatalf("lf-restore line without an address: %q (%v)", forkLines[0], err)
	}
	var rows []struct{ ID, Name, Net, Address, Bridge string }
	if err := json.Unmarshal([]byte(e.must("lazyfork list --json")), &rows); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	webAddr := ""
	for _, r := range rows {
		if r.Net != "bridge" || r.Bridge != br || r.Address == "" || seen[r.Address] {
			t.Errorf("row %+v", r)
		}
		seen[r.Address] = true
		if r.Name == "web" {
			webAddr = r.Address
		}
	}
	if len(rows) != 4 || !seen[fk.Address] {
		t.Fatalf("%d rows (want 4), lf-restore's fork %s among them: %v", len(rows), fk.Address, seen)
	}
	if out := e.must("lazyfork list"); !strings.Contains(out, webAddr) {
		t.Errorf("list does not show %s:\n%s", webAddr, out)
	}
	if out := e.must("lazyfork stats web"); !strings.Contains(out, "bridge: "+webAddr+" on "+br) {
		t.Errorf("stats:\n%s", out)
	}
	// A fork fetches from its parent's server over the bridge.
	fetch := fmt.Sprintf(`lazyfork exec %s -- python3 -c 'import urllib.request; print(urllib.request.urlopen("http://%s:8080/", timeout=10).status)'`, rows[1].ID, webAddr)
	if rows[1].Name == "web" {
		fetch = strings.Replace(fetch, rows[1].ID, rows[2].ID, 1)
	}
	if out := e.must(fetch); out != "200" {
		t.Errorf("fork fetching from web: %q", out)
	}
	if _, errOut, code := e.sh("lazyfork create lazyfork/debian:bookworm --net bridge --nat=false -- true && LAZYFORK_SUBNET=10.213.0.1/24 lazyfork create lazyfork/debian:bookworm --net bridge -- true"); code == 0 || !strings.Contains(errOut, "host bits set") || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
		t.Errorf("bad subnet: exit %d: %q", code, errOut)
	}
}

// A cluster from the CLI: a server, a client that joins its namespace, forked twice as one
// cut; the JSON names each member's pause and copies, and every fork's client goes on.
func TestClusterFromTheCLI(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	srv := testutil.LoopbackServer
	cl := testutil.LoopbackClient
	for name, prog := range map[string]string{"srv.py": srv, "cl.py": cl} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(prog), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e.must(fmt.Sprintf(`lazyfork create lazyfork/debian:bookworm --name srv -- python3 -c "$(cat %s/srv.py)"`, dir))
	e.must(fmt.Sprintf(`lazyfork create lazyfork/debian:bookworm --name cl --join srv -- python3 -c "$(cat %s/cl.py)"`, dir))
	if _, errOut, code := e.sh("lazyfork create lazyfork/debian:bookworm --net bridge --join srv -- true"); code == 0 || !strings.Contains(errOut, "--net none") {
		t.Errorf("a bridge member: exit %d: %s", code, errOut)
	}
	count := func(ref string) int {
		out, _, _ := e.sh("lazyfork attach --no-follow " + ref + " | grep -c pong")
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n
	}
	testutil.Eventually(t, 15*time.Second, "the pair to talk", func() bool { return count("cl") > 3 })
	var res struct {
		Kind    string
		Leaders []string
		Members []struct {
			ID      string
			PauseMs float64 `json:"pause_ms"`
			Forks   []struct{ ID string }
		}
	}
	if err := json.Unmarshal([]byte(e.must("lazyfork cluster fork cl -n 2 --json")), &res); err != nil {
		t.Fatal(err)
	}
	if res.Kind != "lazyfork.cluster-fork" || len(res.Leaders) != 2 || len(res.Members) != 2 {
		t.Fatalf("result %+v", res)
	}
	for _, m := range res.Members {
		if m.PauseMs <= 0 || len(m.Forks) != 2 {
			t.Errorf("member %+v", m)
		}
	}
	for _, ref := range []string{"cl", res.Members[1].Forks[0].ID, res.Members[1].Forks[1].ID} {
		n := count(ref)
		testutil.Eventually(t, 15*time.Second, ref+"'s client to go on", func() bool { return count(ref) > n+5 })
	}
}
