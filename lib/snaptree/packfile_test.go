package snaptree

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// A sparse memory file packs to its data extents and unpacks to the same bytes, size and
// mode; a pack whose map is damaged leaves no file and no temp name behind.
func TestPackFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src.mem")
	f, err := os.OpenFile(src, os.O_CREATE|os.O_WRONLY, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	page := bytes.Repeat([]byte{0x5a}, 4096)
	for _, off := range []int64{0, 1 << 20, 3 << 20} {
		if _, err := f.WriteAt(page, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(4 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	store := filepath.Join(dir, "store")
	if err := os.Mkdir(store, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := packFile(store, "m", src); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(store, "m")); err != nil || fi.Size() >= 4<<20 {
		t.Fatalf("packed file: %v, %v (want the data extents only)", fi, err)
	}
	dst := filepath.Join(dir, "dst.mem")
	if err := unpackFile(dst, store, "m"); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(src)
	got, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("unpacked file differs (%d vs %d bytes): %v", len(got), len(want), err)
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", fi.Mode().Perm())
	}
	if err := os.WriteFile(filepath.Join(store, "m.map"), []byte(`{"size":10,"mode":384,"extents":[[8,4]]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.mem")
	if err := unpackFile(bad, store, "m"); err == nil {
		t.Fatal("an extent outside the file's size was unpacked")
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*bad*")); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}
