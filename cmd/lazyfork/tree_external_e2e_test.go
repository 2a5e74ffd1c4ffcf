package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

// A daemon's watchers see the mutations `lazyfork --local tree ...` makes behind its back
// (read from tree.json, marked external) in order with its own; and a refused tree
// command exits with the same status with and without the daemon.
func TestTreeWatchSeesLocalMutations(t *testing.T) {
	e := newEnv(t)
	socket, _ := e.daemonTree("tx", "txr", "")
	var doc struct{ Root string }
	if err := json.Unmarshal([]byte(e.must("lazyfork tree nodes tx --json")), &doc); err != nil || doc.Root == "" {
		t.Fatalf("tree nodes: %v %+v", err, doc)
	}
	root := doc.Root

	w := watchTree(t, socket, "tx")
	wait := w.wait
	wait(1, "the watch's tree")

	forks := strings.Fields(e.must("lazyfork tree fork tx -n 2"))
	if len(forks) != 2 {
		t.Fatalf("tree fork printed %v", forks)
	}
	a, b := forks[0], forks[1]
	wait(2, "the daemon's fork event")
	e.must("lazyfork --local tree suspend tx " + a)
	wait(3, "the local suspend, seen in tree.json")
	e.must("lazyfork --local tree protect tx " + b)
	wait(4, "the local protect of "+b)
	e.must("lazyfork --local tree protect tx txr")
	wait(5, "the local protect of the root")

	// Refusals: the same exit status in-process and through the daemon, one line each.
	for _, c := range []struct {
		cmd  string
		code int
		says string
	}{
		{"tree nodes nosuch", 3, "no such tree"},
		{"tree prepare tx " + a, 4, "resume it first"},
		{"tree rollback tx " + b, 4, "nothing earlier to branch from"},
		{"tree set-budget tx --max-live 1", 1, "protected"},
	} {
		for _, mode := range []string{"lazyfork ", "lazyfork --local "} {
			_, errOut, code := e.sh(mode + c.cmd)
			if code != c.code || !strings.Contains(errOut, c.says) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
				t.Errorf("%s%s: exit %d, %q; want exit %d saying %q in one line", mode, c.cmd, code, errOut, c.code, c.says)
			}
		}
	}

	e.must("lazyfork tree resume tx " + a)
	wait(6, "the daemon's resume")
	f := e.must("lazyfork --local tree fork tx " + b)
	wait(8, "the local fork's prepare and fork")
	e.must("lazyfork --local tree prune tx txr")
	msgs := w.end(30*time.Second, "when a local prune removed the tree")
	var got []string
	for _, m := range msgs[1:] {
		if m.Event == nil {
			t.Errorf("watch message without an event: %+v", m)
			continue
		}
		ev := m.Event
		tag := ""
		if ev.External {
			tag = "ext "
			if ev.LatencyNs != 0 {
				t.Errorf("external event with a latency: %+v", ev)
			}
		} else if ev.LatencyNs <= 0 {
			t.Errorf("daemon event without latency: %+v", ev)
		}
		got = append(got, tag+ev.Kind+":"+ev.Node+":"+strings.Join(ev.Nodes, ","))
	}
	want := []string{"fork:" + root + ":" + a + "," + b, "ext suspend:" + a + ":", "ext protect:" + b + ":", "ext protect:" + root + ":",
		"resume:" + a + ":", "ext prepare:" + b + ":", "ext fork:" + b + ":" + f, "ext prune:" + root + ":" + strings.Join(slices.Sorted(slices.Values([]string{root, a, b, f})), ",")}
	if !slices.Equal(got, want) {
		t.Errorf("watched:\n got %v\nwant %v", got, want)
	}
}
