package stagecmd_test

import (
	"os/exec"
	"strings"
	"testing"
)

// Each stage binary links only what its stage needs (`go list -deps`): the stages that
// read or rewrite images and records carry no CRIU RPC, cgroup library, container
// runtime or registry client, and no stage carries the daemon or its HTTP client. Nor
// does lazyfork-helper, which carries hardly anything, nor lazyfork itself (the client
// half of the porcelain), which carries the daemon's client and nothing of the runtime.
func TestStageDependencies(t *testing.T) {
	const lf = "github.com/lazyfork/lazyfork/lib/"
	heavy := []string{
		"github.com/checkpoint-restore/go-criu/v8/rpc", "github.com/checkpoint-restore/go-criu/v7/rpc", lf + "criu",
		"github.com/containerd/cgroups", lf + "cgroup",
		lf + "container", lf + "fork", lf + "overlay", lf + "hook",
		lf + "image", "github.com/google/go-containerregistry",
	}
	everyStage := []string{lf + "daemon", lf + "client"}
	// The seccomp compiler (lib/confine/filters): its syscall tables' set-up was the
	// largest package init of the two binaries whose start every exec and fork through
	// the daemon pays; they load (helper) or never touch (client) compiled programs.
	compiler := []string{lf + "confine/filters", "github.com/elastic/go-seccomp-bpf", "github.com/moby/profiles"}
	banned := map[string][]string{
		"lf-memfile": heavy,
		"lf-inspect": heavy,
		// lf-tree reads snapshot trees through lib/treedoc (the documents), not
		// lib/snaptree (the operations, which link the pipeline).
		"lf-tree":      heavy,
		"lib/stage":    heavy,
		"lib/store":    heavy,
		"lib/snapshot": heavy,
		"lf-overlay":   {"github.com/checkpoint-restore/", "github.com/containerd/cgroups", lf + "container", lf + "image", lf + "store"},
		"lf-cgroup":    {"github.com/checkpoint-restore/", lf + "container", lf + "image", lf + "store", lf + "overlay"},
		// Started by every exec (lib/helper): its start is part of each one's time.
		"cmd/lazyfork-helper": append(append(heavy, compiler...), "google.golang.org/protobuf", "net/http", "github.com/alecthomas/kong", lf+"store", lf+"stage", lf+"paths"),
		// The command users type (lib/porcelain over the daemon's client): its start is
		// part of every fork's and exec's time through the daemon; it hands the rest to
		// lazyfork-engine. The daemon's client is its job; the daemon is not.
		"cmd/lazyfork": append(append(heavy, compiler...), "google.golang.org/protobuf", lf+"daemon", lf+"snaptree", lf+"doctor",
			lf+"ksm", lf+"memfile", lf+"snapshot", lf+"network", "github.com/klauspost/compress"),
		"lf-dump":    nil,
		"lf-restore": nil,
	}
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	for stage, bans := range banned {
		cmd := exec.Command("go", "list", "-deps", "./"+stage) // a stage binary, or a package
		cmd.Dir = strings.TrimSpace(string(root))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps ./%s: %v", stage, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 10 {
			t.Fatalf("%s: only %d dependencies listed: %q", stage, len(deps), out)
		}
		if stage != "cmd/lazyfork" {
			bans = append(bans, everyStage...)
		}
		for _, dep := range deps {
			for _, b := range bans {
				// A banned path bans itself and what is below it (lib/cgroup bans
				// lib/cgroup/v2...), except lib/cgroup/owned, the pure path check, and
				// lib/container/config, the settings' flags.
				if (dep == b || strings.HasPrefix(dep, b+"/") || strings.HasSuffix(b, "/") && strings.HasPrefix(dep, b)) && dep != lf+"cgroup/owned" && dep != lf+"container/config" {
					t.Errorf("%s links %s", stage, dep)
				}
			}
		}
	}
}
