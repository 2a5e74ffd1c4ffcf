package memfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/checkpoint-restore/go-criu/v8/crit"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pagemap"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// A page server for CRIU's dump (criu/page-xfer.c: `criu dump --page-server`, here over
// a socket pair, swrk's ps.fd): CRIU sends each run of pages with its address, and the
// server writes a process's pages straight into its memory file at offset = address
// (the file Preallocate made, when there is one) instead of CRIU writing pages-*.img
// for the rewrite to copy again. One copy of the heap while the source is frozen, into
// pages allocated before. The pagemap images are written as CRIU's would be, with the
// pages images left empty: the rewrite (Options.Placed) reads the pages from the files.
// Shared memory's pages (memfd, shared anonymous) go to ordinary pages images.

// The protocol: a 32-byte header {u32 cmd; u64 nr_pages; u64 vaddr; u64 dst_id} (x86-64
// layout: cmd padded to 8), the pages after an ADD with PE_PRESENT.
const (
	psIovAdd        = 1
	psIovHole       = 2
	psIovOpen       = 3
	psIovOpen2      = 4
	psIovParent     = 5
	psIovAddF       = 6
	psIovClose      = 0x1023
	psIovForceClose = 0x1024
	psTypePid       = 1
	psTypeShmem     = 2
	pePresentFlag   = 1 << 2
	psHeaderSize    = 32
	psSendBuffer    = 4 << 20
)

// PageServer receives one dump's pages. Start it, give Conn to criu, close Conn once criu
// has it (or has exited), then Wait.
type PageServer struct {
	Conn *os.File // criu's end of the socket pair

	checkpointDir, familyDir, prefix string
	sk                               int
	done                             chan struct{}
	err                              error
	placed                           map[uint32]string
	bytes                            int64
	premap                           *premap // the preallocated files, mapped
	mapped                           int64   // bytes written through premap's mappings
	closeOnce                        sync.Once
}

// StartPageServer serves a dump into checkpointDir (pagemap images) and familyDir
// (processes' pages, in the files PreallocName(prefix, pid) names, made if missing).
func StartPageServer(checkpointDir, familyDir, prefix string) (*PageServer, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("page server: %w", err)
	}
	// A deep send buffer on criu's end: with the default (~208 KiB) criu and the server
	// take turns every few pages, each turn a wake-up across CPUs while the source is
	// frozen (256 MiB through mapped files: 94-139 ms against 44-49 with 4 MiB, /tmp
	// benchmark of 2 Dec). SO_SNDBUFFORCE passes net.core.wmem_max; failing both, the
	// default stays.
	if unix.SetsockoptInt(fds[1], unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, psSendBuffer) != nil {
		_ = unix.SetsockoptInt(fds[1], unix.SOL_SOCKET, unix.SO_SNDBUF, psSendBuffer)
	}
	ps := &PageServer{
		Conn:          os.NewFile(uintptr(fds[1]), "criu-page-server"),
		checkpointDir: checkpointDir, familyDir: familyDir, prefix: prefix,
		sk: fds[0], done: make(chan struct{}), placed: map[uint32]string{},
		premap: startPremap(familyDir, prefix),
	}
	go func() {
		defer close(ps.done)
		defer ps.premap.unmap()
		ps.err = ps.serve()
		ps.shutdown()     // criu's next write fails instead of waiting on a server gone
		unix.Close(ps.sk) // nothing else uses it once serve has returned
	}()
	return ps, nil
}

// shutdown ends the stream both ways: a serve blocked reading it returns (a close from
// another thread would not wake it).
func (ps *PageServer) shutdown() {
	ps.closeOnce.Do(func() { _ = unix.Shutdown(ps.sk, unix.SHUT_RDWR) })
}

// Wait returns, once criu has ended the stream, the files holding each process's pages
// by the pid the checkpoint names it, and the bytes they received. Conn must be closed
// first. A server still reading after timeout (a helper of criu holding the socket) is
// ended, with an error.
func (ps *PageServer) Wait(timeout time.Duration) (map[uint32]string, int64, error) {
	select {
	case <-ps.done:
	case <-time.After(timeout):
		ps.Abort()
		return nil, 0, fmt.Errorf("page server: the dump's stream did not end within %v", timeout)
	}
	return ps.placed, ps.bytes, ps.err
}

