package memfile

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/vma"
	"golang.org/x/sys/unix"
)

// With HugePages a rewrite makes each 2 MiB stretch of anonymous memory that is at least
// 3/4 non-zero data one huge page before copying into it, wherever the kernel has huge
// tmpfs pages; sparse stretches, and stretches dense only with dumped zero pages, keep
// small pages and holes; the bytes read back unchanged; a fork maps the huge stretches
// with PMDs. Without it (the default) every stretch stays small.
func TestRewriteMakesDenseStretchesHuge(t *testing.T) {
	_, thp := os.Stat("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
	per := hugeAlign / pageSize // pages per stretch
	// Stretch 0: all data; 1: 448 data pages then 64 dumped zero pages; 2: 300 data pages
	// then 212 zero pages (dumped whole, but not dense with data); 3: 100 data pages.
	data := []int64{per, 448, 300, 100}
	dumped := []int64{per, per, per, 100}
	content := func(s, i int64) []byte { return page(byte('a' + s*13 + i%11)) }
	build := func(t *testing.T) (img, family string) {
		img, family, _ = synthDirs(t, "lib")
		tk := synthTask{pid: 1, vmas: []*vma.VmaEntry{vmaE(0, uint64(4*per), statusAnon, anonPrivateFlag, 0, 0)}}
		for s := range data {
			tk.pm = append(tk.pm, pmE(uint64(int64(s)*per), uint32(dumped[s])))
			for i := int64(0); i < dumped[s]; i++ {
				if i < data[s] {
					tk.pages = append(tk.pages, content(int64(s), i)...)
				} else {
					tk.pages = append(tk.pages, page(0)...)
				}
			}
		}
		writeSynth(t, img, nil, tk)
		return img, family
	}
	for _, small := range []bool{false, true} {
		t.Run(fmt.Sprintf("small=%v", small), func(t *testing.T) {
			img, family := build(t)
			res, err := Rewrite(context.Background(), Options{CheckpointDir: img, FamilyDir: family, Prefix: "h", HugePages: !small})
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(family, "h-10000000-anon.mem")
			wantHuge, wantBytes := 2, int64(2*hugeAlign+400*pageSize)
			if small || thp != nil {
				wantHuge, wantBytes = 0, (per+448+300+100)*pageSize
			}
			t.Logf("%d huge pages, %d bytes allocated", res.HugePages, allocated(t, path))
			if res.HugePages != wantHuge || allocated(t, path) != wantBytes {
				t.Errorf("%d huge pages, %d bytes allocated; want %d and %d (only the 2 stretches dense with data are huge)",
					res.HugePages, allocated(t, path), wantHuge, wantBytes)
			}
			if res.BytesWritten != (per+448+300+100)*pageSize {
				t.Errorf("%d bytes written, want the data pages once", res.BytesWritten)
			}
			at := base / ps
			for s := range data {
				for _, i := range []int64{0, data[s] - 1, min(data[s], per-1), per - 1} {
					want := page(0)
					if i < data[s] {
						want = content(int64(s), i)
					}
					if got := readPage(t, path, at+uint64(int64(s)*per+i)); !bytes.Equal(got, want) {
						t.Errorf("stretch %d page %d reads %q..., want %q...", s, i, got[:2], want[:2])
					}
				}
			}
			if !isHole(t, path, at+2*uint64(per)+300) {
				t.Error("a zero page of a sparse stretch was allocated")
			}
			if pmd := pmdMapped(t, path, 4*hugeAlign); pmd != int64(wantHuge)*hugeAlign>>10 {
				t.Errorf("a private mapping of the file maps %d kB with PMDs, want %d", pmd, int64(wantHuge)*hugeAlign>>10)
			}
		})
	}
}

var readSink byte // reads stored here are not optimised away

// pmdMapped maps path's first n bytes from base MAP_PRIVATE, read-only, at an address that
// agrees with base modulo 2 MiB (as CRIU restores a memory file), reads a byte of each
// 2 MiB, and returns the mapping's ShmemPmdMapped (kB) from /proc/self/smaps.
func pmdMapped(t *testing.T, path string, n int64) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := unix.MmapPtr(-1, 0, nil, uintptr(n+hugeAlign), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.MunmapPtr(res, uintptr(n+hugeAlign))
	aligned := unsafe.Add(res, -uintptr(res)&(hugeAlign-1))
	addr, err := unix.MmapPtr(int(f.Fd()), int64(base), aligned, uintptr(n), unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_FIXED)
	if err != nil {
		t.Fatal(err)
	}
	m := unsafe.Slice((*byte)(addr), n)
	for off := int64(0); off < n; off += hugeAlign {
		readSink += m[off]
	}
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	head := fmt.Sprintf("%x-", uintptr(addr))
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if strings.Contains(fields[0], "-") && len(fields) >= 5 {
			in = strings.HasPrefix(fields[0], head)
			continue
		}
		if in && fields[0] == "ShmemPmdMapped:" {
			v, _ := strconv.ParseInt(fields[1], 10, 64)
			return v
		}
	}
	t.Fatalf("no smaps entry for the mapping at %s", head)
	return 0
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
	got, err := Preallocate(path, runs, HugePagesAlways)
	if err != nil {
		t.Fatal(err)
	}
	n, made := got.Bytes, got.HugePages
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

// With HugePagesWhileFast, once a huge page comes more slowly than small pages would
// (here: any, with the threshold at a nanosecond) Preallocate stops making them and
// allocates the remaining dense stretches in small pages, all of them, reading as zeros;
// HugePagesAlways makes every one however slowly; NoHugePages none.
func TestPreallocateStopsMakingSlowHugePages(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/shmem_enabled"); err != nil {
		t.Skip("no huge tmpfs pages on this kernel")
	}
	saved := slowHugePage
	slowHugePage = time.Nanosecond
	t.Cleanup(func() { slowHugePage = saved })
	const stretches = 8
	runs := []PreallocRun{{uint64(base), uint64(base) + stretches*hugeAlign}}
	for _, c := range []struct {
		policy       HugePolicy
		minHuge, max int
		slow         bool
	}{
		// Two workers start a batch of one stretch each before either is timed.
		{HugePagesWhileFast, 1, 2, true},
		{HugePagesAlways, stretches, stretches, false},
		{NoHugePages, 0, 0, false},
	} {
		path := filepath.Join(shmDir(t), fmt.Sprintf("p%d.mem", c.policy))
		got, err := Preallocate(path, runs, c.policy)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("policy %d: %+v", c.policy, got)
		if got.HugePages < c.minHuge || got.HugePages > c.max || got.HugeSlow != c.slow {
			t.Errorf("policy %d: %d huge pages (slow: %v), want %d to %d (slow: %v)", c.policy, got.HugePages, got.HugeSlow, c.minHuge, c.max, c.slow)
		}
		if want := int64(stretches * hugeAlign); got.Bytes != want || allocated(t, path) != want {
			t.Errorf("policy %d: %d bytes allocated (file: %d), want every stretch's %d", c.policy, got.Bytes, allocated(t, path), want)
		}
		if kb := pmdMapped(t, path, stretches*hugeAlign); kb != int64(got.HugePages)*hugeAlign>>10 {
			t.Errorf("policy %d: %d kB mapped by PMDs, want the %d huge pages'", c.policy, kb, got.HugePages)
		}
		for _, p := range []uint64{0, 511, 512*3 + 9, stretches*512 - 1} {
			if !bytes.Equal(readPage(t, path, uint64(base)/ps+p), page(0)) {
				t.Errorf("policy %d: page %d does not read as zeros", c.policy, p)
			}
		}
	}
}

