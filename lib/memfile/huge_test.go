package memfile

import (
	"bytes"
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
