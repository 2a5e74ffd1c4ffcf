package fork

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/snapshot"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/trace"
	"github.com/lazyfork/lazyfork/lib/treedoc"
)

// GCLockWait bounds how long GC waits for dumps, rewrites and restores in progress to
// release the state lock before it gives up (it never deletes under them).
var GCLockWait = 30 * time.Second

// GC is the reference counting of what forks share. Memory files are kept per family
// while any container or snapshot of the family exists (deleting one a descendant still
// maps breaks its later dumps); frozen layers while any container or snapshot stacks
// on them; snapshots while their source exists or a stopped container restarts from
// them. Records abandoned half-way by a killed command are deleted.
//
// GC reads every record before it deletes anything, and stops with an error, deleting
// nothing, when one cannot be read, parsed or trusted: a record it cannot read may be the
// only reference to a family or a layer. It holds the state lock exclusively, so it never
// runs while a dump, rewrite or restore is making things no record references yet.
func GC(rt *container.Runtime) error { return gc(context.Background(), rt, GCLockWait) }

// Collect is GC after an operation (a fork, a start, a delete): when a dump, rewrite or
// restore holds the state lock it returns nil at once instead of waiting, and the garbage
// waits for the next collection (that operation's, the next delete's, `lazyfork gc`).
func Collect(rt *container.Runtime) error { return collectCtx(context.Background(), rt) }

func collectCtx(ctx context.Context, rt *container.Runtime) error {
	if err := gc(ctx, rt, time.Nanosecond); err != nil && !errors.Is(err, ErrStateBusy) {
		return err
	}
	return nil
}

// collect is Collect timed (trace), its error dropped as after every operation.
func collect(ctx context.Context, rt *container.Runtime) {
	ctx, end := trace.Start(ctx, "collect garbage")
	defer end()
	_ = collectCtx(ctx, rt)
}

func gc(ctx context.Context, rt *container.Runtime, wait time.Duration) error {
	endRead := trace.Step(ctx, "gc: locks, read every record and snapshot")
	defer func() { endRead() }()
	unlockState, err := LockState(context.Background(), true, wait)
	if err != nil {
		return fmt.Errorf("gc: %w", err)
	}
	defer unlockState()
	unlock, err := rt.Containers.Lock()
	if err != nil {
		return fmt.Errorf("gc: %w", err)
	}
	defer unlock()
	all, halfWritten, err := listRecords(rt.Containers)
	if err != nil {
		return fmt.Errorf("gc: %w (nothing was deleted; fix or remove that record by hand)", err)
	}
	snaps, leftovers, err := scanSnapshots()
	if err != nil {
		return fmt.Errorf("gc: %w (nothing was deleted; fix or remove that snapshot by hand)", err)
	}
	live := map[string]*store.Container{}
	var abandoned []*store.Container
	for _, c := range all {
		if c.State == store.StateCreating && c.Owner > 0 && unix.Kill(c.Owner, 0) != nil {
			// Deleting kills its cgroup and removes its directories: only if they are ours.
			if err := stage.CheckRecord(c); err != nil {
				return fmt.Errorf("gc: abandoned record %s: %w (nothing was deleted)", c.ID, err)
			}
			abandoned = append(abandoned, c)
			continue
		}
		live[c.ID] = c
	}
	families, layers, snapsKept := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, c := range live {
		families[c.Family] = true
		for _, l := range c.Lower {
			layers[l] = true
		}
		if c.Snapshot != "" {
			snapsKept[c.Snapshot] = true
		}
	}
	var drop []*stage.Snapshot
	for _, s := range snaps {
		gone := s.Owner > 0 && unix.Kill(s.Owner, 0) != nil
		if (gone || live[s.Source.ID] == nil) && !snapsKept[s.ID] {
			drop = append(drop, s)
			continue
		}
		families[s.Family] = true
		layers[s.Layer] = true
		for _, l := range s.Lower {
			layers[l] = true
		}
	}

	endRead()
	endRead = func() {}
	defer trace.Step(ctx, "gc: delete what nothing references")()
	var errs []error
	for _, c := range abandoned {
		errs = append(errs, rt.Delete(c))
	}
	var parents []string
	for _, s := range drop {
		if c := live[s.Source.ID]; s.Swap && c != nil {
			// A swap whose process died: give the source back or finish ending the old one.
			errs = append(errs, recoverSwap(rt, c, s))
			for _, l := range c.Lower {
				layers[l] = true
			}
		} else {
			// A swap whose source was deleted since: only the new source's group can be
			// left, under the runtime's parent or, for a tree member, its tree's. Or a dump
			// for a swap that died before it recorded the swap: the new source's group,
			// made while the source ran (swapReady), may be left.
			if parents == nil {
				parents = groupParents(rt) // read once per GC: it reads every tree's document
			}
			for _, parent := range parents {
				errs = append(errs, endGroupNamed(parent, s.Source.ID+"-"+s.ID))
			}
		}
		errs = append(errs, RemoveSnapshot(s))
	}
	for _, d := range leftovers {
		errs = append(errs, snapshot.UnmountStackIn(d), fsutil.RemoveAll(d))
	}
	for _, d := range halfWritten {
		errs = append(errs, fsutil.RemoveAll(d))
	}
	errs = append(errs, sweep(paths.Families(), func(dir string) bool { return families[filepath.Base(dir)] }))
	var kept []*stage.Snapshot
	for _, s := range snaps {
		if !slices.Contains(drop, s) {
			kept = append(kept, s)
		}
	}
	for fam := range families {
		if fam != "" {
			errs = append(errs, pruneGenerations(filepath.Join(paths.Families(), fam), kept))
		}
	}
	errs = append(errs, sweep(LayersDir(), func(dir string) bool { return layers[dir] }))
	return errors.Join(errs...)
}

