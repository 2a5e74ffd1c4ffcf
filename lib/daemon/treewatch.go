package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/snaptree"
	"github.com/lazyfork/lazyfork/lib/treedoc"
)

// Mutations other processes make (`lazyfork --local tree ...`, a porcelain run while the
// daemon was starting) reach the daemon's watchers too: the daemon keeps the shape of
// every tree.json as it last saw it (read or saved by its own operations, under the
// tree's lock), and whenever it reads a tree.json it did not write, through inotify on
// the trees directory or at the start of one of its own operations, it publishes the
// difference as the events of the mutations that made it, marked external.

// nodeShape and treeShape are what of a tree.json its events are about.
type nodeShape struct {
	parent, state, from string
	protected           bool
	generation          int
}

type treeShape struct {
	root    string
	budget  snaptree.Budget
	dropped bool
	nodes   map[string]nodeShape
}

func shapeOf(t *snaptree.Tree) *treeShape {
	s := &treeShape{root: t.Root, budget: t.Budget, dropped: t.Dropped, nodes: make(map[string]nodeShape, len(t.Nodes))}
	for id, n := range t.Nodes {
		s.nodes[id] = nodeShape{parent: n.Parent, state: n.State, from: n.From, protected: n.Protected, generation: n.Generation}
	}
	return s
}

// treeDocs is the shape of every tree as the daemon last saw it.
type treeDocs struct {
	mu   sync.Mutex
	seen map[string]*treeShape
}

// sawDoc records tree id's document (nil: removed). One read that is not the daemon's own
// save is compared with the last seen first, and the difference published.
func (s *Service) sawDoc(id string, t *snaptree.Tree, saved bool) {
	d := &s.trees.docs
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen == nil {
		d.seen = map[string]*treeShape{}
	}
	old := d.seen[id]
	if t == nil {
		if old != nil && !saved {
			s.publishExternal(removedEvent(id, old))
		}
		delete(d.seen, id)
		return
	}
	now := shapeOf(t)
	if old != nil && !saved {
		for _, e := range diffShapes(id, old, now) {
			s.publishExternal(e)
		}
	}
	d.seen[id] = now
}

func (s *Service) publishExternal(e client.TreeEvent) {
	e.External, e.Time = true, time.Now().UTC()
	s.publishTreeEvent(e)
}

func removedEvent(id string, old *treeShape) client.TreeEvent {
	var ids []string
	for n := range old.nodes {
		ids = append(ids, n)
	}
	slices.Sort(ids)
	return client.TreeEvent{Kind: "prune", Tree: id, Node: old.root, Nodes: ids}
}

// diffShapes names the mutations that turn old into now, in the order an operation
// emits them: budget, prepare, fork and rollback, resume, suspend, protect, prune, drop.
func diffShapes(id string, old, now *treeShape) []client.TreeEvent {
	var evs []client.TreeEvent
	ev := func(kind, node string, nodes ...string) {
		evs = append(evs, client.TreeEvent{Kind: kind, Tree: id, Node: node, Nodes: nodes})
	}
	if old.budget != now.budget {
		ev("budget", "")
	}
	ids := make([]string, 0, len(now.nodes))
	for n := range now.nodes {
		ids = append(ids, n)
	}
	slices.Sort(ids)
	forks := map[string][]string{}
	var parents []string
	for _, n := range ids {
		nn, on := now.nodes[n], old.nodes[n]
		if _, ok := old.nodes[n]; !ok {
			if nn.from != "" {
				ev("rollback", nn.parent, n)
				continue
			}
			if forks[nn.parent] == nil {
				parents = append(parents, nn.parent)
			}
			forks[nn.parent] = append(forks[nn.parent], n)
			continue
		}
		if nn.generation > on.generation {
			ev("prepare", n)
		}
	}
	for _, p := range parents {
		ev("fork", p, forks[p]...)
	}
	var dropSuspended []string
	for _, n := range ids {
		nn, on := now.nodes[n], old.nodes[n]
		if _, ok := old.nodes[n]; !ok {
			continue
		}
		switch {
		case nn.state == snaptree.StateLive && on.state != snaptree.StateLive:
			ev("resume", n)
		case nn.state == snaptree.StateSuspended && on.state == snaptree.StateLive:
			if now.dropped && !old.dropped {
				dropSuspended = append(dropSuspended, n)
			} else {
				ev("suspend", n)
			}
		}
		if nn.protected != on.protected {
			if nn.protected {
				ev("protect", n)
			} else {
				ev("unprotect", n)
			}
		}
	}
	// Pruned: every node gone, reported once per subtree, under its top.
	var gone []string
	for n := range old.nodes {
		if _, ok := now.nodes[n]; !ok {
			gone = append(gone, n)
		}
	}
	slices.Sort(gone)
	for _, n := range gone {
		if p := old.nodes[n].parent; slices.Contains(gone, p) {
			continue
		}
		var sub []string
		for _, m := range gone {
			for a := m; a != ""; a = old.nodes[a].parent {
				if a == n {
					sub = append(sub, m)
					break
				}
			}
		}
		ev("prune", n, sub...)
	}
	if now.dropped && !old.dropped {
		ev("drop", "", dropSuspended...)
	}
	return evs
}

