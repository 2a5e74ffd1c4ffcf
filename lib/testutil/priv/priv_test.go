package priv_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/lazyfork/lazyfork/lib/testutil/priv"
)

// TestMissChild is run by TestMiss as a child: it always misses its requirement.
func TestMissChild(t *testing.T) {
	if os.Getenv("PRIV_CHILD") != "1" {
		t.Skip("run by TestMiss")
	}
	priv.Miss(t, "no such device")
}

// A missing requirement skips on a developer's machine and fails where privileged tests
// are required.
func TestMiss(t *testing.T) {
	for _, c := range []struct {
		env      []string
		fail     bool
		inOutput string
	}{
		{[]string{"CI=", "LF_REQUIRE_PRIV="}, false, "SKIP"},
		{[]string{"CI=", "LF_REQUIRE_PRIV=1"}, true, "privileged test cannot run: no such device"},
		{[]string{"CI=true", "LF_REQUIRE_PRIV="}, true, "privileged test cannot run: no such device"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissChild$", "-test.v")
		cmd.Env = append(append(os.Environ(), "PRIV_CHILD=1"), c.env...)
		out, err := cmd.CombinedOutput()
		if (err != nil) != c.fail || !strings.Contains(string(out), c.inOutput) {
			t.Errorf("%v: err %v, output:\n%s", c.env, err, out)
		}
	}
}
