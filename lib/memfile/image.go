package memfile

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/checkpoint-restore/go-criu/v8/crit"
	"github.com/checkpoint-restore/go-criu/v8/magic"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// ErrNotCheckpoint is returned for a directory without inventory.img.
var ErrNotCheckpoint = errors.New("not a checkpoint (CRIU image directory)")

// ErrTruncated is returned for an image file that ends inside an entry or lacks data.
var ErrTruncated = errors.New("image file is truncated")

// ErrUnaccounted: the pagemap does not account for every page in the pages image.
var ErrUnaccounted = errors.New("pagemap does not account for the checkpoint's pages")

// checkCheckpointDir fails with a message that tells the user what to pass instead.
func checkCheckpointDir(dir string) error {
	st, err := os.Stat(filepath.Join(dir, "inventory.img"))
	if err != nil || !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a checkpoint (no inventory.img: not a CRIU image directory); pass the checkpoint dir printed by lf-dump (images_dir): %w", dir, ErrNotCheckpoint)
	}
	return nil
}

// loadImage decodes one image file with go-criu's crit. crit reads entries with bare
// Read calls and would take a short read for a whole entry, so the framing is first
// walked with io.ReadFull: a truncated file fails here, naming the file.
func loadImage(dir, name, wantMagic string, entry proto.Message) (*crit.CriuImage, error) {
	path := filepath.Join(dir, name)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open image %s: %w", name, err)
	}
	defer f.Close()
	if err := checkFraming(f, name); err != nil {
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("rewind image %s: %w", name, err)
	}
	img, err := crit.New(f, nil, "", false, false).Decode(entry)
	if err != nil {
		return nil, fmt.Errorf("decode image %s: %w", name, err)
	}
	if img.Magic != wantMagic {
		return nil, fmt.Errorf("decode image %s: magic %s, want %s", name, img.Magic, wantMagic)
	}
	return img, nil
}

// imageMagics is go-criu's table of image magics, built once (LoadMagic fills two maps on
// each call). Read-only afterwards.
var imageMagics = sync.OnceValue(magic.LoadMagic)

// checkFraming walks magic, then (size, payload) records to the end of the file.
func checkFraming(f *os.File, name string) error {
	magics := imageMagics()
	br := bufio.NewReaderSize(f, 64<<10)
	var hdr [4]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return framingErr(name, "magic", err)
	}
	m := uint64(binary.LittleEndian.Uint32(hdr[:]))
	if m == magics.ByName["IMG_COMMON"] || m == magics.ByName["IMG_SERVICE"] {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return framingErr(name, "magic", err)
		}
	}
	for i := 0; ; i++ {
		n, err := io.ReadFull(br, hdr[:])
		if err == io.EOF && n == 0 {
			return nil
		}
		if err != nil {
			return framingErr(name, fmt.Sprintf("size of entry %d", i), err)
		}
		size := int(binary.LittleEndian.Uint32(hdr[:]))
		if d, err := br.Discard(size); d != size {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return framingErr(name, fmt.Sprintf("entry %d (%d of %d bytes)", i, d, size), err)
		}
	}
}

func framingErr(name, what string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("read image %s: %w: ends inside %s", name, ErrTruncated, what)
	}
	return fmt.Errorf("read image %s: %w", name, err)
}

// storeImage encodes img with crit into a new file (O_EXCL: temp names are ours alone).
func storeImage(path string, img *crit.CriuImage) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create image %s: %w", filepath.Base(path), err)
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close image %s: %w", filepath.Base(path), cerr)
		}
	}()
	if err := crit.New(nil, f, "", false, false).Encode(img); err != nil {
		return fmt.Errorf("encode image %s: %w", filepath.Base(path), err)
	}
	return nil
}
