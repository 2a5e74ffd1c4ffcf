package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
)

// DefaultPrivateBinary is where `make setup` unpacks a private CRIU when the distribution's
// is too old for the kernel (scripts/setup.sh).
const DefaultPrivateBinary = "/usr/local/lib/lazyfork/criu/bin/criu"

// distributionBinary is where Debian and Ubuntu's criu package puts it.
const distributionBinary = "/usr/sbin/criu"

// Binary is the CRIU that LazyFork runs and where that choice came from. It is found by
// explicit path, never by PATH: another criu first on PATH (an older distribution package,
// a build in /usr/local/sbin) must not change what dumps and restores.
type Binary struct {
	Path   string `json:"path"`
	Source string `json:"source"` // "LAZYFORK_CRIU" (--criu), "private (make setup)", "distribution"
}

// FindBinary resolves the CRIU binary: explicit if set (the operator's --criu, which the
// mains' kong flags fill from $LAZYFORK_CRIU), else the private one from `make setup`, else
// the distribution's.
func FindBinary(explicit string) (Binary, error) {
	if explicit != "" {
		if err := executable(explicit); err != nil {
			return Binary{}, fmt.Errorf("LAZYFORK_CRIU=%s: %w: point it at a criu binary or unset it", explicit, err)
		}
		return Binary{Path: explicit, Source: "LAZYFORK_CRIU"}, nil
	}
	if executable(DefaultPrivateBinary) == nil {
		return Binary{Path: DefaultPrivateBinary, Source: "private (make setup)"}, nil
	}
	if executable(distributionBinary) == nil {
		return Binary{Path: distributionBinary, Source: "distribution"}, nil
	}
	return Binary{}, errors.New("criu not found (neither " + DefaultPrivateBinary + " nor " + distributionBinary + "): run `make setup`, or set LAZYFORK_CRIU to a criu binary")
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}

// binaryPath is FindBinary's path, for the places that start criu.
func binaryPath(explicit string) (string, error) {
	b, err := FindBinary(explicit)
	return b.Path, err
}

// pageServerWide remembers, by binary (path, size and time: an upgrade in place is asked
// again), whether that criu speaks the page-server protocol memfile.PageServer reads: a
// version request costs a criu start.
var pageServerWide sync.Map

// SpeaksWidePageServer reports whether the criu binary (FindBinary's explicit path, ""
// = the default) is 4.2 or later, whose page-server header carries nr_pages as a u64
// (32 bytes). CRIU 4.1 sends a 24-byte header, which memfile.PageServer does not read:
// with it a dump would wait on the server until its deadline.
func SpeaksWidePageServer(ctx context.Context, binary string) bool {
	path, err := binaryPath(binary)
	if err != nil {
		return false
	}
	fi, err := os.Stat(path)
	if err != nil {
		return false
	}
	key := fmt.Sprintf("%s %d %d", path, fi.Size(), fi.ModTime().UnixNano())
	if v, ok := pageServerWide.Load(key); ok {
		return v.(bool)
	}
	major, minor, _, err := Version(ctx, path)
	if err != nil {
		return false // not remembered: a criu that failed once may answer next time
	}
	wide := major > 4 || major == 4 && minor >= 2
	pageServerWide.Store(key, wide)
	return wide
}
