package memfile

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v8/crit"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/vma"
	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/testutil/timescale"
)

// A child's anonymous VMA whose pages mostly equal its parent's maps the parent's memory
// file; only the differing pages stay in its image, with a zero page where the parent has
// data and the child none. A child that wrote most of its pages keeps its own file.
func TestShareWithParentSynthetic(t *testing.T) {
	img, family := t.TempDir(), shmDir(t)
	heap := func() []*vma.VmaEntry {
		return []*vma.VmaEntry{vmaE(0, 16, statusAnon, anonPrivateFlag, 0, 0), vmaE(32, 40, statusAnon, anonPrivateFlag, 0, 0)}
	}
	// Parent: pages 0-9 'a'..'j', page 10 a dumped zero page; 32-39 'p'..'w'.
	parent := synthTask{pid: 1, vmas: heap(), pm: []*pagemap.PagemapEntry{pmE(0, 11), pmE(32, 8)}}
	for i := 0; i < 10; i++ {
		parent.pages = append(parent.pages, page(byte('a'+i))...)
	}
	parent.pages = append(parent.pages, page(0)...)
	for i := 0; i < 8; i++ {
		parent.pages = append(parent.pages, page(byte('p'+i))...)
	}
	// Child 2: pages 0-9 as the parent but 5 = 'X', no page 9 (it must read zero), a zero
	// page at 10 (the parent's is zero too); 32-39: wrote them all ('0'+i).
	child := synthTask{pid: 2, ppid: 1, vmas: heap(), pm: []*pagemap.PagemapEntry{pmE(0, 9), pmE(10, 1), pmE(32, 8)}}
	for i := 0; i < 9; i++ {
		b := byte('a' + i)
		if i == 5 {
			b = 'X'
		}
		child.pages = append(child.pages, page(b)...)
	}
	child.pages = append(child.pages, page(0)...)
	for i := 0; i < 8; i++ {
		child.pages = append(child.pages, page(byte('0'+i))...)
	}
	writeSynth(t, img, nil, parent, child)

	rep, err := Inspect(Options{CheckpointDir: img, FamilyDir: family})
	if err != nil {
		t.Fatal(err)
	}
	var decisions []string
	for _, v := range rep.VMAs {
		decisions = append(decisions, v.Decision)
	}
	if strings.Join(decisions, ",") != "move,move,share,move" || rep.Pages.CowShared != 8 || rep.Pages.InCheckpoint != 19+18 {
		t.Fatalf("inspect: decisions %v, pages %+v", decisions, rep.Pages)
	}

	res, err := Rewrite(context.Background(), Options{CheckpointDir: img, FamilyDir: family, Prefix: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if res.CowSharedPages != 8 || len(res.Files) != 2 {
		t.Fatalf("result %+v", res)
	}
	vmas := loadMM(t, img, 2)
	pv := loadMM(t, img, 1)
	if vmas[0].GetShmid() != pv[0].GetShmid() || vmas[0].GetPgoff() != vmas[0].GetStart() || vmas[0].GetStatus() != statusFilePriv {
		t.Errorf("child heap VMA %v does not map the parent's file %v", vmas[0], pv[0])
	}
	if vmas[1].GetShmid() == pv[1].GetShmid() {
		t.Errorf("a child VMA that differs on every page must keep its own file")
	}
	// The child's image: page 5 ('X') and page 9 (zero, the parent has 'j'); nothing else
	// of the shared VMA.
	pm := loadPM(t, img, 2)
	if len(pm) != 2 || pm[0].GetVaddr() != base+5*ps || pm[0].GetNrPages() != 1 || pm[1].GetVaddr() != base+9*ps || pm[1].GetNrPages() != 1 ||
		pm[1].GetFlags()&pePresent == 0 {
		t.Fatalf("child pagemap %v", pm)
	}
	pages, _ := os.ReadFile(filepath.Join(img, "pages-2.img"))
	if !bytes.Equal(pages, append(page('X'), page(0)...)) {
		t.Errorf("child pages image holds %d bytes, want page X and a zero page", len(pages))
	}
	// The child's file holds only its own second VMA.
	for _, f := range res.Files {
		if strings.HasPrefix(f.Name, "p-2-") && f.VMAStart != base+32*ps {
			t.Errorf("child file %+v", f)
		}
	}
}

// prefork is a pre-forking server: a master with a 64 MiB heap forks 4 workers that only
// read it, but worker 0 writes one page. Each process reports status-<pid> on SIGUSR1:
// the heap's checksum and address.
const prefork = statusPy + `
import ctypes, hashlib
workers = int(sys.argv[2])
buf = bytearray(64 << 20)
pat = bytes(range(1, 256)) * 17
for off in range(0, 64 << 20, 4096):
    buf[off:off + 4096] = pat[:4096]
addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
def report(*a):
    write_status({"sum": hashlib.sha256(buf).hexdigest(), "addr": addr})
for i in range(workers):
    if os.fork() == 0:
        if i == 0:
            buf[0:4096] = b'w' * 4096
        break
serve(report)
`

type preforkStatus struct {
	Sum  string `json:"sum"`
	PID  int    `json:"pid"`
	Addr uint64 `json:"addr"`
}

func (l *lab) preforkStatus(pid int) preforkStatus { return askAs[preforkStatus](l, pid) }

// children lists the children of pid.
func children(pid int) []int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		c, _ := strconv.Atoi(f)
		out = append(out, c)
	}
	return out
}

