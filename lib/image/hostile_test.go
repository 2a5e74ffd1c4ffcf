package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// treeState lists every entry below dir with its type, mode, owner, size and device
// number, so a test can show a failed import changed nothing.
func treeState(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if strings.HasPrefix(rel, "images/locks/") {
			return nil // a Get leaves its (empty) name lock behind, by design
		}
		size := st.Size
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			size = 0 // a dir's size moves with creates and removes of temp entries
		}
		lines = append(lines, fmt.Sprintf("%s %o %d:%d %d %d", rel, st.Mode, st.Uid, st.Gid, size, st.Rdev))
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// hostileStore is a store that already holds an image, plus a file beside the store,
// so a test can check that a refused import touched neither.
type hostileStore struct {
	s       *Store
	outside string // a directory next to the store
	before  string
}

func newHostileStore(t *testing.T) *hostileStore {
	t.Helper()
	s := newStore(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.tar")
	dockerSave(t, good, []string{"good:1"}, tarBytes(t, []entry{{name: "etc/", typ: tar.TypeDir}, {name: "etc/keep", body: "keep"}}))
	if _, err := s.Get(context.Background(), good, GetOptions{}); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(filepath.Dir(s.Dir), "beside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &hostileStore{s: s, outside: outside, before: treeState(t, filepath.Dir(s.Dir))}
}

// untouched fails unless the store and its neighbours are exactly as before, and the
// store still serves the image it held.
func (h *hostileStore) untouched(t *testing.T) {
	t.Helper()
	if after := treeState(t, filepath.Dir(h.s.Dir)); after != h.before {
		t.Errorf("store or host changed:\nbefore:\n%s\nafter:\n%s", h.before, after)
	}
	img, err := h.s.Resolve("good:1")
	if err != nil {
		t.Fatalf("the stored image is gone: %v", err)
	}
	if got := readFile(t, filepath.Join(img.Layers[0], "etc/keep")); got != "keep" {
		t.Errorf("stored layer content = %q", got)
	}
}

// importHostile writes layers as a docker-save tarball and imports it; the import must
// fail with a one-line error containing want.
func (h *hostileStore) importHostile(t *testing.T, want string, layers ...[]entry) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hostile.tar")
	var bs [][]byte
	for _, l := range layers {
		bs = append(bs, tarBytes(t, l))
	}
	dockerSave(t, p, []string{"hostile:1"}, bs...)
	_, err := h.s.Get(context.Background(), p, GetOptions{})
	if err == nil {
		t.Fatal("the hostile image was accepted")
	}
	msg := err.Error()
	t.Log(msg)
	if !strings.Contains(msg, want) || strings.Contains(msg, "\n") {
		t.Errorf("error = %q, want one line containing %q", msg, want)
	}
	if strings.Contains(msg, "docker save") {
		t.Errorf("error blames the archive format for refused content: %q", msg)
	}
	if _, err := h.s.Resolve("hostile:1"); err == nil {
		t.Error("the hostile image was recorded")
	}
}

// TestHostileWhiteouts: a whiteout that names ".", ".." or nothing used to delete its
// own directory or its parent: at a layer's root, the whole layer store.
func TestHostileWhiteouts(t *testing.T) {
	needRoot(t)
	for _, name := range []string{".wh..", ".wh.", ".wh...", "etc/.wh..", "etc/.wh...", "etc/.wh."} {
		t.Run(name, func(t *testing.T) {
			h := newHostileStore(t)
			h.importHostile(t, "whiteout", []entry{{name: "etc/", typ: tar.TypeDir}, {name: "etc/x", body: "x"}, {name: name}})
			h.untouched(t)
		})
	}
}

// TestHostileLayerPaths: entries that would write, link or delete outside the layer
// through "..", an absolute path, a symlink planted by the layer, or a hardlink.
func TestHostileLayerPaths(t *testing.T) {
	needRoot(t)
	cases := []struct {
		name string
		ents func(outside string) []entry
		want string
	}{
		{"dotdot file", func(string) []entry { return []entry{{name: "../../beside/escaped", body: "x"}} }, `".."`},
		{"write through symlink", func(o string) []entry {
			return []entry{{name: "a", typ: tar.TypeSymlink, link: o}, {name: "a/escaped", body: "x"}}
		}, "symlink"},
		{"write through relative symlink", func(string) []entry {
			return []entry{{name: "a", typ: tar.TypeSymlink, link: "../../../beside"}, {name: "a/escaped", body: "x"}}
		}, "symlink"},
		{"mkdir through symlink", func(o string) []entry {
			return []entry{{name: "a", typ: tar.TypeSymlink, link: o}, {name: "a/sub/", typ: tar.TypeDir}}
		}, "symlink"},
		{"whiteout through symlink", func(o string) []entry {
			return []entry{{name: "a", typ: tar.TypeSymlink, link: o}, {name: "a/.wh.secret"}}
		}, "symlink"},
		{"opaque through symlink", func(o string) []entry {
			return []entry{{name: "a", typ: tar.TypeSymlink, link: o}, {name: "a/.wh..wh..opq"}}
		}, "symlink"},
		{"hardlink dotdot", func(string) []entry {
			return []entry{{name: "h", typ: tar.TypeLink, link: "../../beside/secret"}}
		}, "hardlink"},
		{"hardlink absolute", func(o string) []entry {
			return []entry{{name: "h", typ: tar.TypeLink, link: filepath.Join(o, "secret")}}
		}, "hardlink"},
		{"hardlink through symlink", func(o string) []entry {
			return []entry{{name: "d", typ: tar.TypeSymlink, link: o}, {name: "h", typ: tar.TypeLink, link: "d/secret"}}
		}, "hardlink"},
		{"hardlink to root", func(string) []entry {
			return []entry{{name: "h", typ: tar.TypeLink, link: "./"}}
		}, "hardlink"},
		{"symlink then file replacing dir", func(o string) []entry {
			return []entry{{name: "etc", typ: tar.TypeSymlink, link: o}, {name: "etc/keep", body: "x"}}
		}, "symlink"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHostileStore(t)
			h.importHostile(t, c.want, []entry{{name: "ok", body: "ok"}}, c.ents(h.outside))
			h.untouched(t)
			if got := readFile(t, filepath.Join(h.outside, "secret")); got != "host" {
				t.Errorf("host file changed: %q", got)
			}
		})
	}
}

