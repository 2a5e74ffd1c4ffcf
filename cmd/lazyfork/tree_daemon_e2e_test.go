package main

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// While a daemon runs, `lazyfork tree ...` goes through its tree routes: a client
// watching the tree sees every command's mutation, in order, with its latency.
func TestTreeCLIThroughDaemon(t *testing.T) {
	e := newEnv(t)
	socket, logPath := e.daemonTree("tw", "twr", "--max-live 3")
	w := watchTree(t, socket, "tw")
	w.wait(1, "the watch's tree")

	forks := strings.Fields(e.must("lazyfork tree fork tw -n 2"))
	if len(forks) != 2 {
		t.Fatalf("tree fork printed %v", forks)
	}
	e.must("lazyfork tree suspend tw " + forks[0])
	e.must("lazyfork tree resume tw " + forks[0])
	e.must("lazyfork tree protect tw " + forks[1])
	var doc struct {
		Root  string
		Nodes map[string]struct {
			State     string
			Protected bool
		}
	}
	if err := json.Unmarshal([]byte(e.must("lazyfork tree nodes tw --json")), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Nodes) != 3 || doc.Nodes[forks[0]].State != "live" || !doc.Nodes[forks[1]].Protected {
		t.Fatalf("tree nodes through the daemon: %+v", doc)
	}
	// At max_live, a fork of forks[0] evicts the only candidate, the root, and says so
	// as it does in-process.
	out, errOut, code := e.sh("lazyfork tree fork tw " + forks[0])
	if code != 0 || !strings.Contains(errOut, "evicted (suspended to disk) "+doc.Root) {
		t.Fatalf("fork at max_live through the daemon: exit %d, %q", code, errOut)
	}
	f00 := strings.TrimSpace(out)
	// Nothing left to evict: the over-budget refusal is the daemon's, one line, status 1.
	if _, errOut, code := e.sh("lazyfork tree protect tw " + forks[0] + " && lazyfork tree protect tw " + f00 + " && lazyfork tree fork tw " + forks[1]); code != 1 ||
		!strings.Contains(errOut, "max_live") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Errorf("fork over max_live through the daemon: exit %d, %q", code, errOut)
	}
	e.must("lazyfork tree prune tw twr")
	msgs := w.end(20*time.Second, "with the tree")
	var got []string
	for _, m := range msgs[1:] {
		if m.Event.LatencyNs <= 0 {
			t.Errorf("event without latency: %+v", m.Event)
		}
		got = append(got, m.Event.Kind+":"+m.Event.Node)
	}
	want := []string{"fork:" + doc.Root, "suspend:" + forks[0], "resume:" + forks[0], "protect:" + forks[1],
		"evict:", "prepare:" + forks[0], "fork:" + forks[0], "protect:" + forks[0], "protect:" + f00, "prune:" + doc.Root}
	if !slices.Equal(got, want) {
		t.Errorf("watched:\n got %v\nwant %v", got, want)
	}
	log, _ := os.ReadFile(logPath)
	for _, route := range []string{"POST path=/v1/trees ", "/v1/trees/tw/nodes/" + doc.Root + "/fork", "/v1/trees/tw/nodes/" + forks[0] + "/suspend"} {
		if !strings.Contains(string(log), route) {
			t.Errorf("the daemon did not serve %s; its log:\n%s", route, log)
		}
	}
}
