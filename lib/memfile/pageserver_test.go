package memfile

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/pagemap"
	"golang.org/x/sys/unix"
)

// psClient speaks CRIU's side of the page-server protocol (criu/page-xfer.c).
type psClient struct {
	t *testing.T
	f *os.File
}

func (c psClient) send(cmd uint32, nr, vaddr, dst uint64, data []byte) {
	c.t.Helper()
	h := make([]byte, psHeaderSize)
	binary.LittleEndian.PutUint32(h[0:], cmd)
	binary.LittleEndian.PutUint64(h[8:], nr)
	binary.LittleEndian.PutUint64(h[16:], vaddr)
	binary.LittleEndian.PutUint64(h[24:], dst)
	if _, err := c.f.Write(append(h, data...)); err != nil {
		c.t.Fatal(err)
	}
}

func (c psClient) recv(n int) []byte {
	c.t.Helper()
	b := make([]byte, n)
	if _, err := c.f.Read(b); err != nil {
		c.t.Fatal(err)
	}
	return b
}

func TestPageServer(t *testing.T) { testPageServer(t, true) }

// Where writes to the mapped pages are slow (a host that shadows the guest's page
// tables), the server drops its mappings and splices every run: the same bytes land.
func TestPageServerSplicesWhereMappedWritesAreSlow(t *testing.T) { testPageServer(t, false) }

