package container_test

import (
	"bytes"
	"io"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// layoutOf makes an OCI image layout of one layer (a tar stream) and a config, for images
// the tests build (hostile ones among them).
func layoutOf(t *testing.T, layerTar []byte, cfg v1.Config) string {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err == nil {
		img, err = mutate.Config(img, cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err == nil {
		err = p.AppendImage(img)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