// pfn reads the page frame of addr in pid from /proc/PID/pagemap (as root), 0 if absent.
func pfn(t *testing.T, pid int, addr uint64) uint64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [8]byte
	if _, err := f.ReadAt(b[:], int64(addr/uint64(pageSize)*8)); err != nil {
		t.Fatal(err)
	}
	e := binary.LittleEndian.Uint64(b[:])
	if e&(1<<63) == 0 {
		return 0
	}
	return e & (1<<55 - 1)
}

// A pre-forking server's heap, shared copy-on-write by the master and 4 workers, is stored
// once in the memory files, and in the restored copy the workers read the master's pages
// (same frames in /proc/PID/pagemap, as in the source).
func TestPreforkSharesOnce(t *testing.T) {
	requirePriv(t)
	const workers = 4
	l := newLab(t)
	master := l.run("prefork.py", prefork, strconv.Itoa(workers))
	var kids []int
	for deadline := time.Now().Add(timescale.Scale(20 * time.Second)); len(kids) < workers && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		kids = children(master)
	}
	if len(kids) != workers {
		t.Fatalf("%d workers started", len(kids))
	}
	want := map[int]string{}
	for _, p := range append([]int{master}, kids...) {
		l.track(p)
		want[p] = l.preforkStatus(p).Sum
	}
	dumped := l.dump(master, "img")
	res, err := Rewrite(context.Background(), Options{CheckpointDir: dumped, FamilyDir: l.family, MountPath: l.family, ConvertFilePrivate: true, Prefix: "c"})
	if err != nil {
		t.Fatal(err)
	}
	var bytes int64
	for _, f := range res.Files {
		bytes += f.Bytes
	}
	t.Logf("rewrite of master + %d workers: %d memory files, %.1f MiB allocated, %d pages shared with a parent (%.1f MiB not stored again), %d pages kept in the checkpoint",
		workers, len(res.Files), float64(bytes)/(1<<20), res.CowSharedPages, float64(res.CowSharedPages*pageSize)/(1<<20), res.PagesKept)
	if res.CowSharedPages < workers*(60<<20)/pageSize {
		t.Errorf("%d pages shared, want the workers' 64 MiB heaps (%d pages)", res.CowSharedPages, workers*(64<<20)/pageSize)
	}
	if bytes > 2*(64<<20) {
		t.Errorf("memory files allocate %d bytes for one 64 MiB heap", bytes)
	}

	rmaster, err := l.restore(dumped, "r")
	if err != nil {
		t.Fatal(err)
	}
	rkids := children(rmaster)
	if len(rkids) != workers {
		t.Fatalf("restored master has %d workers", len(rkids))
	}
	ms := l.preforkStatus(rmaster)
	if ms.Sum != want[master] {
		t.Errorf("restored master's heap differs")
	}
	sums := map[string]int{}
	for _, w := range rkids {
		l.track(w)
		s := l.preforkStatus(w)
		sums[s.Sum]++
		// The third page was never written by any worker (worker 0 wrote 4 KiB from the
		// unaligned start): the master's frame.
		if a, b := pfn(t, rmaster, s.Addr+2*uint64(pageSize)), pfn(t, w, s.Addr+2*uint64(pageSize)); a == 0 || a != b {
			t.Errorf("worker %d (sum %.8s, master %.8s): heap page frame %#x, master's %#x: not shared; maps:\n%s", w, s.Sum, ms.Sum, b, a, mapsAround(w, s.Addr))
		}
	}
	var wrote string
	for p, s := range want {
		if p != master && s != want[master] {
			wrote = s
		}
	}
	if wrote == "" || sums[wrote] != 1 || sums[want[master]] != workers-1 {
		t.Errorf("restored workers' heaps: %v; want one with worker 0's write and %d with the master's", sums, workers-1)
	}
	var anon int64
	for _, p := range append([]int{rmaster}, rkids...) {
		anon += rollup(t, p)["Anonymous"]
	}
	t.Logf("restored master + %d workers: %d kB of private memory in all", workers, anon)
}

