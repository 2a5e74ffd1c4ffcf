// Package image is LazyFork's image store. An image is a list of unpacked layer
// directories that containers stack as read-only overlayfs lower dirs, plus the few
// config fields a container needs (env, command, working dir). Layers are unpacked once
// and shared by every image and container that uses them.
//
// On disk, under Store.Dir:
//
//	layers/<id>/          one unpacked layer (id = hex of its diff ID, or random for dirs)
//	layers/.tmp-*/        a layer being built (stale ones are removed by Open)
//	refs/<name>.json      one Image record per name ("/" spelled "+")
//	locks/<name>.lock     serialises work on one name
//	lock                  shared by writers, exclusive while layers are deleted
package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/exitcode"
	"github.com/lazyfork/lazyfork/lib/fsutil"
)

// DefaultName is the local name of the image built from Debian packages by BuildDefault.
const DefaultName = "lazyfork/debian:bookworm"

// aliases are short local names for images that have a longer canonical name.
var aliases = map[string]string{
	"debian-python": DefaultName,
}

// Sources of an image.
const (
	SourceRegistry      = "registry"
	SourceOCILayout     = "oci-layout"
	SourceDockerArchive = "docker-archive"
	SourceDirectory     = "directory"
)

// ErrNotFound is wrapped by Resolve and Remove when a name is not in the store.
var ErrNotFound = exitcode.NewNotFound("not in the local image store")

// Store is an image store rooted at Dir (normally paths.Images()).
type Store struct {
	Dir string
	// MaxLayerBytes bounds what one image may unpack to, as the operator wrote it (the
	// main's --max-layer-bytes, which kong fills from $LAZYFORK_MAX_LAYER_BYTES; see
	// ParseBytes): "" = DefaultMaxBytes, "0" or "none" = no bound. It is read when an image
	// is unpacked, so a bad value fails that pull with a message naming the setting.
	MaxLayerBytes string
}

// Image is the record of one stored image.
type Image struct {
	Name       string   `json:"name"`   // normalized reference or local name
	Digest     string   `json:"digest"` // manifest digest (config digest for docker archives), or sha256 of a dir image's layer list
	Layers     []string `json:"layers"` // absolute paths of unpacked layer dirs, bottom first
	Env        []string `json:"env"`
	Cmd        []string `json:"cmd"`
	Entrypoint []string `json:"entrypoint"`
	WorkingDir string   `json:"working_dir"`
	User       string   `json:"user,omitempty"`
	Source     string   `json:"source"` // one of the Source* constants
	Size       int64    `json:"size"`   // bytes of regular files, unpacked
}

// Open opens (creating if needed) the store at dir and removes temp dirs left by
// builds that crashed.
func Open(dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open image store %s: %w", dir, err)
	}
	s := &Store{Dir: abs}
	for _, d := range []string{s.layersDir(), s.refsDir(), s.locksDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("open image store: %w", err)
		}
	}
	if err := s.cleanStaleTemps(); err != nil {
		return nil, fmt.Errorf("open image store: %w", err)
	}
	return s, nil
}

func (s *Store) layersDir() string { return filepath.Join(s.Dir, "layers") }
func (s *Store) refsDir() string   { return filepath.Join(s.Dir, "refs") }
func (s *Store) locksDir() string  { return filepath.Join(s.Dir, "locks") }

// safeName maps an image name to a file name. Reference names never contain "+", so
// spelling "/" as "+" is reversible; over-long names fall back to a hash.
func safeName(n string) string {
	f := strings.ReplaceAll(n, "/", "+")
	if len(f) > 200 || strings.HasPrefix(f, ".") || strings.ContainsRune(f, 0) {
		sum := sha256.Sum256([]byte(n))
		return "sha256-" + hex.EncodeToString(sum[:])
	}
	return f
}

func (s *Store) refPath(n string) string { return filepath.Join(s.refsDir(), safeName(n)+".json") }

