package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/lazyfork/lazyfork/lib/testutil/priv"
	"golang.org/x/sys/unix"
)

// needRoot skips unprivileged runs (unpacking sets owners, device nodes and trusted.*
// xattrs), unless CI insists on privileged tests.
func needRoot(t *testing.T) {
	t.Helper()
	priv.Root(t, "unpacking layers sets owners, device nodes and trusted.* xattrs")
}

func newStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// entry is one tar entry of a hand-built layer.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
	major, minor     int64
	xattrs           map[string]string
}

var fixedTime = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)

func tarBytes(t *testing.T, ents []entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
			if typ == tar.TypeDir {
				mode = 0o755
			}
		}
		h := &tar.Header{Name: e.name, Typeflag: typ, Mode: mode, Uid: e.uid, Gid: e.gid, Linkname: e.link,
			Devmajor: e.major, Devminor: e.minor, ModTime: fixedTime, Format: tar.FormatPAX}
		if typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func layerOf(t *testing.T, ents []entry) v1.Layer {
	t.Helper()
	b := tarBytes(t, ents)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

var (
	baseLayer = []entry{
		{name: "etc/", typ: tar.TypeDir},
		{name: "etc/keep", body: "keep"},
		{name: "etc/gone", body: "gone"},
		{name: "opq/", typ: tar.TypeDir},
		{name: "opq/old", body: "old"},
		{name: "bin/tool", body: "#!/bin/sh\n", mode: 0o4755},
	}
	topLayer = []entry{
		{name: "etc/.wh.gone"},
		{name: "opq/", typ: tar.TypeDir},
		{name: "opq/.wh..wh..opq"},
		{name: "opq/new", body: "new"},
		{name: "data/", typ: tar.TypeDir, mode: 0o700, uid: 1234, gid: 5678},
		{name: "data/f", body: "hello", mode: 0o640, uid: 1234, gid: 5678, xattrs: map[string]string{"user.lf": "1", "trusted.overlay.redirect": "/etc"}},
		{name: "data/link", typ: tar.TypeSymlink, link: "f", uid: 1234},
		{name: "data/hard", typ: tar.TypeLink, link: "data/f"},
		{name: "data/fifo", typ: tar.TypeFifo, mode: 0o600},
		{name: "dev/null2", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3},
	}
)

func testImage(t *testing.T) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layerOf(t, baseLayer), layerOf(t, topLayer))
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{
		Env:        []string{"PATH=/usr/bin:/bin", "LF=1"},
		Cmd:        []string{"-c", "echo hi"},
		Entrypoint: []string{"/bin/sh"},
		WorkingDir: "/data",
		User:       "1234",
	})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// startRegistry serves an in-memory registry and pushes img as repo:tag to it.
func mustTag(t *testing.T, s string) name.Tag {
	t.Helper()
	tag, err := name.NewTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}

func startRegistry(t *testing.T, repoTag string, img v1.Image) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/" + repoTag
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	return ref
}

func lstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkTestImage verifies the unpacked layers of testImage, entry by entry.
func checkTestImage(t *testing.T, img *Image) {
	t.Helper()
	if len(img.Layers) != 2 {
		t.Fatalf("layers = %v, want 2", img.Layers)
	}
	base, top := img.Layers[0], img.Layers[1]
	if got := readFile(t, filepath.Join(base, "etc/keep")); got != "keep" {
		t.Errorf("etc/keep = %q", got)
	}
	if st := lstat(t, filepath.Join(base, "bin/tool")); st.Mode&0o7777 != 0o4755 {
		t.Errorf("bin/tool mode = %o, want 4755", st.Mode&0o7777)
	}
	wh := lstat(t, filepath.Join(top, "etc/gone"))
	if wh.Mode&unix.S_IFMT != unix.S_IFCHR || wh.Rdev != 0 {
		t.Errorf("etc/gone is not a 0:0 char device whiteout: mode %o rdev %d", wh.Mode, wh.Rdev)
	}
	if _, err := os.Lstat(filepath.Join(top, "etc/.wh.gone")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf(".wh.gone left in the layer: %v", err)
	}
	v := make([]byte, 8)
	n, err := unix.Getxattr(filepath.Join(top, "opq"), "trusted.overlay.opaque", v)
	if err != nil || string(v[:n]) != "y" {
		t.Errorf("opq opaque xattr = %q, %v", v[:n], err)
	}
	f := lstat(t, filepath.Join(top, "data/f"))
	if f.Uid != 1234 || f.Gid != 5678 || f.Mode&0o7777 != 0o640 {
		t.Errorf("data/f uid %d gid %d mode %o", f.Uid, f.Gid, f.Mode&0o7777)
	}
	if n, err := unix.Getxattr(filepath.Join(top, "data/f"), "user.lf", v); err != nil || string(v[:n]) != "1" {
		t.Errorf("data/f user.lf = %q, %v", v[:n], err)
	}
	if _, err := unix.Getxattr(filepath.Join(top, "data/f"), "trusted.overlay.redirect", v); err == nil {
		t.Errorf("a layer could set trusted.overlay.redirect")
	}
	if d := lstat(t, filepath.Join(top, "data")); d.Mode&0o7777 != 0o700 || d.Uid != 1234 || d.Mtim.Sec != fixedTime.Unix() {
		t.Errorf("data dir mode %o uid %d mtime %d", d.Mode&0o7777, d.Uid, d.Mtim.Sec)
	}
	if l, err := os.Readlink(filepath.Join(top, "data/link")); err != nil || l != "f" {
		t.Errorf("data/link -> %q, %v", l, err)
	}
	if st := lstat(t, filepath.Join(top, "data/link")); st.Uid != 1234 {
		t.Errorf("data/link uid %d", st.Uid)
	}
	if h := lstat(t, filepath.Join(top, "data/hard")); h.Ino != f.Ino {
		t.Errorf("data/hard is not a hardlink of data/f")
	}
	if st := lstat(t, filepath.Join(top, "data/fifo")); st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("data/fifo mode %o", st.Mode)
	}
	// Device nodes are skipped: a container gets its own /dev.
	if _, err := os.Lstat(filepath.Join(top, "dev/null2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("device node dev/null2 was unpacked: %v", err)
	}
	if got := strings.Join(img.Entrypoint, " ") + "|" + strings.Join(img.Cmd, " ") + "|" + img.WorkingDir + "|" + img.User; got != "/bin/sh|-c echo hi|/data|1234" {
		t.Errorf("config = %s", got)
	}
	if strings.Join(img.Env, ",") != "PATH=/usr/bin:/bin,LF=1" {
		t.Errorf("env = %v", img.Env)
	}
	if img.Size != int64(len("keep")+len("gone")+len("old")+len("#!/bin/sh\n")+len("new")+len("hello")) {
		t.Errorf("size = %d", img.Size)
	}
}

// mountOverlay stacks the image's layers read-only, the way a container sees them.
func mountOverlay(t *testing.T, layers []string) string {
	t.Helper()
	mnt := t.TempDir()
	var lower []string
	for i := len(layers) - 1; i >= 0; i-- {
		lower = append(lower, layers[i])
	}
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(lower, ":")); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	return mnt
}

func checkOverlay(t *testing.T, img *Image) {
	t.Helper()
	mnt := mountOverlay(t, img.Layers)
	for p, want := range map[string]bool{"etc/keep": true, "etc/gone": false, "opq/old": false, "opq/new": true, "data/f": true} {
		_, err := os.Lstat(filepath.Join(mnt, p))
		if (err == nil) != want {
			t.Errorf("in the overlay, %s exists = %v, want %v", p, err == nil, want)
		}
	}
}

// checkClean fails if the store holds temp dirs, or layers no ref uses.
func checkClean(t *testing.T, s *Store) {
	t.Helper()
	imgs, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, img := range imgs {
		for _, l := range img.Layers {
			used[filepath.Base(l)] = true
		}
	}
	ents, _ := os.ReadDir(s.layersDir())
	for _, e := range ents {
		if !used[e.Name()] {
			t.Errorf("store has a stray entry layers/%s", e.Name())
		}
	}
}