func mapsAround(pid int, addr uint64) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		var lo, hi uint64
		if _, err := fmt.Sscanf(line, "%x-%x", &lo, &hi); err == nil && hi > addr-(1<<24) && lo < addr+(1<<27) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// A child's file-private VMA (a MAP_PRIVATE file mapping written before and after fork())
// maps its parent's copy of that file when they hold the same file at the same offsets:
// pages equal to the parent's copy leave the child's image, a page only the parent wrote
// after fork() is kept with the file's own bytes, and the child's own writes stay. A VMA
// that differs on more pages than the process's budget keeps its own file.
func TestShareFilePrivateSynthetic(t *testing.T) {
	img, family, rootfs := synthDirs(t, "data")
	var file []byte
	for i := 0; i < 8; i++ {
		file = append(file, page(byte('A'+i))...)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "data", "f"), file, 0o644); err != nil {
		t.Fatal(err)
	}
	const big = smallDelta + 100
	vmas := func() []*vma.VmaEntry {
		return []*vma.VmaEntry{
			vmaE(0, 8, statusFilePriv, unix.MAP_PRIVATE, 1, 0),
			vmaE(16, 16+big+1, statusAnon, anonPrivateFlag, 0, 0),
		}
	}
	// Parent: pages 0 'p' and 1 'q' (written before fork()), 2 'r' and 3 's' (after);
	// its anonymous VMA: page 0 'z' and big pages 'P'.
	parent := synthTask{pid: 1, vmas: vmas(), pm: []*pagemap.PagemapEntry{pmE(0, 4), pmE(16, big+1)}}
	for _, b := range []byte("pqrs") {
		parent.pages = append(parent.pages, page(b)...)
	}
	parent.pages = append(parent.pages, page('z')...)
	parent.pages = append(parent.pages, bytes.Repeat(page('P'), big)...)
	// Child: 0 'p', 1 'q' (as the parent), 3 'S' (its own write), 5 'F' (written with the
	// file's own bytes), 6 'x'; its anonymous VMA: page 0 'z', big pages 'C'.
	child := synthTask{pid: 2, ppid: 1, vmas: vmas(), pm: []*pagemap.PagemapEntry{pmE(0, 2), pmE(3, 1), pmE(5, 2), pmE(16, big+1)}}
	for _, b := range []byte("pqSFx") {
		child.pages = append(child.pages, page(b)...)
	}
	child.pages = append(child.pages, page('z')...)
	child.pages = append(child.pages, bytes.Repeat(page('C'), big)...)
	writeSynth(t, img, []*crit.CriuEntry{regE(1, "/data/f", uint64(len(file)))}, parent, child)

	opts := Options{CheckpointDir: img, FamilyDir: family, RootFS: rootfs, ConvertFilePrivate: true, Prefix: "p"}
	rep, err := Inspect(opts)
	if err != nil {
		t.Fatal(err)
	}
	var decisions []string
	for _, v := range rep.VMAs {
		decisions = append(decisions, v.Decision)
	}
	if strings.Join(decisions, ",") != "convert-file,move,share,move" || !strings.Contains(rep.VMAs[3].Why, "keeps its own file") {
		t.Fatalf("inspect: decisions %v, %+v", decisions, rep.VMAs)
	}
	// Without the container's root, Inspect cannot compare the copies and says so.
	noRoot := opts
	noRoot.RootFS = ""
	if rep, err := Inspect(noRoot); err != nil || rep.VMAs[2].Decision == "share" || !strings.Contains(rep.VMAs[2].Why, "not compared") {
		t.Fatalf("inspect without the root: %v %+v", err, rep)
	}

	res, err := Rewrite(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if res.CowSharedPages != 5 || len(res.Files) != 2 {
		t.Fatalf("result %+v", res)
	}
	cv, pv := loadMM(t, img, 2), loadMM(t, img, 1)
	if cv[0].GetShmid() != pv[0].GetShmid() || cv[0].GetPgoff() != cv[0].GetStart() || cv[0].GetStatus() != statusFilePriv {
		t.Errorf("child file VMA %v does not map the parent's file %v", cv[0], pv[0])
	}
	if cv[1].GetShmid() == pv[1].GetShmid() {
		t.Errorf("the child's anonymous VMA over budget must keep its own file")
	}
	// The child's image holds the file's page 2 ('C': the parent wrote 'r' after fork()),
	// its own 'S' and 'x'; nothing else of the shared VMA.
	pm := loadPM(t, img, 2)
	var got []uint64
	for _, e := range pm {
		for k := uint64(0); k < uint64(e.GetNrPages()); k++ {
			got = append(got, (e.GetVaddr()-base)/ps+k)
		}
	}
	if fmt.Sprint(got) != "[2 3 6]" {
		t.Fatalf("child pagemap pages %v", got)
	}
	pages, _ := os.ReadFile(filepath.Join(img, "pages-2.img"))
	if !bytes.Equal(pages, bytes.Join([][]byte{page('C'), page('S'), page('x')}, nil)) {
		t.Errorf("child pages image holds %d bytes, want the file's page C, S and x", len(pages))
	}
	// What the child reads: its image's pages over the parent's copy.
	pf := filepath.Join(family, "p-1-10000000-anon.mem")
	for i, want := range []byte("pqCSEFxH") {
		var b []byte
		switch i {
		case 2:
			b = pages[:pageSize]
		case 3:
			b = pages[pageSize : 2*pageSize]
		case 6:
			b = pages[2*pageSize:]
		default:
			b = readPage(t, pf, base/ps+uint64(i))
		}
		if !bytes.Equal(b, page(want)) {
			t.Errorf("child page %d reads %q..., want %q", i, b[:4], want)
		}
	}
}