// candidates lists the names ref may be stored under, most specific first.
func candidates(ref string) []string {
	var out []string
	add := func(n string) {
		for _, o := range out {
			if o == n {
				return
			}
		}
		out = append(out, n)
	}
	if a, ok := aliases[ref]; ok {
		add(a)
	}
	add(ref)
	if r, err := name.ParseReference(ref); err == nil {
		add(r.Name())
	}
	return out
}

// canonical is the name a ref is stored under when it is fetched or built.
func canonical(ref string) string {
	if a, ok := aliases[ref]; ok {
		return a
	}
	if ref == DefaultName {
		return ref
	}
	if r, err := name.ParseReference(ref); err == nil {
		return r.Name()
	}
	return ref
}

// Resolve looks ref up in the store only. ref may be a local name, an alias or any
// spelling of a registry reference ("alpine" finds index.docker.io/library/alpine:latest).
func (s *Store) Resolve(ref string) (*Image, error) {
	for _, n := range candidates(ref) {
		img, err := s.readRef(n)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, l := range img.Layers {
			if _, err := os.Stat(l); err != nil {
				return nil, fmt.Errorf("resolve image %s: layer %s is missing; remove the image and get it again", img.Name, l)
			}
		}
		return img, nil
	}
	return nil, notFound(ref)
}

func notFound(ref string) error {
	if canonical(ref) == DefaultName {
		return fmt.Errorf("image %s: %w; build it with `lazyfork image build-default` (or scripts/build-default-image.sh)", ref, ErrNotFound)
	}
	return fmt.Errorf("image %s: %w; get it with `lazyfork create %s` (a registry reference, an OCI layout directory or a `docker save` tarball)", ref, ErrNotFound, ref)
}

func (s *Store) readRef(n string) (*Image, error) {
	var img Image
	if err := fsutil.ReadJSON(s.refPath(n), &img); err != nil {
		return nil, err
	}
	if img.Name != n {
		// A hashed file name could in theory collide; never return another image.
		return nil, os.ErrNotExist
	}
	return &img, nil
}

func (s *Store) writeRef(img *Image) error {
	// Empty lists, not null, so JSON readers need no special case.
	for _, l := range []*[]string{&img.Env, &img.Cmd, &img.Entrypoint} {
		if *l == nil {
			*l = []string{}
		}
	}
	return fsutil.WriteJSON(s.refPath(img.Name), img)
}

