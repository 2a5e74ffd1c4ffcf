package testutil

import (
	"archive/tar"
	"bytes"
	"os"
	"testing"
)

// TarEntry is one entry of a layer Tar writes: its header (Size is set from Body) and
// its content.
type TarEntry struct {
	Hdr  tar.Header
	Body []byte
}

// Tar is a layer tarball of entries, in order.
func Tar(t testing.TB, entries ...TarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Hdr
		h.Size = int64(len(e.Body))
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.Body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Busybox is the entries of a small image's layer: the host's static busybox as
// /bin/busybox and /bin/<tool> links to it.
func Busybox(t testing.TB, tools ...string) []TarEntry {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal("needs busybox-static on the host: run `make setup`")
	}
	out := []TarEntry{{Hdr: tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}},
		{Hdr: tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755}, Body: bb}}
	for _, l := range tools {
		out = append(out, TarEntry{Hdr: tar.Header{Name: "bin/" + l, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}})
	}
	return out
}