// TestSymlinksKeptVerbatim: a symlink's target is data for the container (resolved in
// its root), never followed while unpacking: an absolute or ".." target is stored as is.
func TestSymlinksKeptVerbatim(t *testing.T) {
	needRoot(t)
	s := newStore(t)
	p := filepath.Join(t.TempDir(), "links.tar")
	dockerSave(t, p, []string{"links:1"}, tarBytes(t, []entry{
		{name: "abs", typ: tar.TypeSymlink, link: "/etc/shadow"},
		{name: "up", typ: tar.TypeSymlink, link: "../../../../etc"},
		{name: "abs", typ: tar.TypeSymlink, link: "/etc/passwd"}, // replaced, not followed
		{name: "h", typ: tar.TypeLink, link: "up"},               // a hardlink of the symlink itself
	}))
	img, err := s.Get(context.Background(), p, GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l := img.Layers[0]
	for n, want := range map[string]string{"abs": "/etc/passwd", "up": "../../../../etc", "h": "../../../../etc"} {
		if got, err := os.Readlink(filepath.Join(l, n)); err != nil || got != want {
			t.Errorf("%s -> %q, %v; want %q", n, got, err, want)
		}
	}
}

// TestDeviceNodesSkipped: character and block devices in a layer are left out (with a
// note in the progress output); fifos are kept.
func TestDeviceNodesSkipped(t *testing.T) {
	needRoot(t)
	s := newStore(t)
	p := filepath.Join(t.TempDir(), "dev.tar")
	dockerSave(t, p, []string{"dev:1"}, tarBytes(t, []entry{
		{name: "disk", typ: tar.TypeBlock, mode: 0o666, major: 8, minor: 0},
		{name: "d/kmem", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 2},
		{name: "d/mem", typ: tar.TypeChar, mode: 0o4666, major: 1, minor: 1},
		{name: "d/mem2", typ: tar.TypeLink, link: "d/mem"},
		{name: "fifo", typ: tar.TypeFifo, mode: 0o600},
		{name: "file", body: "f"},
	}))
	var prog strings.Builder
	img, err := s.Get(context.Background(), p, GetOptions{Progress: &prog})
	if err != nil {
		t.Fatal(err)
	}
	l := img.Layers[0]
	for _, n := range []string{"disk", "d/kmem", "d/mem", "d/mem2"} {
		if _, err := os.Lstat(filepath.Join(l, n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("device node %s was unpacked: %v", n, err)
		}
	}
	if st := lstat(t, filepath.Join(l, "fifo")); st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("fifo mode %o", st.Mode)
	}
	if got := readFile(t, filepath.Join(l, "file")); got != "f" {
		t.Errorf("file = %q", got)
	}
	if !strings.Contains(prog.String(), "skipped 4 device node(s) (disk, d/kmem, d/mem, ...)") {
		t.Errorf("no note about skipped devices in the progress:\n%s", prog.String())
	}
}

// TestSizeLimit: an image over the unpacked-size limit is refused with a one-line error
// naming the limit and the setting, and leaves nothing behind. The bomb is a sparse
// file: its tar header alone claims the size.
func TestSizeLimit(t *testing.T) {
	needRoot(t)
	bomb := []entry{{name: "big", body: strings.Repeat("z", 3<<20)}}
	small := []entry{{name: "small", body: strings.Repeat("s", 1<<20)}}
	t.Run("setting", func(t *testing.T) {
		h := newHostileStore(t)
		h.s.MaxLayerBytes = "2M"
		h.importHostile(t, "image unpacks to more than 2M, the limit (from LAZYFORK_MAX_LAYER_BYTES); set LAZYFORK_MAX_LAYER_BYTES to a larger size", bomb)
		h.untouched(t)
	})
	t.Run("total over layers", func(t *testing.T) {
		h := newHostileStore(t)
		h.s.MaxLayerBytes = "2M"
		// Each layer fits, the image does not: the first layer is removed again.
		h.importHostile(t, "more than 2M", small, small[:0], []entry{{name: "small2", body: strings.Repeat("t", 1<<20)}})
		h.untouched(t)
	})
	t.Run("many entries", func(t *testing.T) {
		h := newHostileStore(t)
		h.s.MaxLayerBytes = "64K"
		var many []entry
		for i := range 200 {
			many = append(many, entry{name: fmt.Sprintf("d%d/", i), typ: tar.TypeDir})
		}
		h.importHostile(t, "more than 64K", many)
		h.untouched(t)
	})
	t.Run("default", func(t *testing.T) {
		h := newHostileStore(t)
		h.s.MaxLayerBytes = ""
		t.Setenv(MaxBytesEnv, "1K") // the mains' to read (kong env tags), never this package's
		p := filepath.Join(t.TempDir(), "sparse.tar")
		writeSparseBomb(t, p, DefaultMaxBytes+1)
		_, err := h.s.Get(context.Background(), p, GetOptions{})
		if err == nil || !strings.Contains(err.Error(), "more than 8G, the limit (default, LAZYFORK_MAX_LAYER_BYTES is unset)") {
			t.Fatalf("err = %v", err)
		}
		t.Log(err)
		h.untouched(t)
	})
	t.Run("bad setting", func(t *testing.T) {
		h := newHostileStore(t)
		h.s.MaxLayerBytes = "lots"
		h.importHostile(t, `LAZYFORK_MAX_LAYER_BYTES="lots": not a size`, small)
		h.untouched(t)
	})
	t.Run("under the limit", func(t *testing.T) {
		s := newStore(t)
		s.MaxLayerBytes = "8M"
		p := filepath.Join(t.TempDir(), "ok.tar")
		dockerSave(t, p, []string{"ok:1"}, tarBytes(t, bomb))
		if _, err := s.Get(context.Background(), p, GetOptions{}); err != nil {
			t.Fatal(err)
		}
	})
}

// writeSparseBomb writes a docker-save tarball whose one layer holds a file of size
// bytes that GNU tar stores as a few hundred bytes (a PAX sparse file, all hole).
func writeSparseBomb(t *testing.T, path string, size int64) {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "bomb"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	out, err := exec.Command("tar", "-C", dir, "--sparse", "--format=posix", "-cf", "-", "bomb").Output()
	if err != nil {
		t.Fatalf("tar --sparse: %v", err)
	}
	if len(out) > 64<<10 {
		t.Fatalf("the sparse layer is %d bytes: tar did not store a hole", len(out))
	}
	dockerSave(t, path, []string{"bomb:1"}, out)
}

// TestRemoveUnusedAsksUsers: RemoveUnused asks who needs the layers only this image has
// (not those another image keeps), refuses naming them, and changes nothing then.
func TestRemoveUnusedAsksUsers(t *testing.T) {
	needRoot(t)
	s := newStore(t)
	dir := t.TempDir()
	shared := tarBytes(t, []entry{{name: "shared", body: "s"}})
	own := tarBytes(t, []entry{{name: "own", body: "o"}})
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	dockerSave(t, a, []string{"a:1"}, shared, own)
	dockerSave(t, b, []string{"b:1"}, shared)
	imgA, err := s.Get(context.Background(), a, GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(context.Background(), b, GetOptions{}); err != nil {
		t.Fatal(err)
	}
	before := treeState(t, s.Dir)
	var asked []string
	err = s.RemoveUnused("a:1", func(name string, layers []string) ([]string, error) {
		if name != imgA.Name {
			t.Errorf("asked about %q", name)
		}
		asked = layers
		return []string{"container web (0123456789ab)", "snapshot 42 (of web)"}, nil
	})
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "in use by container web (0123456789ab), snapshot 42 (of web); delete them first") {
		t.Fatalf("err = %v", err)
	}
	t.Log(err)
	if len(asked) != 1 || asked[0] != imgA.Layers[1] {
		t.Errorf("asked about layers %v, want only the one image b does not keep (%s)", asked, imgA.Layers[1])
	}
	if after := treeState(t, s.Dir); after != before {
		t.Errorf("a refused remove changed the store:\n%s\n---\n%s", before, after)
	}
	if err := s.RemoveUnused("a:1", func(string, []string) ([]string, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(imgA.Layers[1]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the image's own layer is still there: %v", err)
	}
	if _, err := os.Stat(imgA.Layers[0]); err != nil {
		t.Errorf("the shared layer went: %v", err)
	}
}
