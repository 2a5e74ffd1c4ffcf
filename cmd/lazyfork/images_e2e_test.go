package main

import (
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/lazyfork/lazyfork/lib/testutil"
)

// busyboxImage is a one-layer image holding the host's static busybox as /bin/sh etc.
func busyboxImage(t *testing.T) v1.Image {
	t.Helper()
	data := testutil.Tar(t, testutil.Busybox(t, "sh", "echo", "sleep", "cat", "hostname")...)
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/bin"}, Cmd: []string{"sh", "-c", "echo from-config; sleep 1000"}})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// An image store of the test's own (not the machine's), for images made by the test.
func newPrivateEnv(t *testing.T) *env {
	e := newEnv(t)
	for i, v := range e.vars {
		if strings.HasPrefix(v, "LAZYFORK_ROOT=") {
			root := strings.TrimPrefix(v, "LAZYFORK_ROOT=")
			os.Remove(filepath.Join(root, "images"))
			e.vars[i] = v
		}
	}
	return e
}

func waitOutput(t *testing.T, e *env, c, want string) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, c+" to print "+want, func() bool {
		out, _, _ := e.sh("lazyfork attach --no-follow " + c)
		return strings.Contains(out, want)
	})
}

func TestCreateFromRegistryLayoutAndTarball(t *testing.T) {
	e := newPrivateEnv(t)
	img := busyboxImage(t)

	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	ref, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://")+"/test/bb:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	_, progress, code := e.sh("lazyfork create " + ref.String() + " --name fromreg")
	if code != 0 || !strings.Contains(progress, "pull") {
		t.Fatalf("create from registry: exit %d, stderr %q", code, progress)
	}
	waitOutput(t, e, "fromreg", "from-config")

	dir := filepath.Join(t.TempDir(), "oci")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	e.must("lazyfork create " + dir + " --name fromlayout -- sh -c 'echo from-layout; sleep 1000'")
	waitOutput(t, e, "fromlayout", "from-layout")

	tarPath := filepath.Join(t.TempDir(), "bb.tar")
	tag, _ := name.NewTag("example.com/bb:saved")
	if err := tarball.WriteToFile(tarPath, tag, img); err != nil {
		t.Fatal(err)
	}
	e.must("lazyfork create " + tarPath + " --name fromtar -- sh -c 'echo from-tar; sleep 1000'")
	waitOutput(t, e, "fromtar", "from-tar")

	// Layers are unpacked once and shared: three images of one layer, one layer dir.
	list := e.must("lazyfork image list --json")
	if strings.Count(list, `"name"`) != 3 {
		t.Errorf("image list: %s", list)
	}
	root := strings.TrimPrefix(e.vars[0], "LAZYFORK_ROOT=")
	if layers, _ := os.ReadDir(filepath.Join(root, "images", "layers")); len(layers) != 1 {
		t.Errorf("%d layer dirs for one shared layer", len(layers))
	}
}