// watchTreeDocs follows $LAZYFORK_ROOT/trees with inotify until ctx ends: every tree.json
// renamed into place, and every tree directory removed, is read (under the tree's lock)
// and compared with what the daemon saw last. It returns once the watches are set and
// every tree's document is recorded.
func (s *Service) watchTreeDocs(ctx context.Context) error {
	dir := treedoc.TreesDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("watch trees: %w", err)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("watch trees: inotify: %w", err)
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: reads wait in the runtime's poller
	w := &docWatch{s: s, fd: fd, dirs: map[int]string{}}
	if w.top, err = unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_ONLYDIR); err != nil {
		f.Close()
		return fmt.Errorf("watch trees: %s: %w", dir, err)
	}
	w.rescan()
	go func() {
		<-ctx.Done()
		f.Close()
	}()
	go w.loop(f)
	return nil
}

type docWatch struct {
	s    *Service
	fd   int
	top  int
	dirs map[int]string // watch descriptor -> tree id
}

// watchTree adds a watch on tree id's directory (tree.json is renamed into it).
func (w *docWatch) watchTree(id string) {
	wd, err := unix.InotifyAddWatch(w.fd, treedoc.TreeDir(id), unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE|unix.IN_ONLYDIR|unix.IN_DONT_FOLLOW)
	if err == nil {
		w.dirs[wd] = id
	}
}

// rescan watches every tree directory and checks every document (at start, and when the
// kernel's queue overflowed).
func (w *docWatch) rescan() {
	ents, _ := os.ReadDir(treedoc.TreesDir())
	present := map[string]bool{}
	for _, e := range ents {
		if e.IsDir() && treedoc.IDRe.MatchString(e.Name()) {
			present[e.Name()] = true
			w.watchTree(e.Name())
			w.check(e.Name())
		}
	}
	w.s.trees.docs.mu.Lock()
	var gone []string
	for id := range w.s.trees.docs.seen {
		if !present[id] {
			gone = append(gone, id)
		}
	}
	w.s.trees.docs.mu.Unlock()
	for _, id := range gone {
		w.check(id)
	}
}

func (w *docWatch) loop(f *os.File) {
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return // closed: the daemon stops
		}
		changed := map[string]bool{}
		var order []string
		mark := func(id string) {
			if !changed[id] {
				changed[id] = true
				order = append(order, id)
			}
		}
		overflow := false
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 {
				b := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				if i := slices.Index(b, 0); i >= 0 {
					b = b[:i]
				}
				name = string(b)
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
			switch {
			case ev.Mask&unix.IN_Q_OVERFLOW != 0:
				overflow = true
			case ev.Mask&unix.IN_IGNORED != 0:
				delete(w.dirs, int(ev.Wd))
			case int(ev.Wd) == w.top:
				if !treedoc.IDRe.MatchString(name) || ev.Mask&unix.IN_ISDIR == 0 {
					continue
				}
				if ev.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
					w.watchTree(name)
				}
				mark(name)
			case name == "tree.json":
				if id, ok := w.dirs[int(ev.Wd)]; ok {
					mark(id)
				}
			}
		}
		if overflow {
			w.rescan()
			continue
		}
		for _, id := range order {
			w.check(id)
		}
	}
}

// check reads tree id's document under its lock and records it; a tree whose directory
// is gone is recorded as removed once the daemon's own operations in flight are done
// (one of them may be the prune that removed it, and says so itself).
func (w *docWatch) check(id string) {
	// The tree's lock file is opened, never created: one made in a directory a prune is
	// removing would stop its removal.
	lf, err := os.OpenFile(filepath.Join(treedoc.TreeDir(id), ".lock"), os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err == nil {
		defer lf.Close()
		if unix.Flock(int(lf.Fd()), unix.LOCK_EX) != nil {
			return
		}
		if t, err := treedoc.ReadID(id); err == nil {
			w.s.sawDoc(id, t, false)
		}
		return
	}
	if !errors.Is(err, os.ErrNotExist) {
		return
	}
	w.s.trees.mu.Lock()
	defer w.s.trees.mu.Unlock()
	if _, err := os.Stat(treedoc.TreeDir(id)); errors.Is(err, os.ErrNotExist) {
		w.s.sawDoc(id, nil, false)
	}
}
