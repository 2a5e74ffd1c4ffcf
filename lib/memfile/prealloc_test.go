package memfile

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/checkpoint-restore/go-criu/v8/crit"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/vma"
	"golang.org/x/sys/unix"
)

// A process's own anonymous pages are found by the page-table scan: written pages, not
// the zero page a read maps, not page cache; the cap holds.
func TestAnonRuns(t *testing.T) {
	const n = 64
	m, err := unix.Mmap(-1, 0, n*int(pageSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	_ = unix.Madvise(m, unix.MADV_NOHUGEPAGE)
	for p := 0; p < 10; p++ {
		m[p*int(pageSize)] = 1
	}
	for p := 30; p < 34; p++ {
		m[p*int(pageSize)] = 1
	}
	var sink byte
	for p := 40; p < n; p++ {
		sink += m[p*int(pageSize)] // the shared zero page
	}
	_ = sink
	start := uint64(uintptr(unsafeSliceAddr(m)))
	in := func(runs []PreallocRun, page int) bool {
		a := start + uint64(page)*uint64(pageSize)
		for _, r := range runs {
			if r.Start <= a && a < r.End {
				return true
			}
		}
		return false
	}
	runs, total, err := AnonRuns(os.Getpid(), 1<<30)
	if err != nil {
		t.Fatalf("PAGEMAP_SCAN (kernel >= 6.7): %v", err)
	}
	for p := 0; p < n; p++ {
		want := p < 10 || (p >= 30 && p < 34)
		if in(runs, p) != want {
			t.Errorf("page %d found %v, want %v", p, !want, want)
		}
	}
	if total <= 14 {
		t.Errorf("total %d pages: the Go runtime's heap alone has more", total)
	}
	capped, got, err := AnonRuns(os.Getpid(), 5)
	if err != nil || got != 5 {
		t.Fatalf("capped at 5 pages: %d pages, %v", got, err)
	}
	var sum int64
	for _, r := range capped {
		sum += r.Pages()
	}
	if sum != 5 {
		t.Errorf("capped runs hold %d pages", sum)
	}
}

func TestPreallocName(t *testing.T) {
	name := PreallocName("snap1-x", 42)
	if pid, ok := ParsePreallocName("snap1-x", name); !ok || pid != 42 {
		t.Errorf("%s: %d %v", name, pid, ok)
	}
	for _, bad := range []string{"snap1-x-prealloc-042.mem", "snap1-x-prealloc-.mem", "snap1-x-prealloc-4/2.mem", "other-prealloc-42.mem", "snap1-x-prealloc-42"} {
		if _, ok := ParsePreallocName("snap1-x", bad); ok {
			t.Errorf("%s parsed", bad)
		}
	}
}

// A rewrite into a preallocated file gives the file a fresh rewrite gives, byte for byte
// and page for page allocated: pages preallocated but not in the checkpoint (freed
// before the freeze, zero, another process's) are punched out.
func TestRewriteIntoPreallocated(t *testing.T) {
	root := shmDir(t)
	build := func(name string) (img, family string) {
		img, family = filepath.Join(root, name, "img"), filepath.Join(root, name, "family")
		for _, d := range []string{img, family} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		t1 := synthTask{pid: 7}
		t1.vmas = []*vma.VmaEntry{
			vmaE(0, 8, statusAnon, anonPrivateFlag, 0, 0),                      // anon, 5 pages dumped
			vmaE(10, 12, statusAnon, anonPrivateFlag|unix.MAP_GROWSDOWN, 0, 0), // stack: stays
		}
		t1.pm = []*pagemap.PagemapEntry{pmE(1, 5), pmE(10, 2)}
		for _, p := range [][]byte{page('a'), page(0), page('b'), page('c'), page('d'), page('s'), page('t')} {
			t1.pages = append(t1.pages, p...)
		}
		writeSynth(t, img, []*crit.CriuEntry{}, t1)
		return img, family
	}
	img0, fam0 := build("fresh")
	plain, err := Rewrite(context.Background(), Options{CheckpointDir: img0, FamilyDir: fam0, Prefix: "p"})
	if err != nil {
		t.Fatal(err)
	}
	img, fam := build("prealloc")
	at := base
	pre := PreallocName("p", 7)
	// Every page of the VMAs, the stack's, and some far away (a mapping gone by the dump).
	if _, err := Preallocate(filepath.Join(fam, pre), []PreallocRun{{at, at + 12*ps}, {at + 100*ps, at + 110*ps}}, HugePagesAlways); err != nil {
		t.Fatal(err)
	}
	other := PreallocName("p", 8) // a process the checkpoint does not hold
	if _, err := Preallocate(filepath.Join(fam, other), []PreallocRun{{at, at + ps}}, HugePagesAlways); err != nil {
		t.Fatal(err)
	}
	res, err := Rewrite(context.Background(), Options{CheckpointDir: img, FamilyDir: fam, Prefix: "p",
		Prealloc: map[uint32]string{7: pre, 8: other}})
	if err != nil {
		t.Fatal(err)
	}
	if res.PreallocFiles != 1 || len(res.Files) != 1 || res.Files[0].Name != plain.Files[0].Name {
		t.Fatalf("result %+v", res)
	}
	if _, err := os.Stat(filepath.Join(fam, pre)); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", pre, err)
	}
	if _, err := os.Stat(filepath.Join(fam, other)); err != nil {
		t.Errorf("%s (not the rewrite's to take): %v", other, err)
	}
	got, want := filepath.Join(fam, res.Files[0].Name), filepath.Join(fam0, plain.Files[0].Name)
	for p := uint64(0); p < 120; p++ {
		if a, b := readPage(t, got, base/ps+p), readPage(t, want, base/ps+p); !bytes.Equal(a, b) {
			t.Errorf("page %d differs from a fresh rewrite's", p)
		}
	}
	if res.Files[0].Bytes != plain.Files[0].Bytes || res.Files[0].Bytes != 4*pageSize {
		t.Errorf("%d bytes allocated, a fresh rewrite %d, want %d", res.Files[0].Bytes, plain.Files[0].Bytes, 4*pageSize)
	}
	if !bytes.Equal(must(os.ReadFile(filepath.Join(img, "pages-7.img"))), must(os.ReadFile(filepath.Join(img0, "pages-7.img")))) {
		t.Error("pages image differs from a fresh rewrite's")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func unsafeSliceAddr(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// A checkpoint whose pages a page server placed in memory files (Options.Placed) is
// rewritten into the same memory files and checkpoint as one whose pages are in its pages
// images: library bytes go around the dumped pages, the pages that stay in the checkpoint
// move from the file into the pages image and out of the file.
func TestRewritePlacedPages(t *testing.T) {
	root := shmDir(t)
	lib := bytes.Join([][]byte{page('L'), page('M'), page('N'), page('O')}, nil)
	build := func(name string) (img, family, rootfs string, tasks []synthTask) {
		img, family, rootfs = filepath.Join(root, name, "img"), filepath.Join(root, name, "family"), filepath.Join(root, name, "rootfs")
		for _, d := range []string{img, family, filepath.Join(rootfs, "lib")} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(rootfs, "lib", "libfoo.so"), lib, 0o644); err != nil {
			t.Fatal(err)
		}
		t1 := synthTask{pid: 1}
		t1.vmas = []*vma.VmaEntry{
			vmaE(0, 8, statusAnon, anonPrivateFlag, 0, 0),                      // anon
			vmaE(10, 12, statusAnon, anonPrivateFlag|unix.MAP_GROWSDOWN, 0, 0), // stack: stays
			vmaE(16, 20, statusFilePriv, unix.MAP_PRIVATE, 1, 0),               // library data
		}
		t1.pm = []*pagemap.PagemapEntry{pmE(1, 3), pmE(5, 1), pmE(10, 2), pmE(17, 2)}
		for _, p := range [][]byte{page('a'), page('b'), page('c'), page('d'), page('s'), page('t'), page('D'), page('E')} {
			t1.pages = append(t1.pages, p...)
		}
		t2 := synthTask{pid: 2, ppid: 1}
		t2.vmas = []*vma.VmaEntry{vmaE(10, 12, statusAnon, anonPrivateFlag|unix.MAP_GROWSDOWN, 0, 0)}
		t2.pm = []*pagemap.PagemapEntry{pmE(11, 1)}
		t2.pages = page('u')
		tasks = []synthTask{t1, t2}
		writeSynth(t, img, []*crit.CriuEntry{regE(1, "/lib/libfoo.so", uint64(len(lib)))}, tasks...)
		return img, family, rootfs, tasks
	}
	opts := func(img, fam, rootfs string) Options {
		return Options{CheckpointDir: img, FamilyDir: fam, RootFS: rootfs, ConvertFilePrivate: true, Prefix: "p"}
	}
	img0, fam0, root0, _ := build("plain")
	plain, err := Rewrite(context.Background(), opts(img0, fam0, root0))
	if err != nil {
		t.Fatal(err)
	}
	// As a page server leaves it: each process's pages at their addresses in a file,
	// pages images empty.
	img, fam, rootfs, tasks := build("placed")
	placed := map[uint32]string{}
	for _, tk := range tasks {
		name := PreallocName("p", tk.pid)
		f, err := os.OpenFile(filepath.Join(fam, name), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o400)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(AnonFileSize); err != nil {
			t.Fatal(err)
		}
		var src int64
		for _, e := range tk.pm {
			n := int64(pagesIn(e)) * pageSize
			if _, err := f.WriteAt(tk.pages[src:src+n], int64(e.GetVaddr())); err != nil {
				t.Fatal(err)
			}
			src += n
		}
		f.Close()
		if err := os.Truncate(filepath.Join(img, fmt.Sprintf("pages-%d.img", tk.pid)), 0); err != nil {
			t.Fatal(err)
		}
		placed[tk.pid] = name
	}
	o := opts(img, fam, rootfs)
	o.Placed = placed
	res, err := Rewrite(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Files) != 1 || res.Files[0].Name != plain.Files[0].Name || res.PagesMoved != plain.PagesMoved || res.PagesKept != plain.PagesKept {
		t.Fatalf("result %+v, a plain rewrite's %+v", res, plain)
	}
	got, want := filepath.Join(fam, res.Files[0].Name), filepath.Join(fam0, plain.Files[0].Name)
	for p := uint64(0); p < 24; p++ {
		if a, b := readPage(t, got, base/ps+p), readPage(t, want, base/ps+p); !bytes.Equal(a, b) {
			t.Errorf("page %d: %q..., a plain rewrite's %q...", p, a[:2], b[:2])
		}
	}
	if res.Files[0].Bytes != plain.Files[0].Bytes {
		t.Errorf("%d bytes allocated, a plain rewrite's %d (the stack's pages must leave the file)", res.Files[0].Bytes, plain.Files[0].Bytes)
	}
	for _, name := range []string{"pages-1.img", "pages-2.img", "pagemap-1.img", "mm-1.img", "files.img"} {
		if !bytes.Equal(must(os.ReadFile(filepath.Join(img, name))), must(os.ReadFile(filepath.Join(img0, name)))) {
			t.Errorf("%s differs from a plain rewrite's", name)
		}
	}
	// Process 2 converts nothing (a plain rewrite leaves its pagemap as it was); its pages
	// come back from the placed file into its pages image, with the same entries.
	a, b := loadPM(t, img, 2), loadPM(t, img0, 2)
	if len(a) != 1 || len(b) != 1 || a[0].GetVaddr() != b[0].GetVaddr() || pagesIn(a[0]) != pagesIn(b[0]) || a[0].GetFlags() != b[0].GetFlags() {
		t.Errorf("pagemap-2 %v, a plain rewrite's %v", a, b)
	}
	if _, err := os.Stat(filepath.Join(fam, placed[1])); !os.IsNotExist(err) {
		t.Errorf("process 1's placed file is still there under its old name: %v", err)
	}
}
