package criu

import (
	"errors"
	"fmt"
	"os"
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