// List returns every stored image, sorted by name.
func (s *Store) List() ([]Image, error) {
	ents, err := os.ReadDir(s.refsDir())
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	var out []Image
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") || !strings.HasSuffix(e.Name(), ".json") {
			continue // renameio's pending files
		}
		var img Image
		if err := fsutil.ReadJSON(filepath.Join(s.refsDir(), e.Name()), &img); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("list images: %w", err)
		}
		out = append(out, img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// ErrInUse is wrapped by Remove's error when a container or snapshot still needs the
// image's layers.
var ErrInUse = errors.New("image still in use")

// UsersFunc names the containers and snapshots that need any of layers (absolute layer
// dirs) or were made from the image named name; an error stops the removal.
type UsersFunc func(name string, layers []string) ([]string, error)

// Remove deletes the image record named name and every layer no other image uses.
// It refuses while one of the image's layers is part of a mounted overlay. The store
// does not know about stopped containers or snapshots: use RemoveUnused.
func (s *Store) Remove(ref string) error { return s.RemoveUnused(ref, nil) }

// RemoveUnused is Remove that first asks users (under the store's exclusive lock, so no
// Get races it) who still needs the layers that would be deleted, and refuses with
// ErrInUse, naming them, if anyone does.
func (s *Store) RemoveUnused(ref string, users UsersFunc) error {
	img, err := s.Resolve(ref)
	if err != nil && errors.Is(err, ErrNotFound) {
		return fmt.Errorf("remove image: %w", err)
	}
	if err != nil {
		// A damaged record (missing layer) can still be removed.
		img = nil
		for _, n := range candidates(ref) {
			if i, e := s.readRef(n); e == nil {
				img = i
				break
			}
		}
		if img == nil {
			return fmt.Errorf("remove image: %w", err)
		}
	}
	lk, err := s.lockStore(context.Background(), unix.LOCK_EX)
	if err != nil {
		return fmt.Errorf("remove image %s: %w", img.Name, err)
	}
	defer lk.unlock()

	mounted, err := mountedLowerDirs()
	if err != nil {
		return fmt.Errorf("remove image %s: %w", img.Name, err)
	}
	if users != nil {
		gone, err := s.onlyLayersOf(img)
		if err != nil {
			return fmt.Errorf("remove image %s: %w", img.Name, err)
		}
		who, err := users(img.Name, gone)
		if err != nil {
			return fmt.Errorf("remove image %s: %w", img.Name, err)
		}
		if len(who) > 0 {
			return fmt.Errorf("remove image %s: %w by %s; delete them first (lazyfork delete)", img.Name, ErrInUse, strings.Join(who, ", "))
		}
	}
	for _, l := range img.Layers {
		if mounted[l] {
			return fmt.Errorf("remove image %s: layer %s is in use by a mounted overlay; stop its containers first", img.Name, l)
		}
	}
	if err := os.Remove(s.refPath(img.Name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove image %s: %w", img.Name, err)
	}
	// Sweep every unreferenced layer, which also collects layers orphaned when a name
	// was re-imported with new content.
	if err := s.sweepLayers(nil, mounted); err != nil {
		return fmt.Errorf("remove image %s: %w", img.Name, err)
	}
	return nil
}

// onlyLayersOf lists img's layers that no other image uses: those its removal deletes.
func (s *Store) onlyLayersOf(img *Image) ([]string, error) {
	imgs, err := s.List()
	if err != nil {
		return nil, err
	}
	other := map[string]bool{}
	for _, o := range imgs {
		if o.Name == img.Name {
			continue
		}
		for _, l := range o.Layers {
			other[l] = true
		}
	}
	var out []string
	for _, l := range img.Layers {
		if !other[l] {
			out = append(out, l)
		}
	}
	return out, nil
}

// sweepLayers deletes layers that no ref names and no mounted overlay uses. With only
// non-nil, it considers just those layer dirs. The caller holds the store lock
// exclusively.
func (s *Store) sweepLayers(only []string, mounted map[string]bool) error {
	imgs, err := s.List()
	if err != nil {
		return err
	}
	used := map[string]bool{}
	for _, img := range imgs {
		for _, l := range img.Layers {
			used[l] = true
		}
	}
	if only == nil {
		ents, err := os.ReadDir(s.layersDir())
		if err != nil {
			return err
		}
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") {
				only = append(only, filepath.Join(s.layersDir(), e.Name()))
			}
		}
	}
	var errs []error
	for _, l := range only {
		if used[l] || mounted[l] {
			continue
		}
		if err := fsutil.RemoveAll(l); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mountedLowerDirs returns every directory named in the options of an overlay mount,
// in any mount namespace this process can see.
func mountedLowerDirs() (map[string]bool, error) {
	out := map[string]bool{}
	pids := []int{0} // 0: this process's own namespace
	seen := map[string]bool{}
	if self, err := os.Readlink("/proc/self/ns/mnt"); err == nil {
		seen[self] = true
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		ns, err := os.Readlink(filepath.Join("/proc", p.Name(), "ns/mnt"))
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		pids = append(pids, pid)
	}
	for _, pid := range pids {
		var ms []*mountinfo.Info
		var err error
		if pid == 0 {
			ms, err = mountinfo.GetMounts(mountinfo.FSTypeFilter("overlay"))
		} else {
			ms, err = mountinfo.PidMountInfo(pid)
		}
		if err != nil {
			if pid == 0 {
				return nil, fmt.Errorf("read mounts: %w", err)
			}
			continue // the process exited
		}
		for _, m := range ms {
			if m.FSType != "overlay" {
				continue
			}
			for _, opt := range strings.Split(m.VFSOptions, ",") {
				k, v, _ := strings.Cut(opt, "=")
				if k != "lowerdir" && k != "upperdir" && k != "lowerdir+" {
					continue
				}
				for _, d := range strings.Split(v, ":") {
					out[unescapeOctal(d)] = true // super options keep the kernel's escapes
				}
			}
		}
	}
	return out, nil
}

func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			b = append(b, (s[i+1]-'0')<<6|(s[i+2]-'0')<<3|(s[i+3]-'0'))
			i += 3
			continue
		}
		b = append(b, s[i])
	}
	return string(b)
}