func TestPullFromRegistry(t *testing.T) {
	needRoot(t)
	img := testImage(t)
	ref := startRegistry(t, "test/img:v1", img)
	s := newStore(t)
	var prog bytes.Buffer
	got, err := s.Get(context.Background(), ref, GetOptions{Progress: &prog})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if got.Name != ref || got.Source != SourceRegistry || got.Digest != want.String() {
		t.Errorf("got name %q source %q digest %q; want %q registry %s", got.Name, got.Source, got.Digest, ref, want)
	}
	checkTestImage(t, got)
	checkOverlay(t, got)
	t.Logf("progress:\n%s", prog.String())
	if !strings.Contains(prog.String(), "pull "+ref) || !strings.Contains(prog.String(), "layer 2/2") {
		t.Errorf("progress text:\n%s", prog.String())
	}

	// Resolve after Get, and Get again without a download.
	r, err := s.Resolve(ref)
	if err != nil || r.Digest != got.Digest || strings.Join(r.Layers, ":") != strings.Join(got.Layers, ":") {
		t.Fatalf("Resolve = %+v, %v", r, err)
	}
	prog.Reset()
	if _, err := s.Get(context.Background(), ref, GetOptions{Progress: &prog}); err != nil || prog.Len() != 0 {
		t.Errorf("second Get: %v, progress %q", err, prog.String())
	}
	// A fresh Open of the same dir sees it too.
	s2, err := Open(s.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := s2.List(); err != nil || len(l) != 1 || l[0].Name != ref {
		t.Errorf("List = %v, %v", l, err)
	}
	checkClean(t, s)
}

func TestConcurrentGets(t *testing.T) {
	needRoot(t)
	img := testImage(t)
	ref := startRegistry(t, "test/img:v1", img)
	lay := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(lay, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	s := newStore(t)
	// Two Gets of one ref, and one of another source with the same layers.
	refs := []string{ref, ref, lay}
	res := make([]*Image, len(refs))
	errs := make([]error, len(refs))
	var wg sync.WaitGroup
	for i, r := range refs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := Open(s.Dir) // as separate processes would
			if err == nil {
				res[i], errs[i] = st.Get(context.Background(), r, GetOptions{})
			} else {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	for i := range refs {
		if errs[i] != nil {
			t.Fatalf("Get %s: %v", refs[i], errs[i])
		}
		checkTestImage(t, res[i])
		if strings.Join(res[i].Layers, ":") != strings.Join(res[0].Layers, ":") {
			t.Errorf("layers differ: %v vs %v", res[i].Layers, res[0].Layers)
		}
	}
	ents, _ := os.ReadDir(s.layersDir())
	if len(ents) != 2 {
		t.Errorf("layers dir holds %d entries, want 2", len(ents))
	}
	checkClean(t, s)
}

func TestOCILayout(t *testing.T) {
	needRoot(t)
	img := testImage(t)
	dir := filepath.Join(t.TempDir(), "My-Layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{annotationRefName: "v2"})); err != nil {
		t.Fatal(err)
	}
	s := newStore(t)
	got, err := s.Get(context.Background(), dir, GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if got.Name != "my-layout:v2" || got.Source != SourceOCILayout || got.Digest != want.String() {
		t.Errorf("got name %q source %q digest %q", got.Name, got.Source, got.Digest)
	}
	checkTestImage(t, got)
	if r, err := s.Resolve("my-layout:v2"); err != nil || r.Digest != got.Digest {
		t.Errorf("Resolve: %v", err)
	}

	// With two images, the caller must pick one.
	other, err := random.Image(100, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(other, layout.WithAnnotations(map[string]string{annotationRefName: "example.com/other:v3"})); err != nil {
		t.Fatal(err)
	}
	_, err = s.Get(context.Background(), dir, GetOptions{})
	if err == nil || !strings.Contains(err.Error(), "v2") || !strings.Contains(err.Error(), "example.com/other:v3") || !strings.Contains(err.Error(), "PATH:TAG") {
		t.Errorf("Get of a two-image layout: %v", err)
	}
	got, err = s.Get(context.Background(), dir+":v3", GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	od, _ := other.Digest()
	if got.Name != "example.com/other:v3" || got.Digest != od.String() || len(got.Layers) != 1 {
		t.Errorf("picked %+v", got)
	}
	checkClean(t, s)
}

// dockerSave writes a tarball shaped like `docker save` output: manifest.json first,
// then the config, then uncompressed layers named <id>/layer.tar.
func dockerSave(t *testing.T, path string, repoTags []string, layers ...[]byte) {
	t.Helper()
	var diffIDs []string
	var names []string
	for _, l := range layers {
		sum := sha256.Sum256(l)
		diffIDs = append(diffIDs, "sha256:"+hex.EncodeToString(sum[:]))
		names = append(names, hex.EncodeToString(sum[:])+"/layer.tar")
	}
	cfg, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Env": []string{"A=1"}, "Cmd": []string{"/bin/true"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	csum := sha256.Sum256(cfg)
	cfgName := hex.EncodeToString(csum[:]) + ".json"
	man, _ := json.Marshal([]map[string]any{{"Config": cfgName, "RepoTags": repoTags, "Layers": names}})
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	put := func(n string, b []byte) {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write(b)
	}
	put("manifest.json", man)
	put(cfgName, cfg)
	for i, l := range layers {
		put(names[i], l)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestDockerArchive(t *testing.T) {
	needRoot(t)
	s := newStore(t)
	dir := t.TempDir()
	ctx := context.Background()

	// Written by go-containerregistry (gzipped layers), with a tag.
	img := testImage(t)
	tagged := filepath.Join(dir, "tagged.tar")
	if err := tarball.WriteToFile(tagged, mustTag(t, "example.com/foo:v1"), img); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, tagged, GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cn, _ := img.ConfigName()
	if got.Name != "example.com/foo:v1" || got.Source != SourceDockerArchive || got.Digest != cn.String() {
		t.Errorf("got name %q source %q digest %q", got.Name, got.Source, got.Digest)
	}
	checkTestImage(t, got)

	// Shaped like docker's own output: uncompressed layers, a short tag.
	saved := filepath.Join(dir, "saved.tar")
	dockerSave(t, saved, []string{"myimg:latest"}, tarBytes(t, []entry{{name: "hello", body: "world"}}))
	got, err = s.Get(ctx, saved, GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "index.docker.io/library/myimg:latest" || got.Cmd[0] != "/bin/true" {
		t.Errorf("got %+v", got)
	}
	if r, err := s.Resolve("myimg"); err != nil || r.Name != got.Name {
		t.Errorf("Resolve(myimg) = %v", err)
	}
	if b := readFile(t, filepath.Join(got.Layers[0], "hello")); b != "world" {
		t.Errorf("hello = %q", b)
	}

	// Untagged: named after the file.
	untagged := filepath.Join(dir, "Untagged_Thing.tar")
	dockerSave(t, untagged, nil, tarBytes(t, []entry{{name: "x", body: "y"}}))
	if got, err = s.Get(ctx, untagged, GetOptions{}); err != nil || got.Name != "untagged_thing" {
		t.Errorf("untagged: %+v, %v", got, err)
	}

	// Several images: the caller must pick one by tag.
	multi := filepath.Join(dir, "multi.tar")
	other, _ := random.Image(64, 1)
	if err := tarball.MultiRefWriteToFile(multi, map[name.Reference]v1.Image{
		mustTag(t, "example.com/a:v1"): img,
		mustTag(t, "example.com/b:v2"): other,
	}); err != nil {
		t.Fatal(err)
	}
	_, err = s.Get(ctx, multi, GetOptions{})
	if err == nil || !strings.Contains(err.Error(), "example.com/a:v1") || !strings.Contains(err.Error(), "example.com/b:v2") {
		t.Errorf("Get of a two-image archive: %v", err)
	}
	if got, err = s.Get(ctx, multi+":v2", GetOptions{}); err != nil || got.Name != "example.com/b:v2" {
		t.Errorf("pick :v2: %+v, %v", got, err)
	}
	if got, err = s.Get(ctx, multi+":example.com/a:v1", GetOptions{}); err != nil || got.Name != "example.com/a:v1" {
		t.Errorf("pick by full name: %+v, %v", got, err)
	}
	checkClean(t, s)
}

func TestCorruptArchive(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.tar")
	l1 := tarBytes(t, []entry{{name: "a", body: strings.Repeat("a", 4096)}})
	l2 := tarBytes(t, []entry{{name: "b", body: strings.Repeat("b", 64<<10)}})
	dockerSave(t, good, []string{"x:1"}, l1, l2)
	full, _ := os.ReadFile(good)

	truncated := filepath.Join(dir, "truncated.tar")
	os.WriteFile(truncated, full[:len(full)-40<<10], 0o644) // inside the second layer
	early := filepath.Join(dir, "early.tar")
	os.WriteFile(early, full[:700], 0o644) // inside manifest or config
	garbage := filepath.Join(dir, "garbage.tar")
	os.WriteFile(garbage, bytes.Repeat([]byte("not a tar "), 300), 0o644)
	ggcr := filepath.Join(dir, "ggcr.tar")
	if err := tarball.WriteToFile(ggcr, mustTag(t, "example.com/foo:v1"), testImage(t)); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(ggcr)
	os.WriteFile(ggcr, b[:len(b)/2], 0o644) // manifest.json comes last: cut off

	for _, p := range []string{truncated, early, garbage, ggcr} {
		t.Run(filepath.Base(p), func(t *testing.T) {
			s := newStore(t)
			_, err := s.Get(context.Background(), p, GetOptions{})
			if err == nil {
				t.Fatal("Get succeeded")
			}
			msg := err.Error()
			t.Log(msg)
			if !strings.HasPrefix(msg, "read image archive "+p+": ") || !strings.HasSuffix(msg, "; is it a `docker save` tarball?") || strings.Contains(msg, "\n") {
				t.Errorf("error = %q", msg)
			}
			for _, sub := range []string{"layers", "refs"} {
				ents, _ := os.ReadDir(filepath.Join(s.Dir, sub))
				if len(ents) != 0 {
					t.Errorf("%s/ not empty after failure: %v", sub, ents)
				}
			}
		})
	}
}

func TestUnknownRef(t *testing.T) {
	s := newStore(t)
	_, err := s.Resolve("nope:1")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "lazyfork create nope:1") {
		t.Errorf("Resolve(nope:1) = %v", err)
	}
	_, err = s.Resolve("debian-python")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "build-default") {
		t.Errorf("Resolve(debian-python) = %v", err)
	}
	if err := s.Remove("nope:1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Remove(nope:1) = %v", err)
	}
	_, err = s.Get(context.Background(), "./no-such-image.tar", GetOptions{})
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("Get of a missing file: %v", err)
	}
	_, err = s.Get(context.Background(), t.TempDir(), GetOptions{})
	if err == nil || !strings.Contains(err.Error(), "not an OCI image layout") {
		t.Errorf("Get of a plain dir: %v", err)
	}
	ref := startRegistry(t, "test/img:v1", empty.Image)
	missing := strings.Replace(ref, "test/img", "test/missing", 1)
	_, err = s.Get(context.Background(), missing, GetOptions{})
	if err == nil || !strings.Contains(err.Error(), "the pull of "+missing) || strings.Contains(err.Error(), "\n") {
		t.Errorf("Get of a missing repository: %v", err)
	}
}

func TestHostileLayers(t *testing.T) {
	needRoot(t)
	outside := t.TempDir()
	cases := map[string][]entry{
		"dotdot":          {{name: "../escaped", body: "x"}},
		"through symlink": {{name: "a", typ: tar.TypeSymlink, link: outside}, {name: "a/escaped", body: "x"}},
		"hardlink out":    {{name: "h", typ: tar.TypeLink, link: "../../etc/passwd"}},
		"link to symlink dir": {
			{name: "d", typ: tar.TypeSymlink, link: outside},
			{name: "h", typ: tar.TypeLink, link: "d/secret"},
		},
	}
	os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600)
	for n, ents := range cases {
		t.Run(n, func(t *testing.T) {
			img, err := mutate.AppendLayers(empty.Image, layerOf(t, []entry{{name: "ok", body: "ok"}}), layerOf(t, ents))
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(t.TempDir(), "layout")
			p, _ := layout.Write(dir, empty.Index)
			if err := p.AppendImage(img); err != nil {
				t.Fatal(err)
			}
			s := newStore(t)
			_, err = s.Get(context.Background(), dir, GetOptions{})
			if err == nil {
				t.Fatal("hostile layer was accepted")
			}
			t.Log(err)
			if _, err := os.Lstat(filepath.Join(outside, "escaped")); err == nil {
				t.Fatal("a tar entry was written outside the layer")
			}
			if ents, _ := os.ReadDir(s.layersDir()); len(ents) != 0 {
				t.Errorf("layers left behind: %v", ents)
			}
		})
	}
}

func TestImportDirAndRemove(t *testing.T) {
	needRoot(t)
	s := newStore(t)
	for _, base := range []string{t.TempDir(), "/dev/shm"} { // rename, then copy across file systems
		src, err := os.MkdirTemp(base, "lf-image-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(src) })
		os.Chmod(src, 0o755)
		os.MkdirAll(filepath.Join(src, "bin"), 0o755)
		os.WriteFile(filepath.Join(src, "bin/bash"), []byte("#!"), 0o755)
		os.WriteFile(filepath.Join(src, "su"), []byte("su"), 0o644)
		unix.Chmod(filepath.Join(src, "su"), 0o4711)
		os.Symlink("bin/bash", filepath.Join(src, "sh"))
		os.Link(filepath.Join(src, "su"), filepath.Join(src, "su2"))
		unix.Mknod(filepath.Join(src, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
		os.Lchown(filepath.Join(src, "sh"), 7, 8)
		unix.Setxattr(filepath.Join(src, "su"), "user.lf", []byte("v"), 0)

		n := "local/" + filepath.Base(base) + ":1"
		img, err := s.ImportDir(src, n)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(src); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("source dir still exists: %v", err)
		}
		l := img.Layers[0]
		if img.Source != SourceDirectory || len(img.Cmd) != 0 || img.Size != 4 || !strings.HasPrefix(img.Digest, "sha256:") {
			t.Errorf("image %+v", img)
		}
		if st := lstat(t, filepath.Join(l, "su")); st.Mode&0o7777 != 0o4711 || lstat(t, filepath.Join(l, "su2")).Ino != st.Ino {
			t.Errorf("su mode %o / hardlink lost", st.Mode&0o7777)
		}
		if st := lstat(t, filepath.Join(l, "sh")); st.Uid != 7 || st.Mode&unix.S_IFMT != unix.S_IFLNK {
			t.Errorf("sh: %+v", st)
		}
		if st := lstat(t, filepath.Join(l, "null")); st.Rdev != unix.Mkdev(1, 3) {
			t.Errorf("null rdev %d", st.Rdev)
		}
		v := make([]byte, 4)
		if n, err := unix.Getxattr(filepath.Join(l, "su"), "user.lf", v); err != nil || string(v[:n]) != "v" {
			t.Errorf("xattr lost: %v", err)
		}
		if r, err := s.Resolve(n); err != nil || r.Layers[0] != l {
			t.Errorf("Resolve(%s): %v", n, err)
		}
	}

	imgs, _ := s.List()
	if len(imgs) != 2 {
		t.Fatalf("List = %v", imgs)
	}
	// A mounted layer blocks removal; after unmounting it goes, with its layer.
	victim := imgs[0]
	mnt := t.TempDir()
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+victim.Layers[0]+":"+imgs[1].Layers[0]); err != nil {
		t.Fatal(err)
	}
	err := s.Remove(victim.Name)
	unix.Unmount(mnt, unix.MNT_DETACH)
	if err == nil || !strings.Contains(err.Error(), "mounted") {
		t.Fatalf("Remove of a mounted image: %v", err)
	}
	if err := s.Remove(victim.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(victim.Layers[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("layer kept after Remove: %v", err)
	}
	if _, err := s.Resolve(victim.Name); !errors.Is(err, ErrNotFound) {
		t.Errorf("Resolve after Remove: %v", err)
	}
	if _, err := s.Resolve(imgs[1].Name); err != nil {
		t.Errorf("the other image went too: %v", err)
	}
	if _, err := s.ImportDir(t.TempDir(), "Bad Name"); err == nil {
		t.Errorf("ImportDir accepted a bad name")
	}
}

func TestRemoveKeepsSharedLayers(t *testing.T) {
	needRoot(t)
	s := newStore(t)
	img := testImage(t)
	dir := t.TempDir()
	for _, tag := range []string{"example.com/a:1", "example.com/b:1"} {
		p := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(tag)+".tar")
		if err := tarball.WriteToFile(p, mustTag(t, tag), img); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(context.Background(), p, GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Remove("example.com/a:1"); err != nil {
		t.Fatal(err)
	}
	b, err := s.Resolve("example.com/b:1")
	if err != nil {
		t.Fatal(err)
	}
	checkTestImage(t, b)
}

func TestOpenRemovesStaleTemps(t *testing.T) {
	s := newStore(t)
	stale := filepath.Join(s.layersDir(), ".tmp-crashed")
	os.MkdirAll(filepath.Join(stale, "half/done"), 0o755)
	if _, err := Open(s.Dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale temp dir kept: %v", err)
	}
}

func TestNames(t *testing.T) {
	for in, want := range map[string]string{
		"lazyfork/debian:bookworm": "lazyfork+debian:bookworm",
		"127.0.0.1:5000/a/b:v1":    "127.0.0.1:5000+a+b:v1",
	} {
		if got := safeName(in); got != want {
			t.Errorf("safeName(%q) = %q, want %q", in, got, want)
		}
	}
	if c := candidates("alpine"); c[len(c)-1] != "index.docker.io/library/alpine:latest" {
		t.Errorf("candidates(alpine) = %v", c)
	}
	if c := canonical("debian-python"); c != DefaultName {
		t.Errorf("canonical(debian-python) = %q", c)
	}
	if !isLocalhost("localhost:5000/x") || !isLocalhost("127.0.0.1:1/x:y") || isLocalhost("example.com/x") || isLocalhost("localhost") {
		t.Errorf("isLocalhost")
	}
	if n := fileImageName("/x/My Image.tar.gz"); n != "my-image" {
		t.Errorf("fileImageName = %q", n)
	}
}

func TestDebianMirror(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sources.list.d"), 0o755)
	write := func(n, s string) {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := mirrorFrom(dir, "bookworm"); got != defaultMirror {
		t.Errorf("no sources: %q", got)
	}
	write("sources.list", "# deb http://commented.example/debian bookworm main\n"+
		"deb [arch=amd64 signed-by=/k.gpg] http://other.example/debian/ trixie main\n")
	if got := mirrorFrom(dir, "bookworm"); got != "http://other.example/debian" {
		t.Errorf("one-line: %q", got)
	}
	write("sources.list.d/debian.sources", `Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
`)
	write("sources.list.d/off.sources", "Types: deb\nURIs: http://disabled.example/debian\nSuites: bookworm\nEnabled: no\n")
	write("sources.list.d/x.list.disabled", "deb http://ignored.example/debian bookworm main\n")
	if got := mirrorFrom(dir, "bookworm"); got != "http://mirror.example/debian" {
		t.Errorf("deb822: %q", got)
	}
}

func TestUnpackEdgeCases(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	// Parents missing from the tar, a file replaced by a dir and back, a whiteout for a
	// name the same layer also wrote, and the layer root's own entry.
	b := tarBytes(t, []entry{
		{name: "./", typ: tar.TypeDir, mode: 0o711},
		{name: "deep/er/file", body: "1"},
		{name: "x", body: "file first"},
		{name: "x/", typ: tar.TypeDir},
		{name: "x/inner", body: "2"},
		{name: "x", body: "file again"},
		{name: "y", body: "y"},
		{name: ".wh.y"},
	})
	if _, err := unpackLayer(bytes.NewReader(b), dir, unpackOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "deep/er/file")); got != "1" {
		t.Errorf("deep file = %q", got)
	}
	if got := readFile(t, filepath.Join(dir, "x")); got != "file again" {
		t.Errorf("x = %q", got)
	}
	if st := lstat(t, filepath.Join(dir, "y")); st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Errorf("y is not a whiteout")
	}
	if st := lstat(t, dir); st.Mode&0o7777 != 0o711 {
		t.Errorf("root mode %o", st.Mode&0o7777)
	}
}

func TestBuildDefault(t *testing.T) {
	if os.Getenv("LF_TEST_DEBOOTSTRAP") != "1" {
		t.Skip("runs debootstrap (about a minute); set LF_TEST_DEBOOTSTRAP=1")
	}
	needRoot(t)
	s := newStore(t)
	var prog bytes.Buffer
	img, err := s.BuildDefault(context.Background(), &prog)
	if err != nil {
		t.Fatalf("%v\n%s", err, prog.String())
	}
	if r, err := s.Resolve("debian-python"); err != nil || r.Name != DefaultName {
		t.Fatalf("Resolve(debian-python): %v", err)
	}
	root := img.Layers[0]
	for _, p := range []string{"usr/bin/python3", "bin/ps", "bin/bash"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("%s missing: %v", p, err)
		}
	}
	if ls, _ := filepath.Glob(filepath.Join(root, "var/lib/apt/lists/*_Packages")); len(ls) != 0 {
		t.Errorf("apt lists kept: %v", ls)
	}
	if debs, _ := filepath.Glob(filepath.Join(root, "var/cache/apt/archives/*.deb")); len(debs) != 0 {
		t.Errorf("apt cache kept: %d debs", len(debs))
	}
	if again, err := s.Get(context.Background(), DefaultName, GetOptions{}); err != nil || again.Digest != img.Digest {
		t.Errorf("Get after build: %v", err)
	}
}
