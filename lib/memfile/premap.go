package memfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The page server writes a process's pages into its preallocated memory file while the
// source is frozen. Spliced in, each 4 KiB page costs a page-cache write (lookup, lock,
// copy, dirty) and the dump's "memory write" was 1.2-2.4x slower into small pages than
// into huge ones; read from the socket straight into a shared mapping of the file whose
// page tables were filled before the freeze, it is one copy with no per-page work
// (256 MiB: 39-43 ms against 80-93 spliced, 58-69 spliced into huge pages, /tmp
// benchmark of 2 Dec). So the server maps each preallocated file's allocated ranges
// (MAP_POPULATE, beside CRIU's start) and copies the pages of a run that falls in one
// there; the rest are spliced as before.

// Whether that wins depends on the host. On a VM that shadows the guest's page tables
// (this project's machines since 2 Dec: a write from user space to a page the process has
// not touched yet traps to the host, ~8 us, while the kernel's own copies do not), the
// same 256 MiB took 500-630 ms through the mapping against 61-84 ms spliced (/tmp
// benchmark, socket -> preallocated tmpfs file, six runs). So once the files are mapped, a
// sample of their pages is written (each with the zero it holds) and timed; if a page
// takes over premapSlowPage the mappings are dropped and every run is spliced.

// premapProbePages pages, spread over the mapped bytes, are timed.
const premapProbePages = 64

// premapSlowPage is the write time per sampled page above which the mappings are dropped
// (fast hosts: ~0.1 us; splicing a page ~1 us; shadowed page tables: ~8 us). A variable
// for tests.
var premapSlowPage = 2 * time.Microsecond

// premapMaxRuns bounds the mappings made per file (each is a VMA of the daemon): the
// preallocation merges its runs, so a heap is a few.
const premapMaxRuns = 256

// mappedRun is a mapping of a memory file's bytes [off, off+len(b)).
type mappedRun struct {
	off int64
	b   []byte
}

// premap holds the mappings of one dump's preallocated files, made in the background.
type premap struct {
	done  chan struct{}
	files map[uint32][]mappedRun     // by the pid the checkpoint names the process
	res   []unsafe.Pointer           // reservations to unmap
	sizes map[unsafe.Pointer]uintptr // their sizes
}

// startPremap maps, on another goroutine, the allocated ranges of every file in
// familyDir that Preallocate made for prefix.
func startPremap(familyDir, prefix string) *premap {
	m := &premap{done: make(chan struct{}), files: map[uint32][]mappedRun{}, sizes: map[unsafe.Pointer]uintptr{}}
	go func() {
		defer close(m.done)
		ents, err := os.ReadDir(familyDir)
		if err != nil {
			return
		}
		for _, e := range ents {
			id, ok := ParsePreallocName(prefix, e.Name())
			if !ok || !e.Type().IsRegular() {
				continue
			}
			m.mapFile(filepath.Join(familyDir, e.Name()), id)
		}
		if m.slowWrites() {
			m.unmapAll()
		}
	}()
	return m
}

// slowWrites writes up to premapProbePages pages spread over the mappings, each with the
// value it holds (an atomic add of 0: nothing else writes them yet, and a preallocated
// page reads zeros), and says whether a page took over premapSlowPage on average.
func (m *premap) slowWrites() bool {
	var all []mappedRun
	var total int
	for _, runs := range m.files {
		for _, r := range runs {
			all = append(all, r)
			total += len(r.b)
		}
	}
	if total == 0 {
		return false
	}
	ps := int(pageSize)
	step := max(total/premapProbePages, ps) &^ (ps - 1)
	sampled := 0
	start := time.Now()
	at := 0 // offset into the runs laid end to end
	for _, r := range all {
		for ; at < len(r.b); at += step {
			atomic.AddUint32((*uint32)(unsafe.Pointer(&r.b[at])), 0)
			sampled++
		}
		at -= len(r.b)
	}
	return time.Since(start) > time.Duration(sampled)*premapSlowPage
}

// mapFile maps path's allocated ranges; whatever fails is left to the splice.
func (m *premap) mapFile(path string, id uint32) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd) // a mapping keeps the file
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != AnonFileSize {
		return
	}
	for _, r := range dataRuns(fd, premapMaxRuns) {
		if b, ok := m.mapRange(fd, int64(r.Start), int64(r.End-r.Start)); ok {
			m.files[id] = append(m.files[id], mappedRun{off: int64(r.Start), b: b})
		}
	}
}

// mapRange maps fd's [off, off+n) shared and writable, its page tables filled, at an
// address that agrees with off modulo 2 MiB (a huge page of the file is mapped whole).
func (m *premap) mapRange(fd int, off, n int64) ([]byte, bool) {
	size := uintptr(n + hugeAlign)
	res, err := unix.MmapPtr(-1, 0, nil, size, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, false
	}
	m.res = append(m.res, res)
	m.sizes[res] = size
	at := unsafe.Add(res, (uintptr(off)-uintptr(res))&(hugeAlign-1))
	addr, err := unix.MmapPtr(fd, off, at, uintptr(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED|unix.MAP_POPULATE)
	if err != nil {
		return nil, false
	}
	return unsafe.Slice((*byte)(addr), n), true
}

// runs waits for the mappings and returns process id's.
func (m *premap) runs(id uint32) []mappedRun {
	if m == nil {
		return nil
	}
	<-m.done
	return m.files[id]
}

// unmap waits for the mappings and removes them all.
func (m *premap) unmap() {
	if m == nil {
		return
	}
	<-m.done
	m.unmapAll()
}

func (m *premap) unmapAll() {
	for _, r := range m.res {
		_ = unix.MunmapPtr(r, m.sizes[r])
	}
	m.res, m.files = nil, map[uint32][]mappedRun{}
}

// receivePlaced writes the next n bytes of the stream sk into fd at off: through maps
// where they cover it, spliced (p, pipeSize) elsewhere. It returns the bytes it wrote
// through maps.
func receivePlaced(sk int, p [2]int, pipeSize, fd int, maps []mappedRun, off, n int64) (int64, error) {
	var mapped int64
	for n > 0 {
		next := off + n // where the part handled now ends
		var into []byte
		for _, r := range maps {
			end := r.off + int64(len(r.b))
			switch {
			case off >= r.off && off < end:
				into = r.b[off-r.off : min(end, off+n)-r.off]
			case r.off > off && r.off < next:
				next = r.off // spliced up to the next mapping
			}
			if into != nil {
				break
			}
		}
		if into == nil {
			if err := spliceIn(sk, p, pipeSize, fd, off, next-off); err != nil {
				return mapped, err
			}
			n -= next - off
			off = next
			continue
		}
		if err := readPages(sk, into); err != nil {
			return mapped, err
		}
		mapped += int64(len(into))
		n -= int64(len(into))
		off += int64(len(into))
	}
	return mapped, nil
}

// readPages reads len(b) bytes of pages from the stream into b.
func readPages(sk int, b []byte) error {
	err := readFull(sk, b)
	if errors.Is(err, errEOF) || errors.Is(err, errShort) {
		return errors.New("receive pages: criu closed the connection mid-run")
	}
	if err != nil {
		return fmt.Errorf("receive pages: %w", err)
	}
	return nil
}