// lock is a held flock.
type lock struct{ f *os.File }

func (l *lock) unlock() {
	if l != nil && l.f != nil {
		l.f.Close() // closing drops the flock
		l.f = nil
	}
}

// flockFile takes how (LOCK_SH or LOCK_EX) on path, polling so ctx can cancel the wait.
func flockFile(ctx context.Context, path string, how int) (*lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return &lock{f: f}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for lock %s: %w", path, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// lockStore: writers hold it shared; deleting layers holds it exclusively, so a layer
// that a concurrent Get has just found can not vanish before its ref is written.
func (s *Store) lockStore(ctx context.Context, how int) (*lock, error) {
	return flockFile(ctx, filepath.Join(s.Dir, "lock"), how)
}

// lockName serialises fetching or building one name, so concurrent Gets of the same
// image do the work once. Take it before the store lock.
func (s *Store) lockName(ctx context.Context, key string) (*lock, error) {
	return flockFile(ctx, filepath.Join(s.locksDir(), safeName(key)+".lock"), unix.LOCK_EX)
}

// tempDir is a directory being built under layers/. Its creator holds the store lock
// shared for its whole life, so one found while the store lock is held exclusively is
// stale.
type tempDir struct{ path string }

func (s *Store) newTemp() (*tempDir, error) {
	p, err := os.MkdirTemp(s.layersDir(), ".tmp-")
	if err != nil {
		return nil, fmt.Errorf("create temp dir: %w", err)
	}
	// MkdirTemp makes it 0700; a layer root must be readable by container users.
	if err := os.Chmod(p, 0o755); err != nil {
		os.Remove(p)
		return nil, fmt.Errorf("create temp dir: %w", err)
	}
	return &tempDir{path: p}, nil
}

// commit renames the temp dir to dst unless dst exists already (a concurrent Get
// unpacked the same layer), in which case the temp dir is discarded.
func (t *tempDir) commit(dst string) error {
	err := unix.Renameat2(unix.AT_FDCWD, t.path, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) { // file system without RENAME_NOREPLACE
		if _, serr := os.Lstat(dst); serr == nil {
			err = unix.EEXIST
		} else {
			err = os.Rename(t.path, dst)
		}
	}
	if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
		return t.discard()
	}
	if err != nil {
		return fmt.Errorf("rename %s to %s: %w", t.path, dst, err)
	}
	t.path = ""
	return nil
}

// discard removes the temp dir, first detaching anything a killed debootstrap left
// mounted in it (fsutil.RemoveAll refuses to cross mounts).
func (t *tempDir) discard() error {
	if t == nil || t.path == "" {
		return nil
	}
	p := t.path
	t.path = ""
	return removeTree(p)
}

func removeTree(p string) error {
	for _, m := range fsutil.MountsUnder(p) {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w", m, err)
		}
	}
	return fsutil.RemoveAll(p)
}

// cleanStaleTemps removes temp dirs of crashed builds, if no build is running now.
func (s *Store) cleanStaleTemps() error {
	f, err := os.OpenFile(filepath.Join(s.Dir, "lock"), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("open lock: %w", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return nil // someone is working in the store; their temps are not stale
	}
	ents, err := os.ReadDir(s.layersDir())
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			if err := removeTree(filepath.Join(s.layersDir(), e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
