package snaptree

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/memfile"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/treedoc"
)

// pack copies snapshot s (on tmpfs) and every memory file it needs to the tree's
// directory on disk and returns the entry describing them. Memory files are stored once
// per tree (they never change once written). Nothing on tmpfs is removed here.
func pack(t *Tree, n *Node, s *stage.Snapshot, role string) (Packed, error) {
	files, err := memfile.ReferencedFiles(s.CheckpointDir)
	if err != nil {
		return Packed{}, fmt.Errorf("pack %s: %w", s.ID, err)
	}
	p := Packed{Snapshot: s.ID, Role: role, Family: s.Family, Files: files,
		Dir: filepath.Join(t.Dir(), "nodes", n.ID, s.ID)}
	if err := treedoc.CheckPacked(t, n, p); err != nil {
		return Packed{}, fmt.Errorf("pack %s: %w", s.ID, err)
	}
	if err := os.MkdirAll(filepath.Dir(p.Dir), 0o700); err != nil {
		return Packed{}, fmt.Errorf("pack %s: %w", s.ID, err)
	}
	// Built beside its final place and renamed in: a packed dir is whole or absent.
	tmp := p.Dir + ".lf-tmp"
	_ = fsutil.RemoveAll(tmp)
	if err := copyInto(tmp, s.Dir); err != nil {
		_ = fsutil.RemoveAll(tmp)
		return Packed{}, fmt.Errorf("pack %s: %w", s.ID, err)
	}
	// Its frozen layer (the upper at the dump, which forks of it stack on) lies on disk
	// already, but GC removes it once no snapshot on tmpfs names it: it goes with the
	// pack, moved when only this snapshot uses it (a stop's), copied when containers
	// stack on it too (a keyframe's).
	if s.Layer != "" {
		if _, err := os.Lstat(s.Layer); err == nil {
			var err error
			if role == RoleSuspend {
				err = os.Rename(s.Layer, filepath.Join(tmp, "layer"))
			} else {
				err = copyInto(filepath.Join(tmp, "layer"), s.Layer)
			}
			if err != nil {
				_ = fsutil.RemoveAll(tmp)
				return Packed{}, fmt.Errorf("pack %s: layer: %w", s.ID, err)
			}
		}
	}
	_ = fsutil.RemoveAll(p.Dir)
	if err := os.Rename(tmp, p.Dir); err != nil {
		_ = fsutil.RemoveAll(tmp)
		return Packed{}, fmt.Errorf("pack %s: %w", s.ID, err)
	}
	store := t.StoreDir(s.Family)
	if err := os.MkdirAll(store, 0o700); err != nil {
		return Packed{}, fmt.Errorf("pack %s: %w", s.ID, err)
	}
	for _, f := range files {
		if _, err := os.Lstat(filepath.Join(store, f)); err == nil {
			continue
		}
		if err := packFile(store, f, filepath.Join(s.FamilyDir, f)); err != nil {
			return Packed{}, fmt.Errorf("pack %s: memory file %s: %w", s.ID, f, err)
		}
	}
	p.Bytes = diskBytes(p.Dir)
	return p, nil
}

// unpack puts packed snapshot p back on tmpfs (its directory and any memory file missing
// from its family) and returns it, checked. A snapshot still on tmpfs is used as it is.
func unpack(ctx context.Context, t *Tree, p Packed) (*stage.Snapshot, error) {
	unlock, err := fork.LockState(ctx, false, 0)
	if err != nil {
		return nil, err
	}
	defer unlock()
	dir := filepath.Join(paths.Snapshots(), p.Snapshot)
	if _, err := os.Stat(filepath.Join(dir, "snapshot.json")); err != nil {
		if err := os.MkdirAll(paths.Snapshots(), 0o700); err != nil {
			return nil, fmt.Errorf("unpack %s: %w", p.Snapshot, err)
		}
		tmp := filepath.Join(paths.Snapshots(), ".lf-rm-unpack-"+p.Snapshot)
		_ = fsutil.RemoveAll(tmp)
		if err := copyInto(tmp, p.Dir); err != nil {
			_ = fsutil.RemoveAll(tmp)
			return nil, fmt.Errorf("unpack %s from %s: %w", p.Snapshot, p.Dir, err)
		}
		if err := os.Rename(tmp, dir); err != nil {
			_ = fsutil.RemoveAll(tmp)
			return nil, fmt.Errorf("unpack %s: %w", p.Snapshot, err)
		}
	}
	s, err := fork.LoadSnapshot(dir)
	if err != nil {
		return nil, fmt.Errorf("unpack %s: %w", p.Snapshot, err)
	}
	if s.ID != p.Snapshot || s.Family != p.Family {
		return nil, fmt.Errorf("unpack %s: snapshot.json names %s of family %s", p.Snapshot, s.ID, s.Family)
	}
	if layer := filepath.Join(p.Dir, "layer"); s.Layer != "" {
		if _, err := os.Lstat(s.Layer); errors.Is(err, os.ErrNotExist) {
			if err := os.MkdirAll(filepath.Dir(s.Layer), 0o700); err != nil {
				return nil, fmt.Errorf("unpack %s: %w", p.Snapshot, err)
			}
			tmp := s.Layer + ".lf-tmp"
			_ = fsutil.RemoveAll(tmp)
			if err := copyInto(tmp, layer); err != nil {
				_ = fsutil.RemoveAll(tmp)
				return nil, fmt.Errorf("unpack %s: layer: %w", p.Snapshot, err)
			}
			if err := os.Rename(tmp, s.Layer); err != nil {
				return nil, fmt.Errorf("unpack %s: layer: %w", p.Snapshot, err)
			}
		}
	}
	if err := fork.MakeFamilyDir(s.FamilyDir); err != nil {
		return nil, fmt.Errorf("unpack %s: %w", p.Snapshot, err)
	}
	for _, f := range p.Files {
		dst := filepath.Join(s.FamilyDir, f)
		if _, err := os.Lstat(dst); err == nil {
			continue
		}
		if err := unpackFile(dst, t.StoreDir(p.Family), f); err != nil {
			return nil, fmt.Errorf("unpack %s: memory file %s: %w", p.Snapshot, f, err)
		}
	}
	return s, nil
}

