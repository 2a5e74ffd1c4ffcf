package main

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// While a daemon runs, `lazyfork tree ...` goes through its tree routes: a client
// watching the tree sees every command's mutation, in order, with its latency.
func TestTreeCLIThroughDaemon(t *testing.T) {
	e := newEnv(t)
	socket, logPath := e.withDaemon()
	e.must("lazyfork daemon start")
	treeID := e.must("lazyfork tree create lazyfork/debian:bookworm --name tw --root-name twr --max-live 3 -- " + counter)
	t.Cleanup(func() {
		if out, _, _ := e.sh("lazyfork tree ls --json"); strings.Contains(out, treeID) {
			if _, errOut, code := e.sh("lazyfork tree prune tw twr"); code != 0 {
				t.Errorf("cleanup prune: %s", errOut)
			}
		}
	})

	var mu sync.Mutex
	var msgs []client.TreeWatchMessage
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() {
		done <- client.New(socket).WatchTree(ctx, "tw", func(m client.TreeWatchMessage) error {
			mu.Lock()
			msgs = append(msgs, m)
			mu.Unlock()
			return nil
		})
	}()
	testutil.Eventually(t, 20*time.Second, "the watch's tree", func() bool { mu.Lock(); defer mu.Unlock(); return len(msgs) > 0 })

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
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the watch did not end with the tree")
	}
	mu.Lock()
	defer mu.Unlock()
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