// CollapseDense makes a file's dense stretches, written in small pages, huge pages in
// place: the bytes read the same (through a mapping made before too), the sparse stretch
// stays small, and a new mapping maps the dense ones with PMDs.
func TestCollapseDense(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/shmem_enabled"); err != nil {
		t.Skip("no huge tmpfs pages on this kernel")
	}
	h, pg := int64(hugeAlign), int64(ps)
	path := filepath.Join(shmDir(t), "c.mem")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(AnonFileSize); err != nil {
		t.Fatal(err)
	}
	// Stretch 0: 512 pages of data; 1: 400 (dense); 2: 100 (sparse).
	content := func(s, i int64) []byte { return page(byte('a' + (s*7+i)%23)) }
	for s, n := range []int64{512, 400, 100} {
		for i := int64(0); i < n; i++ {
			if _, err := f.WriteAt(content(int64(s), i), int64(base)+int64(s)*h+i*pg); err != nil {
				t.Fatal(err)
			}
		}
	}
	before := allocated(t, path)
	old, err := unix.Mmap(int(f.Fd()), int64(base), int(3*h), unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(old)
	readSink += old[0] + old[h] + old[2*h]
	if kb := pmdMapped(t, path, 3*h); kb != 0 {
		t.Fatalf("%d kB mapped by PMDs before the collapse, want none (small pages)", kb)
	}
	made, err := CollapseDense(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if made != 2 {
		t.Errorf("%d stretches collapsed, want the 2 dense ones", made)
	}
	if kb := pmdMapped(t, path, 3*h); kb != 2*h>>10 {
		t.Errorf("%d kB mapped by PMDs after the collapse, want the two dense stretches' %d", kb, 2*h>>10)
	}
	if got, want := allocated(t, path), before+112*pg; got != want {
		t.Errorf("%d bytes allocated after the collapse, want %d (the dense stretch's 112 holes now zeros)", got, want)
	}
	for s, n := range []int64{512, 400, 100} {
		for _, i := range []int64{0, n / 2, n - 1} {
			want := content(int64(s), i)
			at := int64(s)*h + i*pg
			if got := readPage(t, path, uint64(base+uint64(at))/ps); !bytes.Equal(got, want) {
				t.Errorf("stretch %d page %d reads %q..., want %q...", s, i, got[:2], want[:2])
			}
			if !bytes.Equal(old[at:at+pg], want) {
				t.Errorf("stretch %d page %d reads %q... through the old mapping", s, i, old[at:at+2])
			}
		}
	}
	if !bytes.Equal(readPage(t, path, (base+uint64(h)+450*ps)/ps), page(0)) {
		t.Errorf("a hole of the dense stretch does not read as zeros")
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
