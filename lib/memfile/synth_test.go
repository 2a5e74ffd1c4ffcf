package memfile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v8/crit"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/fown"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/inventory"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/regfile"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/vma"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// These tests build small image directories with crit itself (the same encoder CRIU's
// images round-trip through) and need neither root nor CRIU. They pin down the page
// accounting; criu_test.go proves that CRIU restores the result.

const base = uint64(0x10000000)

var ps = uint64(pageSize)

func page(b byte) []byte { return bytes.Repeat([]byte{b}, int(pageSize)) }

type synthTask struct {
	pid   uint32
	ppid  uint32
	vmas  []*vma.VmaEntry
	pm    []*pagemap.PagemapEntry
	pages []byte
}

func vmaE(startPage, endPage uint64, status, flags uint32, shmid, pgoff uint64) *vma.VmaEntry {
	return &vma.VmaEntry{
		Start: proto.Uint64(base + startPage*ps), End: proto.Uint64(base + endPage*ps),
		Pgoff: proto.Uint64(pgoff), Shmid: proto.Uint64(shmid),
		Prot: proto.Uint32(unix.PROT_READ | unix.PROT_WRITE), Flags: proto.Uint32(flags),
		Status: proto.Uint32(status), Fd: proto.Int64(-1),
	}
}

func pmE(startPage uint64, n uint32) *pagemap.PagemapEntry {
	return &pagemap.PagemapEntry{Vaddr: proto.Uint64(base + startPage*ps), CompatNrPages: proto.Uint32(n), Flags: proto.Uint32(pePresent | 2)}
}

func regE(id uint32, name string, size uint64) *crit.CriuEntry {
	z := proto.Uint32(0)
	return &crit.CriuEntry{Message: &fdinfo.FileEntry{
		Type: fdinfo.FdTypes_REG.Enum(), Id: proto.Uint32(id),
		Reg: &regfile.RegFileEntry{Id: proto.Uint32(id), Flags: z, Pos: proto.Uint64(0),
			Fown: &fown.FownEntry{Uid: z, Euid: z, Signum: z, PidType: z, Pid: z},
			Name: proto.String(name), Size: proto.Uint64(size)},
	}}
}

func writeSynth(t *testing.T, dir string, files []*crit.CriuEntry, tasks ...synthTask) {
	t.Helper()
	put := func(name string, img *crit.CriuImage) {
		if err := storeImage(filepath.Join(dir, name), img); err != nil {
			t.Fatal(err)
		}
	}
	put("inventory.img", &crit.CriuImage{Magic: "INVENTORY", Entries: []*crit.CriuEntry{{Message: &inventory.InventoryEntry{ImgVersion: proto.Uint32(2)}}}})
	var pst []*crit.CriuEntry
	for _, tk := range tasks {
		pst = append(pst, &crit.CriuEntry{Message: &pstree.PstreeEntry{Pid: proto.Uint32(tk.pid), Ppid: proto.Uint32(tk.ppid), Pgid: proto.Uint32(1), Sid: proto.Uint32(1)}})
		m := &mm.MmEntry{
			MmStartCode: proto.Uint64(0), MmEndCode: proto.Uint64(0), MmStartData: proto.Uint64(0), MmEndData: proto.Uint64(0),
			MmStartStack: proto.Uint64(0), MmStartBrk: proto.Uint64(0), MmBrk: proto.Uint64(0), MmArgStart: proto.Uint64(0),
			MmArgEnd: proto.Uint64(0), MmEnvStart: proto.Uint64(0), MmEnvEnd: proto.Uint64(0), ExeFileId: proto.Uint32(0),
			Vmas: tk.vmas,
		}
		put(fmt.Sprintf("mm-%d.img", tk.pid), &crit.CriuImage{Magic: "MM", Entries: []*crit.CriuEntry{{Message: m}}})
		pm := &crit.CriuImage{Magic: "PAGEMAP", Entries: []*crit.CriuEntry{{Message: &pagemap.PagemapHead{PagesId: proto.Uint32(tk.pid)}}}}
		for _, e := range tk.pm {
			pm.Entries = append(pm.Entries, &crit.CriuEntry{Message: e})
		}
		put(fmt.Sprintf("pagemap-%d.img", tk.pid), pm)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("pages-%d.img", tk.pid)), tk.pages, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("pstree.img", &crit.CriuImage{Magic: "PSTREE", Entries: pst})
	put("files.img", &crit.CriuImage{Magic: "FILES", Entries: files})
}

func shmDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("/dev/shm", "lazyfork-test-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func readPage(t *testing.T, path string, n uint64) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, pageSize)
	if _, err := f.ReadAt(b, int64(n*ps)); err != nil {
		t.Fatal(err)
	}
	return b
}

func isHole(t *testing.T, path string, n uint64) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data, err := unix.Seek(int(f.Fd()), int64(n*ps), unix.SEEK_DATA)
	return errors.Is(err, unix.ENXIO) || (err == nil && data >= int64((n+1)*ps))
}

func loadMM(t *testing.T, dir string, pid int) []*vma.VmaEntry {
	img, err := loadImage(dir, fmt.Sprintf("mm-%d.img", pid), "MM", &mm.MmEntry{})
	if err != nil {
		t.Fatal(err)
	}
	return img.Entries[0].Message.(*mm.MmEntry).GetVmas()
}

func loadPM(t *testing.T, dir string, pid int) []*pagemap.PagemapEntry {
	img, err := loadImage(dir, fmt.Sprintf("pagemap-%d.img", pid), "PAGEMAP", &pagemap.PagemapHead{})
	if err != nil {
		t.Fatal(err)
	}
	var out []*pagemap.PagemapEntry
	for _, e := range img.Entries[1:] {
		out = append(out, e.Message.(*pagemap.PagemapEntry))
	}
	return out
}