// cowPages is cow01's situation in a real program: a parent writes pages of a MAP_PRIVATE
// file mapping and of an anonymous mapping, forks, and then parent and child each write
// some pages. Per mapping of 64 pages: 0-7 written before fork() only, 8-15 rewritten by
// the parent after, 16-23 by the child, 32-39 written by the parent after fork() only,
// 48-55 by the child only. Each process reports status-<pid> on SIGUSR1: the mappings'
// addresses and each page's checksum.
const cowPages = statusPy + `
import ctypes, hashlib, mmap
data = sys.argv[2]
N, P = 64, mmap.PAGESIZE
with open(data, 'wb') as f:
    f.write(b''.join(bytes([65 + i % 26]) * P for i in range(N)))
fd = os.open(data, os.O_RDWR)
rw = mmap.PROT_READ | mmap.PROT_WRITE
maps = {'file': mmap.mmap(fd, N * P, flags=mmap.MAP_PRIVATE, prot=rw),
        'anon': mmap.mmap(-1, N * P, flags=mmap.MAP_PRIVATE, prot=rw)}
os.close(fd)
def write(pages):
    for m in maps.values():
        for i in pages:
            m[i * P:(i + 1) * P] = os.urandom(P)
write(range(0, 24))
if os.fork() == 0:
    write(list(range(16, 24)) + list(range(48, 56)))
else:
    write(list(range(8, 16)) + list(range(32, 40)))
def report(*a):
    doc = {}
    for k, m in maps.items():
        doc[k] = ctypes.addressof(ctypes.c_char.from_buffer(m))
        doc[k + '_sums'] = [hashlib.sha256(m[i * P:(i + 1) * P]).hexdigest()[:16] for i in range(N)]
    write_status(doc)
serve(report)
`

