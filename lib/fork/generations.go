package fork

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/memfile"
	"github.com/lazyfork/lazyfork/lib/stage"
)

// A family's memory files come in generations: the files one rewrite made are named after
// its snapshot ("<snapshot>-..."). A rebase writes a new generation while older forks
// (and a swapped source) still map the old one; a rebased image names only files of its
// own generation (memfile.Options.Rebase moves every VMA that mapped a family file), so
// an old generation is garbage once its last user goes. The family directory stays
// while any member exists (gc); within it, pruneGenerations removes every file that no
// process maps and no snapshot names. (Files are removed whole, never punched: a packed
// snapshot tree puts back a missing file, but takes one that is there as it is.) A
// family with one generation is left alone (no scan).

// pruneGenerations frees the unused parts of a kept family's older generations. snaps
// are the snapshots GC keeps. The caller holds the state lock exclusively: no dump,
// rewrite or restore runs, so what processes map now is everything that maps a file.
func pruneGenerations(dir string, snaps []*stage.Snapshot) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	gens := map[string]bool{}
	for _, e := range ents {
		if g, _, ok := strings.Cut(e.Name(), "-"); ok {
			gens[g] = true
		}
	}
	if len(gens) < 2 {
		return nil
	}
	// Whatever a snapshot names is kept whole: forks restored from it map any part.
	named := map[string]bool{}
	for _, s := range snaps {
		if s.FamilyDir != dir {
			continue
		}
		refs, err := memfile.ReferencedFiles(s.CheckpointDir)
		if err != nil {
			return fmt.Errorf("prune %s: snapshot %s: %w", dir, s.ID, err)
		}
		for _, r := range refs {
			named[r] = true
		}
	}
	byIno := map[uint64]string{}
	var dev uint64
	for _, e := range ents {
		if !e.Type().IsRegular() || named[e.Name()] {
			continue
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, e.Name()), &st); err != nil {
			return fmt.Errorf("prune %s: %w", dir, err)
		}
		byIno[st.Ino], dev = e.Name(), st.Dev
	}
	if len(byIno) == 0 {
		return nil
	}
	used, err := mappedFiles(dev, byIno)
	if err != nil {
		return fmt.Errorf("prune %s: %w", dir, err)
	}
	var errs []error
	for _, name := range byIno {
		path := filepath.Join(dir, name)
		if !used[name] {
			errs = append(errs, os.Remove(path))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("prune %s: %w", dir, err)
	}
	return nil
}

// mappedFiles reads every process's mappings and returns which files of byIno (on device
// dev) any of them maps.
func mappedFiles(dev uint64, byIno map[uint64]string) (map[string]bool, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	want := fmt.Sprintf("%02x:%02x", unix.Major(dev), unix.Minor(dev))
	used := map[string]bool{}
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		f, err := os.Open(filepath.Join("/proc", p.Name(), "maps"))
		if err != nil {
			continue // gone
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// start-end perms offset dev inode [path]
			fs := strings.Fields(sc.Text())
			if len(fs) < 5 || fs[3] != want {
				continue
			}
			if ino, err := strconv.ParseUint(fs[4], 10, 64); err == nil && byIno[ino] != "" {
				used[byIno[ino]] = true
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil && !errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("read /proc/%s/maps: %w", p.Name(), err)
		}
	}
	return used, nil
}