// dropPacked deletes a packed snapshot's directory and forgets it.
func dropPacked(t *Tree, n *Node, snap string) error {
	var errs []error
	keep := n.Packed[:0]
	for _, p := range n.Packed {
		if p.Snapshot == snap {
			errs = append(errs, fsutil.RemoveAll(p.Dir))
			continue
		}
		keep = append(keep, p)
	}
	n.Packed = keep
	return errors.Join(errs...)
}

// sweepStore deletes packed memory files no packed snapshot of the tree needs.
func sweepStore(t *Tree) error {
	need := map[string]bool{}
	for _, n := range t.Nodes {
		for _, p := range n.Packed {
			for _, f := range p.Files {
				need[filepath.Join(p.Family, f)] = true
			}
		}
	}
	base := filepath.Join(t.Dir(), "families")
	fams, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, fam := range fams {
		files, _ := os.ReadDir(filepath.Join(base, fam.Name()))
		left := 0
		for _, f := range files {
			if need[filepath.Join(fam.Name(), strings.TrimSuffix(f.Name(), ".map"))] {
				left++
				continue
			}
			errs = append(errs, os.Remove(filepath.Join(base, fam.Name(), f.Name())))
		}
		if left == 0 {
			errs = append(errs, fsutil.RemoveAll(filepath.Join(base, fam.Name())))
		}
	}
	return errors.Join(errs...)
}

// FreeFamily deletes from tmpfs the memory files of family that nothing needs there any
// more: no process of any container maps them and no snapshot on tmpfs references them
// (a suspended node's are packed on disk, and come back with it). It holds the state lock
// exclusively, so no dump, rewrite or restore is using the family meanwhile. It returns
// the bytes freed. When a snapshot's references cannot be read, nothing is deleted.
func FreeFamily(ctx context.Context, rt *container.Runtime, family string) (int64, error) {
	if !treedoc.SnapIDRe.MatchString(family) {
		return 0, fmt.Errorf("free family %q: bad id", family)
	}
	unlock, err := fork.LockState(ctx, true, fork.GCLockWait)
	if err != nil {
		return 0, fmt.Errorf("free family %s: %w", family, err)
	}
	defer unlock()
	dir := filepath.Join(paths.Families(), family)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("free family %s: %w", family, err)
	}
	keep := map[string]bool{}
	snaps, err := fork.Snapshots()
	if err != nil {
		return 0, fmt.Errorf("free family %s: %w (nothing deleted)", family, err)
	}
	for _, s := range snaps {
		if s.Family != family {
			continue
		}
		refs, err := memfile.ReferencedFiles(s.CheckpointDir)
		if err != nil {
			return 0, fmt.Errorf("free family %s: snapshot %s: %w (nothing deleted)", family, s.ID, err)
		}
		for _, f := range refs {
			keep[f] = true
		}
	}
	mapped, err := mappedInodes(rt, family)
	if err != nil {
		return 0, fmt.Errorf("free family %s: %w (nothing deleted)", family, err)
	}
	var freed int64
	var errs []error
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".mem") || keep[e.Name()] {
			continue
		}
		var st unix.Stat_t
		p := filepath.Join(dir, e.Name())
		if err := unix.Lstat(p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		if mapped[inode{uint64(st.Dev), st.Ino}] {
			continue
		}
		if err := os.Remove(p); err != nil {
			errs = append(errs, err)
			continue
		}
		freed += st.Blocks * 512
	}
	return freed, errors.Join(errs...)
}

type inode struct{ dev, ino uint64 }