type cowStatus struct {
	PID      int      `json:"pid"`
	File     uint64   `json:"file"`
	Anon     uint64   `json:"anon"`
	FileSums []string `json:"file_sums"`
	AnonSums []string `json:"anon_sums"`
}

func (l *lab) cowStatus(pid int) cowStatus { return askAs[cowStatus](l, pid) }

// A parent and its child sharing pages of a written MAP_PRIVATE file mapping and of an
// anonymous mapping, with pages written after fork() by either in the same mappings
// (cow01's cases): after the rewrite and a restore, both read every page as before, and
// the pages neither wrote after fork() are the same frames in both, as in the source.
func TestCowPagesStayShared(t *testing.T) {
	requirePriv(t)
	l := newLab(t)
	parent := l.run("cow.py", cowPages, filepath.Join(l.base, "data"))
	// It forks once it has written its pages and reports once its handler is set (python3
	// may be a shim that runs helpers first).
	l.waitStatus(parent)
	var kids []int
	for deadline := time.Now().Add(timescale.Scale(20 * time.Second)); len(kids) < 1 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		kids = children(parent)
	}
	if len(kids) != 1 {
		t.Fatalf("%d children started", len(kids))
	}
	l.track(kids[0])
	l.waitStatus(kids[0])
	want := map[string]cowStatus{"parent": l.cowStatus(parent), "child": l.cowStatus(kids[0])}
	// The source itself: pages 0-7 are shared, the others not.
	for _, a := range []uint64{want["parent"].File, want["parent"].Anon} {
		if p, c := pfn(t, parent, a), pfn(t, kids[0], a); p == 0 || p != c {
			t.Fatalf("source: page at %#x is not shared (%#x, %#x)", a, p, c)
		}
	}

	dumped := l.dump(parent, "img")
	opts := Options{CheckpointDir: dumped, FamilyDir: l.family, MountPath: l.family, ConvertFilePrivate: true, Prefix: "c"}
	rep, err := Inspect(opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.VMAs {
		in := func(a uint64) bool { return v.Start <= a && a < v.End }
		// Pids in the checkpoint are the namespace's: the parent's VMAs come first.
		if v.Pid != rep.VMAs[0].Pid && (in(want["child"].File) || in(want["child"].Anon)) {
			t.Logf("child VMA %#x-%#x %s: %s: %s", v.Start, v.End, v.Maps, v.Decision, v.Why)
		}
	}
	res, err := Rewrite(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rewrite: %d pages shared with a parent, %d kept in the checkpoint", res.CowSharedPages, res.PagesKept)

	rparent, err := l.restore(dumped, "r")
	if err != nil {
		t.Fatal(err)
	}
	rkids := children(rparent)
	if len(rkids) != 1 {
		t.Fatalf("restored parent has %d children", len(rkids))
	}
	l.track(rkids[0])
	got := map[string]cowStatus{"parent": l.cowStatus(rparent), "child": l.cowStatus(rkids[0])}
	for who, w := range want {
		g := got[who]
		if g.File != w.File || g.Anon != w.Anon {
			t.Fatalf("restored %s maps at %#x, %#x; want %#x, %#x", who, g.File, g.Anon, w.File, w.Anon)
		}
		for i := range w.FileSums {
			if g.FileSums[i] != w.FileSums[i] || g.AnonSums[i] != w.AnonSums[i] {
				t.Errorf("restored %s: page %d differs (file %s/%s, anon %s/%s)", who, i, g.FileSums[i], w.FileSums[i], g.AnonSums[i], w.AnonSums[i])
			}
		}
	}
	for name, start := range map[string]uint64{"file": want["parent"].File, "anon": want["parent"].Anon} {
		for i := uint64(0); i < 8; i++ {
			a := start + i*uint64(pageSize)
			if p, c := pfn(t, rparent, a), pfn(t, rkids[0], a); p == 0 || p != c {
				t.Errorf("%s mapping page %d: frame %#x in the parent, %#x in the child: not shared; child maps:\n%s", name, i, p, c, mapsAround(rkids[0], a))
			}
		}
	}
}
