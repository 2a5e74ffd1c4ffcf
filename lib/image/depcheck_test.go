package image

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDepcheck keeps CRIU and cgroup code out of the image store, which the pull and
// import paths (and their tests) must not need.
func TestDepcheck(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not on PATH")
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/checkpoint-restore/", "github.com/containerd/cgroups"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("lib/image depends on %s", dep)
			}
		}
	}
}
