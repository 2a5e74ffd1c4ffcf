// Package snapshot is a snapshot's documents and their store on tmpfs (snapshot.json in
// each snapshot directory, the state lock that orders GC against the pipeline) and the
// image rewrite step (Memfile). It links no CRIU RPC, cgroup, runtime or registry code,
// so lf-memfile and lf-inspect stay small; lib/fork builds the rest of the pipeline on it.
package snapshot

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/resolve"
	"github.com/lazyfork/lazyfork/lib/stage"
)

// NewID returns a fresh snapshot id: s and 12 hex digits.
func NewID() string { return resolve.NewID("s", nil) }

// Save writes snapshot.json into the snapshot directory (atomically). A snapshot whose
// paths are not LazyFork's (stage.CheckSnapshot) is refused before anything is written.
func Save(s *stage.Snapshot) error {
	if err := stage.CheckSnapshot(s); err != nil {
		return fmt.Errorf("save snapshot: %w", err)
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("save snapshot %s: %w", s.ID, err)
	}
	return fsutil.WriteJSON(filepath.Join(s.Dir, "snapshot.json"), s)
}

// LoadSnapshot reads a snapshot by id or directory. A CRIU image directory with no
// snapshot.json is reported as such, so a user pointing a stage at a raw checkpoint learns
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
			return nil, fmt.Errorf("%s is %w (no snapshot.json): pass the JSON printed by lf-dump, or a snapshot id", ref, stage.ErrNoSnapshot)
		}
		return nil, err
	}
	defer f.Close()
	s, err := stage.ReadSnapshot(io.LimitReader(f, maxSnapshotJSON))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "snapshot.json"), err)
	}
	if err := stage.CheckSnapshot(s); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "snapshot.json"), err)
	}
	return s, nil
}

// maxSnapshotJSON bounds a snapshot document read from a file or stdin (real ones are a
// few KiB).
const maxSnapshotJSON = 1 << 20

// Snapshots lists every snapshot on tmpfs, oldest first. A snapshot directory whose
// snapshot.json cannot be read, parsed or trusted is an error, not a gap in the list: GC
// decides what to delete from this list, and a snapshot it cannot read still holds its
// family and layers.
func Snapshots() ([]*stage.Snapshot, error) {
	snaps, _, err := Scan()
	return snaps, err
}

// RemoveSnapshot deletes a snapshot's directory (its image); its family files and frozen
// layer stay as long as something references them (see GC).
func RemoveSnapshot(s *stage.Snapshot) error {
	if err := stage.CheckSnapshot(s); err != nil {
		return fmt.Errorf("remove snapshot: %w", err)
	}
	// A rewrite killed half-way leaves its read-only view of the layers mounted there
	// (Memfile): RemoveAll never crosses a mount point.
	if err := UnmountStackIn(s.Dir); err != nil {
		return fmt.Errorf("remove snapshot %s: %w", s.ID, err)
	}
	// Renamed aside first, in one step: a reader never sees the directory half-removed
	// (without its snapshot.json), which GC would have to take for a corrupt record.
	aside := filepath.Join(paths.Snapshots(), RemovingPrefix+s.ID+"-"+NewID()[1:])
	if err := os.Rename(s.Dir, aside); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("remove snapshot %s: %w", s.ID, err)
	}
	return fsutil.RemoveAll(aside)
}

// UnmountStackIn unmounts the layer stack Memfile mounts in a snapshot directory, if a
// killed rewrite left it there.
func UnmountStackIn(dir string) error {
	root := filepath.Join(dir, "rootfs")
	if !fsutil.IsMountPoint(root) {
		return nil
	}
	if err := unix.Unmount(root, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s: %w", root, err)
	}
	return nil
}

// RemovingPrefix names snapshot directories renamed aside to be deleted.
const RemovingPrefix = ".lf-rm-"

// ReadSnapshotArg reads the snapshot a stage works on: the one named by arg (directory or
// id), the snapshot JSON in the file arg, or, when arg is "" or "-", the snapshot JSON on
// stdin (the previous stage's output).
func ReadSnapshotArg(arg string) (*stage.Snapshot, error) {
	in := io.Reader(os.Stdin)
	if fi, err := os.Stat(arg); err == nil && fi.Mode().IsRegular() {
		f, err := os.Open(arg)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		in = f
	} else if arg != "" && arg != "-" {
		return LoadSnapshot(arg)
	}
	s, err := stage.ReadSnapshot(io.LimitReader(in, maxSnapshotJSON))
	if err != nil {
		return nil, err
	}
	if err := stage.CheckSnapshot(s); err != nil {
		return nil, err
	}
	return s, nil
}
