package cgroup

import (
	"os"
	"testing"

	"github.com/lazyfork/lazyfork/lib/cgroup/owned"
)

// The test binary is configured as a main would be: the operator's parent from the
// environment the suite runs in (make test-v2's LF_V2_CGROUP_PARENT).
func init() { owned.SetParent(os.Getenv(ParentEnv)) }

// setParent gives one test the operator's parent p and puts the run's back at the end.
func setParent(t *testing.T, p string) {
	t.Helper()
	old := owned.Parent()
	owned.SetParent(p)
	t.Cleanup(func() { owned.SetParent(old) })
}
