package fork

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/runtime"
	"github.com/lazyfork/lazyfork/lib/tree"
)

// GC is the reference counting of what forks share. Memory files are kept per family
// while any container or snapshot of the family exists (deleting one a descendant still
// maps breaks its later dumps); frozen layers while any container or snapshot stacks
// on them; snapshots while their source exists or a stopped container restarts from
// them. Records abandoned half-way by a killed command are deleted.
func GC(rt *runtime.Runtime) error {
	unlock, err := rt.Tree.Lock()
	if err != nil {
		return err
	}
	defer unlock()
	all, err := rt.Tree.List()
	if err != nil {
		return err
	}
	var errs []error
	live := map[string]*tree.Container{}
	for _, c := range all {
		if c.State == tree.StateCreating && c.Owner > 0 && unix.Kill(c.Owner, 0) != nil {
			errs = append(errs, rt.Delete(c))
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
	snaps, err := Snapshots()
	if err != nil {
		return err
	}
	for _, s := range snaps {
		abandoned := s.Owner > 0 && unix.Kill(s.Owner, 0) != nil
		if (abandoned || live[s.Source.ID] == nil) && !snapsKept[s.ID] {
			errs = append(errs, RemoveSnapshot(s))
			continue
		}
		families[s.Family] = true
		layers[s.Layer] = true
		for _, l := range s.Lower {
			layers[l] = true
		}
	}
	errs = append(errs, sweep(paths.Families(), families, func(dir string) bool { return families[filepath.Base(dir)] }))
	errs = append(errs, sweep(LayersDir(), layers, func(dir string) bool { return layers[dir] }))
	return errors.Join(errs...)
}

func sweep(parent string, _ map[string]bool, keep func(string) bool) error {
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
