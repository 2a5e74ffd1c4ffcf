package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// daemonTree starts a daemon and, through it, a snapshot tree called name rooted at a
// counter called root (flags: more `tree create` flags). The tree is pruned at the end
// if it is still there.
func (e *env) daemonTree(name, root, flags string) (socket, logPath string) {
	e.t.Helper()
	socket, logPath = e.withDaemon()
	e.must("lazyfork daemon start")
	treeID := e.must(fmt.Sprintf("lazyfork tree create lazyfork/debian:bookworm --name %s --root-name %s %s -- %s", name, root, flags, counter))
	e.t.Cleanup(func() {
		if out, _, _ := e.sh("lazyfork tree ls --json"); strings.Contains(out, treeID) {
			if _, errOut, code := e.sh("lazyfork tree prune " + name + " " + root); code != 0 {
				e.t.Errorf("cleanup prune: %s", errOut)
			}
		}
	})
	return socket, logPath
}

// treeWatch is a client's watch of one tree through the daemon, collecting messages.
type treeWatch struct {
	t    *testing.T
	mu   sync.Mutex
	msgs []client.TreeWatchMessage
	done chan error
}

func watchTree(t *testing.T, socket, tree string) *treeWatch {
	w := &treeWatch{t: t, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		w.done <- client.New(socket).WatchTree(ctx, tree, func(m client.TreeWatchMessage) error {
			w.mu.Lock()
			w.msgs = append(w.msgs, m)
			w.mu.Unlock()
			return nil
		})
	}()
	return w
}

// wait waits until the watch holds n messages (the tree, then events).
func (w *treeWatch) wait(n int, what string) {
	w.t.Helper()
	testutil.Eventually(w.t, 20*time.Second, what, func() bool { w.mu.Lock(); defer w.mu.Unlock(); return len(w.msgs) >= n })
}

// end waits for the watch to end without error (what: the event that ends it) and
// returns every message it got.
func (w *treeWatch) end(timeout time.Duration, what string) []client.TreeWatchMessage {
	w.t.Helper()
	select {
	case err := <-w.done:
		if err != nil {
			w.t.Fatalf("watch: %v", err)
		}
	case <-time.After(timeout):
		w.t.Fatalf("the watch did not end %s", what)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.msgs)
}