func testPageServer(t *testing.T, viaMaps bool) {
	old := premapSlowPage
	t.Cleanup(func() { premapSlowPage = old })
	premapSlowPage = time.Hour // the probe never drops the mappings
	if !viaMaps {
		premapSlowPage = 0 // every sampled write is over it
	}
	root := shmDir(t)
	img, fam := filepath.Join(root, "img"), filepath.Join(root, "fam")
	for _, d := range []string{img, fam} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// Process 5's file was preallocated (4 small pages and a 2 MiB stretch, a huge page
	// where the kernel has them); process 6's is made by the server.
	h := uint64(hugeAlign)
	if _, err := Preallocate(filepath.Join(fam, PreallocName("s1", 5)), []PreallocRun{{base, base + 4*ps}, {base + h, base + 2*h}}, HugePagesAlways); err != nil {
		t.Fatal(err)
	}
	var stretch []byte
	for i := range h / ps {
		stretch = append(stretch, page(byte('A'+i%26))...)
	}
	srv, err := StartPageServer(img, fam, "s1")
	if err != nil {
		t.Fatal(err)
	}
	c := psClient{t, srv.Conn}
	pid := func(id uint64) uint64 { return id<<8 | psTypePid }
	c.send(psIovOpen2, 0, 0, pid(5), nil)
	if b := c.recv(1); b[0] != 0 {
		t.Fatalf("has_parent %d", b[0])
	}
	c.send(psIovAddF|pePresentFlag<<16, 2, base+ps, pid(5), append(page('a'), page('b')...))
	c.send(psIovAddF|pePresentFlag<<16, 1, base+10*ps, pid(5), page('c'))
	c.send(psIovAddF|pePresentFlag<<16, 2, base+3*ps, pid(5), append(page('d'), page('e')...)) // half preallocated
	c.send(psIovAddF|pePresentFlag<<16, h/ps, base+h, pid(5), stretch)
	c.send(psIovOpen2, 0, 0, pid(6), nil)
	c.recv(1)
	c.send(psIovAddF|pePresentFlag<<16, 1, base, pid(6), page('x'))
	c.send(psIovOpen2, 0, 0, 7<<8|psTypeShmem, nil)
	c.recv(1)
	c.send(psIovAddF|pePresentFlag<<16, 2, 0, 7<<8|psTypeShmem, append(page('m'), page('n')...))
	c.send(psIovClose, 0, 0, 0, nil)
	if b := c.recv(4); !bytes.Equal(b, make([]byte, 4)) {
		t.Fatalf("status %v", b)
	}
	srv.Conn.Close()
	placed, n, err := srv.Wait(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(8*ps+h) || placed[5] != PreallocName("s1", 5) || placed[6] != PreallocName("s1", 6) || len(placed) != 2 {
		t.Fatalf("placed %v, %d bytes", placed, n)
	}
	// Written through the mappings of the preallocated ranges: pages 1, 2 and 3, and the
	// stretch; pages 4 and 10 and process 6's spliced.
	want := int64(3*ps + h)
	if !viaMaps {
		want = 0
	}
	if srv.mapped != want {
		t.Errorf("%d bytes written through the mappings, want %d", srv.mapped, want)
	}
	f5 := filepath.Join(fam, placed[5])
	for i, want := range [][]byte{page(0), page('a'), page('b')} {
		if got := readPage(t, f5, base/ps+uint64(i)); !bytes.Equal(got, want) {
			t.Errorf("process 5 page %d: %q...", i, got[:2])
		}
	}
	for p, want := range map[uint64][]byte{10: page('c'), 3: page('d'), 4: page('e'), h / ps: page('A'), h/ps + 27: page('B'), 2*h/ps - 1: page('A' + 511%26)} {
		if got := readPage(t, f5, base/ps+p); !bytes.Equal(got, want) {
			t.Errorf("process 5 page %d: %q..., want %q...", p, got[:2], want[:2])
		}
	}
	if got := readPage(t, filepath.Join(fam, placed[6]), base/ps); !bytes.Equal(got, page('x')) {
		t.Errorf("process 6: %q...", got[:2])
	}
	pm := loadPM(t, img, 5)
	if len(pm) != 4 || pm[0].GetVaddr() != base+ps || pagesIn(pm[0]) != 2 || pm[0].GetFlags() != pePresent || pm[1].GetVaddr() != base+10*ps {
		t.Errorf("pagemap-5 %v", pm)
	}
	head, err := loadImage(img, "pagemap-5.img", "PAGEMAP", &pagemap.PagemapHead{})
	if err != nil {
		t.Fatal(err)
	}
	pages := filepath.Join(img, "pages-"+itoa(head.Entries[0].Message.(*pagemap.PagemapHead).GetPagesId())+".img")
	if st, err := os.Stat(pages); err != nil || st.Size() != 0 {
		t.Errorf("process 5's pages image %s: %v (want it empty)", pages, err)
	}
	sh, err := loadImage(img, "pagemap-shmem-7.img", "PAGEMAP", &pagemap.PagemapHead{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(img, "pages-"+itoa(sh.Entries[0].Message.(*pagemap.PagemapHead).GetPagesId())+".img"))
	if err != nil || !bytes.Equal(data, append(page('m'), page('n')...)) {
		t.Errorf("shared memory's pages image: %d bytes, %v", len(data), err)
	}
}

// Pages past what a memory file can hold, or a stream cut short, fail the dump (criu's
// next write fails: the server is gone) instead of leaving a checkpoint with pages
// missing.
func TestPageServerRefuses(t *testing.T) {
	old := premapSlowPage
	t.Cleanup(func() { premapSlowPage = old })
	premapSlowPage = time.Hour // "preallocated" cases go through the mappings
	for _, tc := range []struct {
		name string
		run  func(c psClient)
		want string
		pre  bool // process 1's file preallocated: the pages go through a mapping
	}{
		{"past the file", func(c psClient) {
			c.send(psIovOpen2, 0, 0, 1<<8|psTypePid, nil)
			c.recv(1)
			c.send(psIovAddF|pePresentFlag<<16, 1, uint64(AnonFileSize), 1<<8|psTypePid, page('a'))
		}, "past a memory file", false},
		{"unaligned", func(c psClient) {
			c.send(psIovOpen2, 0, 0, 1<<8|psTypePid, nil)
			c.recv(1)
			c.send(psIovAddF|pePresentFlag<<16, 1, base+1, 1<<8|psTypePid, page('a'))
		}, "bad page run", false},
		{"no close", func(c psClient) {
			c.send(psIovOpen2, 0, 0, 1<<8|psTypePid, nil)
			c.recv(1)
		}, "before the end of the dump", false},
		{"opened twice", func(c psClient) {
			c.send(psIovOpen2, 0, 0, 1<<8|psTypePid, nil)
			c.recv(1)
			c.send(psIovOpen2, 0, 0, 1<<8|psTypePid, nil)
		}, "opened twice", false},
		{"unknown type", func(c psClient) {
			c.send(psIovOpen2, 0, 0, 1<<8|9, nil)
		}, "image type 9", false},
		{"cut mid-run", cutMidRun, "mid-run", false},
		{"cut mid-run, preallocated", cutMidRun, "mid-run", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := shmDir(t)
			if tc.pre {
				if _, err := Preallocate(filepath.Join(root, PreallocName("s", 1)), []PreallocRun{{base, base + 4*ps}}, NoHugePages); err != nil {
					t.Fatal(err)
				}
			}
			srv, err := StartPageServer(root, root, "s")
			if err != nil {
				t.Fatal(err)
			}
			tc.run(psClient{t, srv.Conn})
			srv.Conn.Close()
			if _, _, err := srv.Wait(5 * time.Second); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// cutMidRun announces two pages and sends one before the stream ends.
func cutMidRun(c psClient) {
	c.send(psIovOpen2, 0, 0, 1<<8|psTypePid, nil)
	c.recv(1)
	c.send(psIovAddF|pePresentFlag<<16, 2, base, 1<<8|psTypePid, page('a'))
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

// Zero pages leave a file as holes; its content stays.
func TestPunchZeroPages(t *testing.T) {
	path := filepath.Join(shmDir(t), "f.mem")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(AnonFileSize); err != nil {
		t.Fatal(err)
	}
	at := int64(base)
	for i, p := range [][]byte{page('a'), page(0), page(0), page('b'), page(0)} {
		if _, err := f.WriteAt(p, at+int64(i)*pageSize); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.WriteAt(page(0), at+1000*pageSize); err != nil {
		t.Fatal(err)
	}
	f.Close()
	freed, err := PunchZeroPages(context.Background(), path)
	if err != nil || freed != 4*pageSize {
		t.Fatalf("freed %d bytes, %v; want 4 pages", freed, err)
	}
	for i, want := range [][]byte{page('a'), page(0), page(0), page('b'), page(0)} {
		p := base/ps + uint64(i)
		if !bytes.Equal(readPage(t, path, p), want) {
			t.Errorf("page %d changed", i)
		}
		if hole := isHole(t, path, p); hole != (want[0] == 0) {
			t.Errorf("page %d: hole %v", i, hole)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Blocks*512 != 2*pageSize {
		t.Errorf("%d bytes allocated, want 2 pages", st.Blocks*512)
	}
}

// The family directory may hold, under a process's memory-file name, something that is
// not a memory file this dump made: a symlink to a file elsewhere, a file of another size,
// a FIFO. The server neither maps nor writes any of them; the dump fails naming the file,
// and the file the symlink names stays as it was.
func TestPageServerRefusesForeignFiles(t *testing.T) {
	root := shmDir(t)
	outside := filepath.Join(root, "outside")
	f, err := os.OpenFile(outside, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(AnonFileSize); err != nil { // the size a memory file has
		t.Fatal(err)
	}
	if _, err := f.WriteAt(page('o'), int64(base)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	fam := filepath.Join(root, "fam")
	if err := os.Mkdir(fam, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(fam, PreallocName("s", 1))); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fam, PreallocName("s", 2)), page('w'), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(fam, PreallocName("s", 3)), 0o600); err != nil {
		t.Fatal(err)
	}

	m := startPremap(fam, "s")
	<-m.done
	if len(m.files) != 0 || len(m.res) != 0 {
		t.Errorf("mapped %d files (%d reservations) that are not this dump's memory files", len(m.files), len(m.res))
	}
	m.unmap()

	for id, want := range map[uint32]string{1: "too many levels of symbolic links", 2: "is not a memory file", 3: "is not a memory file"} {
		srv, err := StartPageServer(root, fam, "s")
		if err != nil {
			t.Fatal(err)
		}
		// CRIU's side, errors ignored: a server that refuses ends the stream at the open.
		hdr := func(cmd uint32, nr uint64) []byte {
			h := make([]byte, psHeaderSize)
			binary.LittleEndian.PutUint32(h[0:], cmd)
			binary.LittleEndian.PutUint64(h[8:], nr)
			binary.LittleEndian.PutUint64(h[16:], base)
			binary.LittleEndian.PutUint64(h[24:], uint64(id)<<8|psTypePid)
			return h
		}
		_, _ = srv.Conn.Write(hdr(psIovOpen2, 0))
		_, _ = srv.Conn.Read(make([]byte, 1))
		_, _ = srv.Conn.Write(append(hdr(psIovAddF|pePresentFlag<<16, 1), page('x')...))
		_, _ = srv.Conn.Write(hdr(psIovClose, 0))
		srv.Conn.Close()
		if _, _, err := srv.Wait(5 * time.Second); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("process %d: got %v, want an error with %q", id, err, want)
		}
	}
	if !bytes.Equal(readPage(t, outside, base/ps), page('o')) {
		t.Error("the file the symlink names was written")
	}
	if b, err := os.ReadFile(filepath.Join(fam, PreallocName("s", 2))); err != nil || !bytes.Equal(b, page('w')) {
		t.Errorf("the file of another size changed (%v)", err)
	}
}
