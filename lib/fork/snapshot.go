package fork

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/stage"
)

func newSnapshotID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "s" + hex.EncodeToString(b[:])
}

// Save writes snapshot.json into the snapshot directory (atomically).
func Save(s *stage.Snapshot) error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("save snapshot %s: %w", s.ID, err)
	}
	return fsutil.WriteJSON(filepath.Join(s.Dir, "snapshot.json"), s)
}

// LoadSnapshot reads a snapshot by id or directory. A CRIU image directory with no
// snapshot.json is reported as such, so a user pointing a stage at a raw image learns
// which stage to run first.
func LoadSnapshot(ref string) (*stage.Snapshot, error) {
	dir := ref
	if !filepath.IsAbs(ref) && filepath.Base(ref) == ref {
		if _, err := os.Stat(filepath.Join(paths.Snapshots(), ref)); err == nil {
			dir = filepath.Join(paths.Snapshots(), ref)
		}
	}
	if filepath.Base(dir) == "images" {
		dir = filepath.Dir(dir)
	}
	f, err := os.Open(filepath.Join(dir, "snapshot.json"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s is not a LazyFork snapshot (no snapshot.json): pass the JSON printed by lf-dump, or a snapshot id", ref)
		}
		return nil, err
	}
	defer f.Close()
	return stage.ReadSnapshot(f)
}

// Snapshots lists every snapshot on tmpfs, oldest first.
func Snapshots() ([]*stage.Snapshot, error) {
	ents, err := os.ReadDir(paths.Snapshots())
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []*stage.Snapshot
	for _, e := range ents {
		if s, err := LoadSnapshot(filepath.Join(paths.Snapshots(), e.Name())); err == nil {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// RemoveSnapshot deletes a snapshot's directory (its image); its family files and frozen
// layer stay as long as something references them (see GC).
func RemoveSnapshot(s *stage.Snapshot) error {
	if filepath.Dir(s.Dir) != paths.Snapshots() {
		return fmt.Errorf("remove snapshot %s: %s is not under %s", s.ID, s.Dir, paths.Snapshots())
	}
	return fsutil.RemoveAll(s.Dir)
}

// ReadSnapshotArg reads the snapshot a stage works on: the one named by arg (directory or
// id) or, when arg is empty, the snapshot JSON on stdin (the previous stage's output).
func ReadSnapshotArg(arg string) (*stage.Snapshot, error) {
	if arg != "" {
		return LoadSnapshot(arg)
	}
	return stage.ReadSnapshot(os.Stdin)
}