// Abort ends the server (a dump that failed) and waits for it.
func (ps *PageServer) Abort() {
	ps.Conn.Close()
	ps.shutdown()
	<-ps.done
}

// psImage is the pagemap image being received and where its pages go.
type psImage struct {
	name    string // pagemap-<id>.img or pagemap-shmem-<id>.img
	pagesID uint32
	entries []*crit.CriuEntry
	fd      int         // the memory file (a process's) or the pages image (shared memory)
	placed  bool        // fd is a memory file: pages at offset = address
	off     int64       // next offset in a pages image
	maps    []mappedRun // a placed file's preallocated ranges, mapped
}

func (ps *PageServer) serve() (retErr error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("page server: %w", err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	pipeSize, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, 1<<20)
	if err != nil {
		if pipeSize, err = unix.FcntlInt(uintptr(p[1]), unix.F_GETPIPE_SZ, 0); err != nil {
			return fmt.Errorf("page server: %w", err)
		}
	}
	var cur *psImage
	nextPages := uint32(1)
	seen := map[string]bool{}
	finish := func() error {
		if cur == nil {
			return nil
		}
		img := cur
		cur = nil
		defer unix.Close(img.fd)
		head := &crit.CriuEntry{Message: &pagemap.PagemapHead{PagesId: proto.Uint32(img.pagesID)}}
		out := &crit.CriuImage{Magic: "PAGEMAP", Entries: append([]*crit.CriuEntry{head}, img.entries...)}
		if err := storeImage(filepath.Join(ps.checkpointDir, img.name), out); err != nil {
			return fmt.Errorf("page server: %w", err)
		}
		return nil
	}
	defer func() {
		if cur != nil {
			unix.Close(cur.fd)
		}
	}()
	hdr := make([]byte, psHeaderSize)
	for {
		if err := readFull(ps.sk, hdr); err != nil {
			if errors.Is(err, errEOF) {
				return ErrStreamCut
			}
			return fmt.Errorf("page server: %w", err)
		}
		cmd := binary.LittleEndian.Uint32(hdr[0:])
		nr := binary.LittleEndian.Uint64(hdr[8:])
		vaddr := binary.LittleEndian.Uint64(hdr[16:])
		dst := binary.LittleEndian.Uint64(hdr[24:])
		switch cmd & 0xffff {
		case psIovOpen, psIovOpen2:
			if err := finish(); err != nil {
				return err
			}
			id := dst >> 8
			if id > 1<<31 {
				return fmt.Errorf("page server: image id %d out of range", id)
			}
			img := &psImage{pagesID: nextPages}
			nextPages++
			switch dst & 0xff {
			case psTypePid:
				img.name = fmt.Sprintf("pagemap-%d.img", id)
				name := PreallocName(ps.prefix, uint32(id))
				fd, err := openPlaced(filepath.Join(ps.familyDir, name))
				if err != nil {
					return fmt.Errorf("page server: %w", err)
				}
				img.fd, img.placed = fd, true
				img.maps = ps.premap.runs(uint32(id))
				ps.placed[uint32(id)] = name
			case psTypeShmem:
				img.name = fmt.Sprintf("pagemap-shmem-%d.img", id)
				fd, err := unix.Open(filepath.Join(ps.checkpointDir, pagesImage(img.pagesID)),
					unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
				if err != nil {
					return fmt.Errorf("page server: %w", err)
				}
				img.fd = fd
			default:
				return fmt.Errorf("page server: image type %d is not a pagemap of this CRIU", dst&0xff)
			}
			if seen[img.name] {
				unix.Close(img.fd)
				return fmt.Errorf("page server: %s opened twice", img.name)
			}
			seen[img.name] = true
			if img.placed {
				if err := touchPages(ps.checkpointDir, img.pagesID); err != nil {
					unix.Close(img.fd)
					return err
				}
			}
			cur = img
			if cmd&0xffff == psIovOpen2 {
				if err := writeAll(ps.sk, []byte{0}); err != nil { // no parent checkpoint
					return fmt.Errorf("page server: %w", err)
				}
			}
		case psIovParent:
			if err := writeAll(ps.sk, make([]byte, 4)); err != nil {
				return fmt.Errorf("page server: %w", err)
			}
		case psIovAdd, psIovAddF, psIovHole:
			if cur == nil {
				return errors.New("page server: pages before any image was opened")
			}
			flags := cmd >> 16
			switch cmd & 0xffff {
			case psIovAdd:
				flags = pePresentFlag
			case psIovHole:
				flags = 1 // PE_PARENT
			}
			size := nr * uint64(pageSize)
			if nr == 0 || nr > 1<<31 || vaddr%uint64(pageSize) != 0 || vaddr+size < vaddr {
				return fmt.Errorf("page server: bad page run %#x+%d", vaddr, nr)
			}
			pe, err := newPagemapEntry(vaddr, int64(nr))
			if err != nil {
				return fmt.Errorf("page server: %w", err)
			}
			pe.Flags = proto.Uint32(flags)
			cur.entries = append(cur.entries, &crit.CriuEntry{Message: pe})
			if flags&pePresentFlag == 0 {
				continue
			}
			off := cur.off
			if cur.placed {
				if vaddr+size > uint64(AnonFileSize) {
					return fmt.Errorf("page server: pages at %#x lie past a memory file's %#x bytes", vaddr, AnonFileSize)
				}
				off = int64(vaddr)
			}
			mapped, err := receivePlaced(ps.sk, p, pipeSize, cur.fd, cur.maps, off, int64(size))
			ps.mapped += mapped
			if err != nil {
				return fmt.Errorf("page server: %s: %w", cur.name, err)
			}
			if !cur.placed {
				cur.off += int64(size)
			}
			ps.bytes += int64(size)
		case psIovClose, psIovForceClose:
			if err := finish(); err != nil {
				return err
			}
			if err := writeAll(ps.sk, make([]byte, 4)); err != nil { // status 0: all received
				return fmt.Errorf("page server: %w", err)
			}
			return nil
		default:
			return fmt.Errorf("page server: unknown command %#x", cmd)
		}
	}
}

// openPlaced opens a process's memory file for the server: Preallocate's, or a new one.
func openPlaced(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == nil {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != AnonFileSize {
			unix.Close(fd)
			return -1, fmt.Errorf("%s is not a memory file", path)
		}
		return fd, nil
	}
	if !errors.Is(err, unix.ENOENT) {
		return -1, err
	}
	fd, err = unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o400)
	if err != nil {
		return -1, err
	}
	if err := unix.Ftruncate(fd, AnonFileSize); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// touchPages makes the empty pages image a process's pagemap head names (its pages are
// in its memory file).
func touchPages(dir string, id uint32) error {
	f, err := os.OpenFile(filepath.Join(dir, pagesImage(id)), os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("page server: %w", err)
	}
	return f.Close()
}

// spliceIn moves n bytes from the socket to fd at off through the pipe: the socket's
// pages are referenced, not copied, into the pipe, and copied once into the file.
func spliceIn(sk int, p [2]int, pipeSize int, fd int, off, n int64) error {
	for n > 0 {
		got, err := unix.Splice(sk, nil, p[1], nil, int(min(n, int64(pipeSize))), unix.SPLICE_F_MOVE)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("receive pages: %w", err)
		}
		if got == 0 {
			return errors.New("receive pages: criu closed the connection mid-run")
		}
		for left := got; left > 0; {
			w, err := unix.Splice(p[0], nil, fd, &off, int(left), unix.SPLICE_F_MOVE)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return fmt.Errorf("write pages at %#x: %w", off, err)
			}
			left -= w
		}
		n -= got
	}
	return nil
}

var (
	errEOF   = errors.New("end of stream")
	errShort = errors.New("short header")
)

// ErrStreamCut: criu ended the stream without closing it (its dump failed, or was
// cancelled): criu's error says why.
var ErrStreamCut = errors.New("page server: criu closed the connection before the end of the dump")

func readFull(fd int, b []byte) error {
	first := true
	for len(b) > 0 {
		n, err := unix.Read(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			if first {
				return errEOF
			}
			return errShort
		}
		first = false
		b = b[n:]
	}
	return nil
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}