// mappedInodes is every file mapped by a process of a container of family (from
// /proc/<pid>/maps, which names device and inode whatever the mount namespace).
func mappedInodes(rt *container.Runtime, family string) (map[inode]bool, error) {
	all, err := rt.Containers.List()
	if err != nil {
		return nil, err
	}
	out := map[inode]bool{}
	for _, c := range all {
		if c.Family != family {
			continue
		}
		cg, err := container.Cgroup(c)
		if err != nil {
			continue // no group: no process
		}
		pids, err := cg.Procs()
		if err != nil {
			return nil, err
		}
		for _, pid := range pids {
			if err := addMaps(out, pid); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ESRCH) {
				return nil, err
			}
		}
	}
	return out, nil
}

func addMaps(out map[inode]bool, pid int) error {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 || fs[4] == "0" {
			continue
		}
		maj, min, ok := strings.Cut(fs[3], ":")
		if !ok {
			continue
		}
		mj, err1 := strconv.ParseUint(maj, 16, 32)
		mn, err2 := strconv.ParseUint(min, 16, 32)
		ino, err3 := strconv.ParseUint(fs[4], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		out[inode{unix.Mkdev(uint32(mj), uint32(mn)), ino}] = true
	}
	return sc.Err()
}

// copyInto copies directory src to dst (which must not exist), sparse files staying
// sparse, modes kept.
func copyInto(dst, src string) error {
	out, err := exec.Command("cp", "-a", "--sparse=always", "--no-target-directory", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cp %s: %v: %s", src, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// A memory file is packed as two files: <name> holds its data extents back to back and
// <name>.map (JSON) their offsets and the file's apparent size. Anonymous memory files
// are 128 TiB sparse files whose data sits at its virtual address, beyond what a disk
// file system allows in one file.
type extentMap struct {
	Size    int64      `json:"size"`
	Mode    uint32     `json:"mode"`
	Extents [][2]int64 `json:"extents"` // offset, length
}

// packFile writes memory file src into store as name and name.map, through temp names.
func packFile(store, name, src string) error {
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	return writeThrough(filepath.Join(store, name), func(out *os.File) error {
		m := extentMap{Size: fi.Size(), Mode: uint32(fi.Mode().Perm()), Extents: [][2]int64{}}
		buf := make([]byte, 1<<20)
		var at int64
		err := memfile.DataExtents(int(in.Fd()), 0, fi.Size(), func(data, hole int64) error {
			if err := copyRange(out, at, in, data, hole-data, buf); err != nil {
				return fmt.Errorf("pack %s: %w", src, err)
			}
			m.Extents = append(m.Extents, [2]int64{data, hole - data})
			at += hole - data
			return nil
		})
		if err != nil {
			return err
		}
		// The map before the data's final name: a packed file is whole once it has both.
		return fsutil.WriteJSON(filepath.Join(store, name+".map"), &m)
	})
}

// writeThrough writes dst through a temp name beside it (created anew, no symlink
// followed): fill writes the file, which takes dst's name only once fill and the close
// succeeded; otherwise the temp name is removed.
func writeThrough(dst string, fill func(out *os.File) error) (retErr error) {
	tmp := filepath.Join(filepath.Dir(dst), ".lf-tmp-"+filepath.Base(dst))
	_ = os.Remove(tmp)
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		out.Close()
		if retErr != nil {
			_ = os.Remove(tmp)
		}
	}()
	if err := fill(out); err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// unpackFile rebuilds memory file dst from store's name and name.map.
func unpackFile(dst, store, name string) error {
	var m extentMap
	if err := fsutil.ReadJSON(filepath.Join(store, name+".map"), &m); err != nil {
		return err
	}
	in, err := os.OpenFile(filepath.Join(store, name), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	return writeThrough(dst, func(out *os.File) error {
		if err := out.Truncate(m.Size); err != nil {
			return err
		}
		buf := make([]byte, 1<<20)
		var at int64
		for _, e := range m.Extents {
			if e[0] < 0 || e[1] < 0 || e[0]+e[1] > m.Size {
				return fmt.Errorf("unpack %s: extent %v outside its size %d", name, e, m.Size)
			}
			if err := copyRange(out, e[0], in, at, e[1], buf); err != nil {
				return fmt.Errorf("unpack %s: %w", name, err)
			}
			at += e[1]
		}
		return out.Chmod(os.FileMode(m.Mode) & 0o777)
	})
}

// copyRange copies n bytes from in at inOff to out at outOff.
func copyRange(out *os.File, outOff int64, in *os.File, inOff, n int64, buf []byte) error {
	for n > 0 {
		k, err := in.ReadAt(buf[:min(int64(len(buf)), n)], inOff)
		if k > 0 {
			if _, err := out.WriteAt(buf[:k], outOff); err != nil {
				return err
			}
			inOff, outOff, n = inOff+int64(k), outOff+int64(k), n-int64(k)
		}
		if err != nil && k == 0 {
			return err
		}
	}
	return nil
}

// diskBytes is the physical size of everything under dir (allocated blocks).
func diskBytes(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// familyFileBytes is the physical size of the named files of a family directory.
func familyFileBytes(dir string, names []string) int64 {
	var n int64
	for _, f := range names {
		var st unix.Stat_t
		if unix.Lstat(filepath.Join(dir, f), &st) == nil {
			n += st.Blocks * 512
		}
	}
	return n
}