func loadFiles(t *testing.T, dir string) map[uint32]*fdinfo.FileEntry {
	img, err := loadImage(dir, "files.img", "FILES", &fdinfo.FileEntry{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint32]*fdinfo.FileEntry{}
	for _, e := range img.Entries {
		fe := e.Message.(*fdinfo.FileEntry)
		out[fe.GetId()] = fe
	}
	return out
}

// synthDirs makes a checkpoint directory, a family directory and a root file system with
// the directory sub, on tmpfs, for a rewrite of a synthetic checkpoint.
func synthDirs(t *testing.T, sub string) (img, family, rootfs string) {
	t.Helper()
	root := shmDir(t)
	img, family, rootfs = filepath.Join(root, "img"), filepath.Join(root, "family"), filepath.Join(root, "rootfs")
	for _, d := range []string{img, family, filepath.Join(rootfs, sub)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return img, family, rootfs
}

func TestRewriteSynthetic(t *testing.T) {
	img, family, rootfs := synthDirs(t, "lib")
	// The library: 6 pages 'L'+i. A symlink in the rootfs must resolve inside it.
	var lib []byte
	for i := 0; i < 6; i++ {
		lib = append(lib, page(byte('L'+i))...)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "lib", "libfoo.so.1"), lib, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/lib/libfoo.so.1", filepath.Join(rootfs, "lib", "libfoo.so")); err != nil {
		t.Fatal(err)
	}
	const wipe = 1 << unix.MADV_WIPEONFORK
	t1 := synthTask{pid: 1}
	t1.vmas = []*vma.VmaEntry{
		vmaE(0, 4, statusAnon, anonPrivateFlag, 0, 0),                      // 0: anon
		vmaE(4, 8, statusHeap, anonPrivateFlag, 0, 0),                      // 1: brk heap
		vmaE(10, 12, statusAnon, anonPrivateFlag|unix.MAP_GROWSDOWN, 0, 0), // 2: stack
		vmaE(12, 13, statusAnon, anonPrivateFlag, 0, 0),                    // 3: wipe-on-fork
		vmaE(16, 20, statusFilePriv, unix.MAP_PRIVATE, 1, ps),              // 4: library data
		vmaE(24, 26, statusAnon, anonPrivateFlag, 0, 0),                    // 5: no pages
		vmaE(30, 31, statusAnon, anonPrivateFlag|unix.MAP_NORESERVE, 0, 0), // 6: thread arena
		vmaE(31, 32, statusAnon|1<<12, anonPrivateFlag, 0, 0),              // 7: vvar-like
	}
	t1.vmas[3].Madv = proto.Uint64(wipe)
	t1.pm = []*pagemap.PagemapEntry{pmE(2, 4), pmE(10, 3), pmE(17, 2), pmE(30, 2)}
	for _, p := range [][]byte{page('a'), page(0), page('b'), page('c'), page('s'), page('t'), page('w'), page('D'), page(0), page('n'), page('v')} {
		t1.pages = append(t1.pages, p...)
	}
	t2 := synthTask{pid: 2, vmas: []*vma.VmaEntry{vmaE(0, 2, statusAnon, anonPrivateFlag, 0, 0)}, pm: []*pagemap.PagemapEntry{pmE(0, 2)}}
	t2.pages = append(page('x'), page('y')...)
	writeSynth(t, img, []*crit.CriuEntry{regE(1, "/lib/libfoo.so", uint64(len(lib)))}, t1, t2)

	res, err := Rewrite(context.Background(), Options{CheckpointDir: img, FamilyDir: family, RootFS: rootfs, ConvertFilePrivate: true, Prefix: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if res.VMAsConverted != 4 || res.FileVMAsConverted != 1 || res.PagesMoved != 9 || res.PagesKept != 4 {
		t.Errorf("result %+v", res)
	}
	// One memory file per process, whatever its number of mappings, anonymous or not.
	want := map[string]string{
		"p-1-10000000-anon.mem": "anon",
		"p-2-10000000-anon.mem": "anon",
	}
	if len(res.Files) != len(want) {
		t.Fatalf("files %+v", res.Files)
	}
	for _, f := range res.Files {
		if want[f.Name] != f.Kind {
			t.Errorf("unexpected file %+v", f)
		}
	}
	if strings.Join(res.References, ",") != "p-1-10000000-anon.mem,p-2-10000000-anon.mem" {
		t.Errorf("references %v", res.References)
	}
	fp := func(name string) string { return filepath.Join(family, name) }
	at := base / ps // anonymous memory lies at its own address in the file
	// The pagemap entry across the anon/heap boundary was split; the zero page is a hole.
	if !bytes.Equal(readPage(t, fp("p-1-10000000-anon.mem"), at+2), page('a')) || !isHole(t, fp("p-1-10000000-anon.mem"), at+3) {
		t.Error("anon file content")
	}
	// The heap VMA at 0x10004000 lies in the same file, 4 pages further.
	if !bytes.Equal(readPage(t, fp("p-1-10000000-anon.mem"), at+4), page('b')) || !bytes.Equal(readPage(t, fp("p-1-10000000-anon.mem"), at+5), page('c')) {
		t.Error("heap content in the process's anonymous memory file")
	}
	// Library bytes from pgoff, dumped pages over them, a dumped zero page punched, at the
	// VMA's own address (page 16) in the same file.
	libf := fp("p-1-10000000-anon.mem")
	for i, wantPage := range [][]byte{page('M'), page('D'), page(0), page('P')} {
		if got := readPage(t, libf, at+16+uint64(i)); !bytes.Equal(got, wantPage) {
			t.Errorf("library page %d = %q..., want %q...", i, got[:4], wantPage[:4])
		}
	}
	if !isHole(t, libf, at+18) || !isHole(t, libf, at+20) {
		t.Error("zero page over library bytes was not punched, or bytes past the VMA were copied")
	}
	if st, _ := os.Stat(fp("p-2-10000000-anon.mem")); st.Size() != AnonFileSize {
		t.Errorf("anon file size %d", st.Size())
	}

	vmas := loadMM(t, img, 1)
	files := loadFiles(t, img)
	for i, v := range vmas {
		converted := i == 0 || i == 1 || i == 4 || i == 6
		if !converted {
			if !proto.Equal(v, t1.vmas[i]) {
				t.Errorf("VMA %d changed: %v", i, v)
			}
			continue
		}
		fe := files[uint32(v.GetShmid())]
		wantPgoff := v.GetStart() // file offset = address, the library's copy too
		if v.GetStatus() != statusFilePriv || v.GetPgoff() != wantPgoff || v.GetFdflags() != 0 || v.Fdflags == nil || fe == nil ||
			v.GetShmid() != vmas[0].GetShmid() {
			t.Errorf("VMA %d: %v", i, v)
			continue
		}
		wantFlags := t1.vmas[i].GetFlags() &^ unix.MAP_ANONYMOUS
		if v.GetFlags() != wantFlags {
			t.Errorf("VMA %d flags %#x, want %#x", i, v.GetFlags(), wantFlags)
		}
		reg := fe.GetReg()
		if !strings.HasPrefix(reg.GetName(), DefaultMountPath+"/p-1-") || reg.MntId != nil || len(reg.BuildId) != 0 || reg.GetFlags() != 0 {
			t.Errorf("VMA %d file entry %v", i, reg)
		}
	}
	if files[1].GetReg().GetName() != "/lib/libfoo.so" {
		t.Error("the library's own entry must stay")
	}
	pm := loadPM(t, img, 1)
	if len(pm) != 3 || pm[0].GetVaddr() != base+10*ps || pm[0].GetNrPages() != 2 || pm[1].GetVaddr() != base+12*ps ||
		pm[1].GetNrPages() != 1 || pm[1].GetFlags() != pePresent|2 || pm[2].GetVaddr() != base+31*ps || pm[2].GetNrPages() != 1 {
		t.Errorf("pagemap-1 %v", pm)
	}
	pages, _ := os.ReadFile(filepath.Join(img, "pages-1.img"))
	if !bytes.Equal(pages, bytes.Join([][]byte{page('s'), page('t'), page('w'), page('v')}, nil)) {
		t.Errorf("pages-1.img holds %d bytes, not the stack, wipe-on-fork and vvar pages", len(pages))
	}
	if pm := loadPM(t, img, 2); len(pm) != 0 {
		t.Errorf("pagemap-2 %v", pm)
	}
	for _, e := range listDir(t, img) {
		if strings.HasPrefix(e, ".lf-") {
			t.Errorf("left %s", e)
		}
	}
}

func TestRewriteDeltaSynthetic(t *testing.T) {
	root := shmDir(t)
	family := filepath.Join(root, "family")
	os.Mkdir(family, 0o755)
	// A family file as a first rewrite made it: pages 0-3 'B', sparse to 2^47.
	baseName := "s1-10000000-anon.mem"
	bf, err := os.Create(filepath.Join(family, baseName))
	if err != nil {
		t.Fatal(err)
	}
	bf.Truncate(AnonFileSize)
	for i := 0; i < 4; i++ {
		bf.WriteAt(page('B'), int64(i)*int64(pageSize))
	}
	bf.Close()
	mk := func(name string) string {
		img := filepath.Join(root, name)
		os.Mkdir(img, 0o755)
		tk := synthTask{pid: 1, vmas: []*vma.VmaEntry{vmaE(0, 8, statusFilePriv, unix.MAP_PRIVATE, 7, 0)}, pm: []*pagemap.PagemapEntry{pmE(1, 2)}}
		tk.pages = append(page('X'), page(0)...)
		writeSynth(t, img, []*crit.CriuEntry{regE(7, DefaultMountPath+"/"+baseName, uint64(AnonFileSize))}, tk)
		return img
	}

	img := mk("delta")
	was := dirState(t, img)
	res, err := Rewrite(context.Background(), Options{CheckpointDir: img, FamilyDir: family, Prefix: "s2"})
	if err != nil {
		t.Fatal(err)
	}
	if res.SharedPages != 4 || res.DeltaPages != 2 || res.PagesKept != 2 || len(res.Files) != 0 || strings.Join(res.References, ",") != baseName {
		t.Errorf("delta result %+v", res)
	}
	sameState(t, "delta image", was, dirState(t, img))

	img = mk("rebase")
	res, err = Rewrite(context.Background(), Options{CheckpointDir: img, FamilyDir: family, Prefix: "s3", Rebase: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.VMAsRebased != 1 || len(res.Files) != 1 || res.Files[0].Name != "s3-10000000-anon.mem" || res.Files[0].Kind != "anon" || res.PagesKept != 0 {
		t.Fatalf("rebase result %+v", res)
	}
	nf := filepath.Join(family, res.Files[0].Name)
	at := base / ps // the rebased VMA lies at its own address in the new file
	for i, wantPage := range [][]byte{page('B'), page('X'), page(0), page('B')} {
		if got := readPage(t, nf, at+uint64(i)); !bytes.Equal(got, wantPage) {
			t.Errorf("rebased page %d = %q...", i, got[:4])
		}
	}
	if !isHole(t, nf, at+2) || !isHole(t, nf, at+4) {
		t.Error("rebased file should have holes at the zero delta page and past the base data")
	}
	if st, _ := os.Stat(nf); st.Size() != AnonFileSize {
		t.Errorf("rebased size %d", st.Size())
	}
	v := loadMM(t, img, 1)[0]
	if fe := loadFiles(t, img)[uint32(v.GetShmid())]; fe.GetReg().GetName() != DefaultMountPath+"/s3-10000000-anon.mem" {
		t.Errorf("rebased VMA maps %v", fe)
	}
	if strings.Join(res.References, ",") != "s3-10000000-anon.mem" {
		t.Errorf("references %v", res.References)
	}

	// A delta whose family file is gone cannot be restored: say so.
	img = mk("orphan")
	empty := filepath.Join(root, "empty")
	os.Mkdir(empty, 0o755)
	if _, err := Rewrite(context.Background(), Options{CheckpointDir: img, FamilyDir: empty, Prefix: "x"}); err == nil || !strings.Contains(err.Error(), baseName) {
		t.Errorf("missing family file: %v", err)
	}
}

func TestAllocatorsSynthetic(t *testing.T) {
	root := shmDir(t)
	img, family := filepath.Join(root, "img"), filepath.Join(root, "family")
	os.Mkdir(img, 0o755)
	os.Mkdir(family, 0o755)
	tk := synthTask{pid: 1, vmas: []*vma.VmaEntry{
		vmaE(0, 2, statusFilePriv, unix.MAP_PRIVATE, 3, 0),
		vmaE(2, 4, statusAnon, anonPrivateFlag, 0, 0),
	}, pm: []*pagemap.PagemapEntry{pmE(2, 1)}, pages: page('h')}
	writeSynth(t, img, []*crit.CriuEntry{regE(3, "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", 8192)}, tk)
	got, err := Detect(img)
	if err != nil || strings.Join(got, ",") != "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2" {
		t.Fatalf("Detect = %v, %v", got, err)
	}
	if _, err := Rewrite(context.Background(), Options{CheckpointDir: img, FamilyDir: family}); !errors.Is(err, ErrAllocator) {
		t.Fatalf("err = %v, want ErrAllocator", err)
	}
	if res, err := Rewrite(context.Background(), Options{CheckpointDir: img, FamilyDir: family, AllowAllocators: true}); err != nil || res.VMAsConverted != 1 {
		t.Fatalf("AllowAllocators: %+v, %v", res, err)
	}
}

func TestNotACheckpoint(t *testing.T) {
	dir := t.TempDir()
	_, err := Rewrite(context.Background(), Options{CheckpointDir: dir, FamilyDir: dir})
	want := dir + " is not a checkpoint (no inventory.img: not a CRIU image directory); pass the checkpoint dir printed by lf-dump"
	if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, ErrNotCheckpoint) {
		t.Fatalf("err = %v", err)
	}
	if _, err := Detect(dir); !errors.Is(err, ErrNotCheckpoint) {
		t.Fatalf("Detect: %v", err)
	}
	// An inventory that is not one.
	os.WriteFile(filepath.Join(dir, "inventory.img"), []byte("hello, world"), 0o644)
	if _, err := Detect(dir); err == nil || !strings.Contains(err.Error(), "inventory.img") {
		t.Fatalf("Detect on junk: %v", err)
	}
}

func TestFamilyDirMustBeTmpfs(t *testing.T) {
	root := shmDir(t)
	img := filepath.Join(root, "img")
	os.Mkdir(img, 0o755)
	writeSynth(t, img, nil, synthTask{pid: 1})
	disk := t.TempDir()
	var sfs unix.Statfs_t
	if unix.Statfs(disk, &sfs) == nil && sfs.Type == unix.TMPFS_MAGIC {
		t.Skip("the temp dir is on tmpfs here")
	}
	if _, err := Rewrite(context.Background(), Options{CheckpointDir: img, FamilyDir: disk}); err == nil || !strings.Contains(err.Error(), "not on tmpfs") {
		t.Fatalf("err = %v", err)
	}
}

func TestTailOf(t *testing.T) {
	for in, want := range map[string]string{
		"s1-7f9fb4237000-anon.mem":                           "anon.mem",
		"055bf112e881-7f9fb4237000-ld-linux-x86-64.so.2.mem": "ld-linux-x86-64.so.2.mem",
		"snap-055bf112e881-7f9fb4237000-libc.so.6.mem":       "libc.so.6.mem",
		"odd.mem": "odd.mem",
	} {
		if got := tailOf(in); got != want {
			t.Errorf("tailOf(%q) = %q, want %q", in, got, want)
		}
	}
}

// CRIU 4.2 writes the page count in field 5 (nr_pages) and leaves field 2 at 0: the rewrite
// must read field 5, and write both so that CRIU 4.1 and 4.2 read the same count.
func TestRewriteReadsCRIU42PageCounts(t *testing.T) {
	for _, layout := range []string{"criu-4.1", "criu-4.2"} {
		t.Run(layout, func(t *testing.T) {
			img, family := t.TempDir(), shmDir(t)
			entry := func(startPage uint64, n uint32) *pagemap.PagemapEntry {
				e := pmE(startPage, n)
				if layout == "criu-4.2" {
					e.CompatNrPages, e.NrPages = proto.Uint32(0), proto.Uint64(uint64(n))
				}
				return e
			}
			tk := synthTask{pid: 1, vmas: []*vma.VmaEntry{
				vmaE(0, 4, statusAnon, anonPrivateFlag, 0, 0),
				vmaE(8, 9, statusAnon|1<<12, anonPrivateFlag, 0, 0), // vvar-like: kept in the image
			}, pm: []*pagemap.PagemapEntry{entry(0, 3), entry(8, 1)}}
			for _, b := range []byte{'a', 'b', 'c', 'v'} {
				tk.pages = append(tk.pages, page(b)...)
			}
			writeSynth(t, img, nil, tk)
			res, err := Rewrite(context.Background(), Options{CheckpointDir: img, FamilyDir: family, Prefix: "p"})
			if err != nil {
				t.Fatal(err)
			}
			if res.VMAsConverted != 1 || res.PagesMoved != 3 || res.PagesKept != 1 {
				t.Fatalf("result %+v: the anonymous VMA's 3 pages must move to a memory file", res)
			}
			if got := readPage(t, filepath.Join(family, res.Files[0].Name), base/ps+2); !bytes.Equal(got, page('c')) {
				t.Errorf("memory file page 2 = %q...", got[:4])
			}
			pm := loadPM(t, img, 1)
			if len(pm) != 1 || pm[0].GetCompatNrPages() != 1 || pm[0].GetNrPages() != 1 || pm[0].GetVaddr() != base+8*ps {
				t.Errorf("kept pagemap %v: want one entry of 1 page in both count fields", pm)
			}
		})
	}
}

// Pages the pagemap does not account for (a layout the rewrite does not know reads as 0
// pages) must stop the rewrite, not turn every fork into a full copy.
func TestRewriteRefusesUnaccountedPages(t *testing.T) {
	img, family := t.TempDir(), shmDir(t)
	e := pmE(0, 2)
	e.CompatNrPages = proto.Uint32(0) // a count in a field this reader does not look at
	tk := synthTask{pid: 1, vmas: []*vma.VmaEntry{vmaE(0, 4, statusAnon, anonPrivateFlag, 0, 0)},
		pm: []*pagemap.PagemapEntry{e}, pages: append(page('a'), page('b')...)}
	writeSynth(t, img, nil, tk)
	before := listDir(t, img)
	_, err := Rewrite(context.Background(), Options{CheckpointDir: img, FamilyDir: family, Prefix: "p"})
	if !errors.Is(err, ErrUnaccounted) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("err = %v, want one line wrapping ErrUnaccounted", err)
	}
	if after := listDir(t, img); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Errorf("checkpoint dir changed: %v -> %v", before, after)
	}
	if left := listDir(t, family); len(left) != 0 {
		t.Errorf("family dir holds %v after a refused rewrite", left)
	}
}

// Inspect explains each VMA's fate and the page accounting, and writes nothing.
func TestInspectSynthetic(t *testing.T) {
	img, family := t.TempDir(), shmDir(t)
	tk := synthTask{pid: 1, vmas: []*vma.VmaEntry{
		vmaE(0, 4, statusAnon, anonPrivateFlag, 0, 0),                     // moved
		vmaE(8, 10, statusAnon, anonPrivateFlag|unix.MAP_GROWSDOWN, 0, 0), // a stack: kept
		vmaE(12, 13, statusAnon, anonPrivateFlag, 0, 0),                   // wipe-on-fork: kept
		vmaE(16, 17, statusAnon|1<<12, anonPrivateFlag, 0, 0),             // vvar: kept
		vmaE(20, 24, statusAnon, anonPrivateFlag, 0, 0),                   // no pages: kept
	}, pm: []*pagemap.PagemapEntry{pmE(0, 3), pmE(8, 1), pmE(12, 1), pmE(16, 1)}}
	tk.vmas[2].Madv = proto.Uint64(madvWipeOnFork)
	for _, b := range []byte{'a', 'b', 'c', 's', 'w', 'v'} {
		tk.pages = append(tk.pages, page(b)...)
	}
	writeSynth(t, img, nil, tk)
	was := dirState(t, img)
	rep, err := Inspect(Options{CheckpointDir: img, FamilyDir: family})
	if err != nil {
		t.Fatal(err)
	}
	sameState(t, "inspected image", was, dirState(t, img))
	if left := listDir(t, family); len(left) != 0 {
		t.Errorf("Inspect wrote %v", left)
	}
	want := []struct{ decision, why string }{
		{"move", "private anonymous memory"}, {"keep", "not a plain private anonymous mapping"},
		{"keep", "MADV_WIPEONFORK"}, {"keep", "vvar"}, {"keep", "no dumped pages"},
	}
	if len(rep.VMAs) != len(want) {
		t.Fatalf("%d VMAs reported, want %d", len(rep.VMAs), len(want))
	}
	for i, w := range want {
		if v := rep.VMAs[i]; v.Decision != w.decision || !strings.Contains(v.Why, w.why) {
			t.Errorf("VMA %d: %s (%s), want %s (%s)", i, v.Decision, v.Why, w.decision, w.why)
		}
	}
	p := rep.Pages
	if p.PagemapEntries != 4 || p.InCheckpoint != 6 || p.ToMemoryFiles != 3 || p.StayInCheckpoint != 3 || rep.Rewritten {
		t.Errorf("pages %+v", p)
	}
	if len(rep.Files) != 1 || rep.Files[0].Kind != "anon" || rep.Files[0].Exists || rep.Files[0].VMAs != 1 {
		t.Errorf("files %+v", rep.Files)
	}
}

// CRIU >= 4.2 lists MADV_GUARD_INSTALL ranges as fake VMAs (status bit 16) after the real
// ones, overlapping them (zdtm maps12): the rewrite leaves them in place, at the end.
func TestGuardVMAsSynthetic(t *testing.T) {
	img, family := t.TempDir(), shmDir(t)
	tk := synthTask{pid: 1, vmas: []*vma.VmaEntry{
		vmaE(0, 4, statusAnon, anonPrivateFlag, 0, 0),
		vmaE(4, 8, statusAnon, anonPrivateFlag, 0, 0),
		vmaE(1, 2, vmaAreaGuard, 0, 0, 0), // a guard page inside the first VMA
		vmaE(4, 6, vmaAreaGuard, 0, 0, 0),
	}, pm: []*pagemap.PagemapEntry{pmE(0, 1), pmE(6, 2)}}
	tk.pages = append(append(page('a'), page('b')...), page('c')...)
	writeSynth(t, img, nil, tk)
	res, err := Rewrite(context.Background(), Options{CheckpointDir: img, FamilyDir: family, Prefix: "g"})
	if err != nil {
		t.Fatal(err)
	}
	if res.VMAsConverted != 2 || res.PagesMoved != 3 {
		t.Errorf("result %+v", res)
	}
	vmas := loadMM(t, img, 1)
	if len(vmas) != 4 || vmas[2].GetStatus() != vmaAreaGuard || vmas[3].GetStatus() != vmaAreaGuard ||
		vmas[2].GetStart() != base+ps || vmas[3].GetEnd() != base+6*ps {
		t.Errorf("guard VMAs changed or moved: %v", vmas)
	}
}

// A forged checkpoint whose pagemap announces more pages than its pages image holds fails
// the rewrite with a one-line error (no panic), and leaves no memory file behind.
func TestRewriteRefusesAShortPagesImage(t *testing.T) {
	img, family := t.TempDir(), shmDir(t)
	tk := synthTask{pid: 1, vmas: []*vma.VmaEntry{vmaE(0, 8, statusAnon, anonPrivateFlag, 0, 0)},
		pm: []*pagemap.PagemapEntry{pmE(0, 4)}, pages: append(page('a'), page('b')...)}
	writeSynth(t, img, nil, tk)
	_, err := Rewrite(context.Background(), Options{CheckpointDir: img, FamilyDir: family, Prefix: "p"})
	if err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("err = %v, want one line", err)
	}
	if left := listDir(t, family); len(left) != 0 {
		t.Errorf("family dir holds %v after a refused rewrite", left)
	}
}
