package testutil

import (
	"os"
	"testing"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/helper"
	"github.com/lazyfork/lazyfork/lib/testutil/timescale"
)

// Main is the TestMain of a package whose tests run containers in the test process.
func Main(m *testing.M) {
	Setup()
	os.Exit(m.Run())
}

// Setup is Main before the tests run, for a TestMain with children of its own to
// dispatch first: the test binary stands in for LazyFork's own when it is re-executed
// as CRIU's kdat helper, a container's init or cgexec; and CRIU's deadlines scale with
// $LF_TEST_TIME_SCALE (under emulation, make test-v2, a 256 MB restore alone can take a
// minute).
func Setup() {
	criu.MaybeKdatHelper()
	container.MaybeInit()
	helper.Maybe() // Runtime.Helper is the test binary when $LAZYFORK_BIN has no lazyfork-helper
	fork.DumpTimeout, fork.RestoreTimeout = timescale.Scale(fork.DumpTimeout), timescale.Scale(fork.RestoreTimeout)
	fork.SwapRestoreTimeout = timescale.Scale(fork.SwapRestoreTimeout)
}