var recordDirRe = regexp.MustCompile(`^[0-9a-f]{12}$`)

// maxRecord bounds a container.json (real ones are a few KiB).
const maxRecord = 1 << 20

// listRecords is store.List that fails instead of skipping a record it cannot read. A
// directory whose container.json is missing is given a moment (a delete may be removing
// it right now) before it counts as unreadable, unless all it holds is a record's pending
// temp file and nothing is mounted there: a reservation killed while writing its record
// (reservations hold the store lock, as GC does, so none is in progress), returned in
// halfWritten for GC to remove.
func listRecords(s *store.Store) (out []*store.Container, halfWritten []string, err error) {
	ents, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil, nil, fmt.Errorf("list containers: %w", err)
	}
	for _, e := range ents {
		if !recordDirRe.MatchString(e.Name()) {
			continue
		}
		if !e.IsDir() {
			return nil, nil, fmt.Errorf("container record %s is not a directory", filepath.Join(s.Dir, e.Name()))
		}
		c, err := readRecord(s, e.Name())
		if errors.Is(err, os.ErrNotExist) {
			if isHalfWritten(s.Path(e.Name())) {
				halfWritten = append(halfWritten, s.Path(e.Name()))
				continue
			}
			c, err = waitRecordGone(s, e.Name())
			if c == nil && err == nil {
				continue
			}
		}
		if err != nil {
			return nil, nil, err
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, halfWritten, nil
}

// pendingRecordRe names renameio's temp file for container.json.
var pendingRecordRe = regexp.MustCompile(`^\.container\.json[0-9]*$`)

func isHalfWritten(dir string) bool {
	ents, err := os.ReadDir(dir)
	if err != nil || len(fsutil.MountsUnder(dir)) > 0 {
		return false
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || !pendingRecordRe.MatchString(e.Name()) {
			return false
		}
	}
	return true
}

func readRecord(s *store.Store, id string) (*store.Container, error) {
	path := filepath.Join(s.Path(id), "container.json")
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("read container record %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxRecord+1))
	if err != nil {
		return nil, fmt.Errorf("read container record %s: %w", path, err)
	}
	if len(b) > maxRecord {
		return nil, fmt.Errorf("read container record %s: larger than %d bytes", path, maxRecord)
	}
	var c store.Container
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("parse container record %s: %w", path, err)
	}
	if c.Version != store.RecordVersion {
		return nil, fmt.Errorf("container record %s: version %d not supported (want %d)", path, c.Version, store.RecordVersion)
	}
	if c.ID != id {
		return nil, fmt.Errorf("container record %s: names id %q", path, c.ID)
	}
	return &c, nil
}

// waitRecordGone waits briefly for a directory without container.json to disappear (nil,
// nil) or to get its record; after that it is an error.
func waitRecordGone(s *store.Store, id string) (*store.Container, error) {
	var err error
	for i := 0; i < 20; i++ {
		time.Sleep(50 * time.Millisecond)
		if _, serr := os.Lstat(s.Path(id)); errors.Is(serr, os.ErrNotExist) {
			return nil, nil
		}
		var c *store.Container
		if c, err = readRecord(s, id); err == nil {
			return c, nil
		}
	}
	return nil, err
}

func sweep(parent string, keep func(string) bool) error {
	ents, err := os.ReadDir(parent)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	var errs []error
	for _, e := range ents {
		dir := filepath.Join(parent, e.Name())
		if !keep(dir) {
			errs = append(errs, fsutil.RemoveAll(dir))
		}
	}
	return errors.Join(errs...)
}

// FamilyBytes is the RAM a family's memory files hold on tmpfs.
func FamilyBytes(family string) int64 {
	return allocatedPages(filepath.Join(paths.Families(), family)) * 4096
}

// groupParents are the parents containers' groups are made under: the runtime's, and
// every snapshot tree's members' (lib/snaptree).
func groupParents(rt *container.Runtime) []string {
	out := []string{rt.CgroupParent}
	trees, _ := treedoc.ReadAll()
	for _, t := range trees {
		if cg, err := cgroup.LoadOwned(t.Cgroup); err == nil {
			out = append(out, cgroup.ParentFor(cg))
		}
	}
	return out
}
