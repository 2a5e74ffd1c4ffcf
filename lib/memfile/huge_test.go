package memfile

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Dense 2 MiB stretches become huge pages; sparse ones keep their holes (a huge page
// would fill them with zeros, costing RAM); the bytes read back unchanged.
func TestCollapseDense(t *testing.T) {
	f, err := os.OpenFile(filepath.Join(shmDir(t), "anon.mem"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := bytes.Repeat([]byte("lazyfork"), hugeAlign/8)
	// [0, 2M): one page; [2M, 4M): full; [4M, 6M): 7/8 full; [6M, 8M) half full.
	writes := []struct{ off, n int64 }{{0, pageSize}, {hugeAlign, hugeAlign}, {2 * hugeAlign, hugeAlign * 7 / 8}, {3 * hugeAlign, hugeAlign / 2}}
	for _, w := range writes {
		if _, err := f.WriteAt(data[:w.n], w.off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(AnonFileSize); err != nil {
		t.Fatal(err)
	}
	made := collapseDense(int(f.Fd()), 0, 4*hugeAlign)
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/shmem_enabled"); err == nil && made != 2 {
		t.Errorf("collapsed %d stretches, want the 2 dense ones", made)
	}
	t.Logf("collapsed %d stretches", made)
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	// Data: 4 KiB + 2 MiB + 1.75 MiB + 1 MiB; the 7/8 stretch's holes become RAM (+0.25 MiB).
	if got, want := st.Blocks*512, int64(pageSize+hugeAlign*5/2); got != want {
		t.Errorf("file holds %d bytes of RAM, want %d: only the dense stretches may grow", got, want)
	}
	for _, w := range writes {
		got := make([]byte, w.n)
		if _, err := f.ReadAt(got, w.off); err != nil || !bytes.Equal(got, data[:w.n]) {
			t.Errorf("bytes at %d changed (%v)", w.off, err)
		}
	}
	hole := make([]byte, pageSize)
	if _, err := f.ReadAt(hole, 2*hugeAlign+hugeAlign*7/8); err != nil || !bytes.Equal(hole, make([]byte, pageSize)) {
		t.Errorf("a filled hole does not read as zeros (%v)", err)
	}
}

// Preallocate makes each densely covered 2 MiB stretch one huge page, zeroed, and the
// sparse rest small pages; a punch outside the data (punchOutside) and the zero-page sweep
// leave the dense stretches whole, and free pages elsewhere.
func TestPreallocateMakesDenseStretchesHuge(t *testing.T) {
	at := uint64(base) // 2 MiB-aligned
	h := uint64(hugeAlign)
	runs := []PreallocRun{
		{at, at + h},                         // full
		{at + h, at + h + 400*ps},            // 400 of 512 pages: dense
		{at + 2*h + 8*ps, at + 2*h + 108*ps}, // 100 pages: sparse
	}
	_, thp := os.Stat("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
	path := filepath.Join(shmDir(t), "p.mem")
	n, made, err := Preallocate(path, runs)
	if err != nil {
		t.Fatal(err)
	}
	if thp != nil {
		t.Logf("no huge tmpfs pages here: %d made", made)
	} else if made != 2 || n != int64(2*h+100*ps) {
		t.Fatalf("%d huge pages, %d bytes allocated; want 2 and %d", made, n, 2*h+100*ps)
	}
	if got := allocated(t, path); thp == nil && got != int64(2*h+100*ps) {
		t.Errorf("%d bytes allocated, want the two stretches whole and the sparse run", got)
	}
	for _, p := range []uint64{0, 511, 512 + 450, 1024 + 8, 1024 + 200} {
		if !bytes.Equal(readPage(t, path, at/ps+p), page(0)) {
			t.Errorf("page %d of a new file does not read as zeros", p)
		}
	}
	// What a dump writes (the dense stretches' pages, one of them all zeros, and a page of
	// the sparse run, zeros but one), then what the rewrite punches: all but the first 50 pages of the
	// sparse run are gone from the checkpoint.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat(page('x'), 912), int64(at)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat(page(0), 50), int64(at+2*h+8*ps)); err != nil {
		t.Fatal(err)
	}
	for i, p := range []uint64{3, 512 + 7, 1024 + 9} {
		b := page(byte('a' + i))
		if i == 1 {
			b = page(0)
		}
		if _, err := f.WriteAt(b, int64(at+p*ps)); err != nil {
			t.Fatal(err)
		}
	}
	keep := []PreallocRun{{at, at + h + 400*ps}, {at + 2*h + 8*ps, at + 2*h + 58*ps}}
	if err := punchOutside(int(f.Fd()), keep); err != nil {
		t.Fatal(err)
	}
	want := int64(2*h + 50*ps)
	if thp != nil {
		want = int64(h + 400*ps + 50*ps)
	}
	if got := allocated(t, path); got != want {
		t.Errorf("after the punch %d bytes allocated, want %d (the dense stretches whole, 50 sparse pages)", got, want)
	}
	freed, err := PunchZeroPages(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	// The sparse stretch's 49 zero pages go; the dense stretches' zeros stay (a punch
	// would split their huge pages).
	if freed != int64(49*ps) || allocated(t, path) != want-int64(49*ps) {
		t.Errorf("the sweep freed %d bytes, %d left; want 49 pages freed", freed, allocated(t, path))
	}
	for i, p := range []uint64{3, 512 + 7, 1024 + 9, 100, 911} {
		want := page(byte('a' + i))
		switch {
		case i == 1:
			want = page(0)
		case i > 2:
			want = page('x')
		}
		if !bytes.Equal(readPage(t, path, at/ps+p), want) {
			t.Errorf("page %d changed", p)
		}
	}
}

func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}
