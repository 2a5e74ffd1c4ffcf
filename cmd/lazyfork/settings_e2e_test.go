package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/criu"
)

// TestSettingsFromEnvironment: the operator's settings come from the same environment
// variables (or the flags) now that only the mains read them and lib gets explicit values:
// doctor names the CRIU it runs and where that came from, the layer limit reaches an image
// pull, and the cgroup parent reaches lf-cgroup's default and lf-tree's record check.
func TestSettingsFromEnvironment(t *testing.T) {
	e := newEnv(t)
	e.vars = append(e.vars, "LAZYFORK_LOCAL=1") // never a daemon that happens to run here

	t.Run("criu", func(t *testing.T) {
		def, err := criu.FindBinary("")
		if err != nil {
			t.Fatal(err)
		}
		criuCheck := func(cmd string) client.Check {
			t.Helper()
			out, stderr, _ := e.sh(cmd + " --json") // exits 1 when any check fails
			var checks []client.Check
			if err := json.Unmarshal([]byte(out), &checks); err != nil {
				t.Fatalf("%s: %v: %s", cmd, err, stderr)
			}
			for _, c := range checks {
				if c.Name == "criu" {
					return c
				}
			}
			t.Fatalf("%s: no criu check in %s", cmd, out)
			return client.Check{}
		}
		if c := criuCheck("LAZYFORK_CRIU= lazyfork doctor"); !c.OK || !strings.HasSuffix(c.Detail, def.Path+" ("+def.Source+")") {
			t.Errorf("doctor without a setting: %+v, want %s (%s)", c, def.Path, def.Source)
		}
		for _, cmd := range []string{"LAZYFORK_CRIU=" + def.Path + " lazyfork doctor", "lazyfork --criu " + def.Path + " doctor"} {
			if c := criuCheck(cmd); !c.OK || !strings.HasSuffix(c.Detail, def.Path+" (LAZYFORK_CRIU)") {
				t.Errorf("%s: %+v, want %s (LAZYFORK_CRIU)", cmd, c, def.Path)
			}
		}
		if c := criuCheck("LAZYFORK_CRIU=/nonexistent/criu lazyfork doctor"); c.OK || !strings.Contains(c.Detail, "LAZYFORK_CRIU=/nonexistent/criu") {
			t.Errorf("doctor with a CRIU that does not exist: %+v", c)
		}
	})

	t.Run("max layer bytes", func(t *testing.T) {
		tarPath := filepath.Join(t.TempDir(), "missing.tar") // the setting is read before the source
		for _, cmd := range []string{"LAZYFORK_MAX_LAYER_BYTES=lots lazyfork image pull " + tarPath, "lazyfork --max-layer-bytes lots image pull " + tarPath} {
			_, stderr, code := e.sh(cmd)
			if code == 0 || !strings.Contains(stderr, `LAZYFORK_MAX_LAYER_BYTES="lots": not a size`) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("%s: exit %d, stderr %q: want one line naming the setting", cmd, code, stderr)
			}
		}
	})

	t.Run("cgroup parent", func(t *testing.T) {
		// Read only: lf-cgroup host resolves the default parent without touching a group.
		host := func(cmd string) map[string]string {
			t.Helper()
			var f struct {
				DefaultParent map[string]string `json:"default_parent"`
			}
			if err := json.Unmarshal([]byte(e.must(cmd)), &f); err != nil || len(f.DefaultParent) == 0 {
				t.Fatalf("%s: %v", cmd, err)
			}
			return f.DefaultParent
		}
		const op = "/lf-settings-test/lazyfork"
		for _, cmd := range []string{"LAZYFORK_CGROUP_PARENT=" + op + " lf-cgroup host", "lf-cgroup --cgroup-parent " + op + " host"} {
			for k, p := range host(cmd) {
				if p != op {
					t.Errorf("%s: default_parent %s = %s, want %s", cmd, k, p, op)
				}
			}
		}
		for k, p := range host("LAZYFORK_CGROUP_PARENT= lf-cgroup host") {
			if p == op {
				t.Errorf("default_parent %s = %s without the setting", k, p)
			}
		}
		// A record whose group sits under the operator's parent is LazyFork's only when the
		// operator says so; the document alone cannot make it so.
		rec := filepath.Join(t.TempDir(), "rec.json")
		doc := `{"id":"0000000000aa","name":"settings","state":"stopped","cgroup":{"memory":"/lf-settings-test/c"}}`
		if err := os.WriteFile(rec, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, stderr, code := e.sh("LAZYFORK_CGROUP_PARENT= lf-tree put " + rec); code == 0 || !strings.Contains(stderr, "not a LazyFork cgroup") {
			t.Errorf("lf-tree put of a group outside the subtree: exit %d, %s", code, stderr)
		}
		for _, cmd := range []string{"LAZYFORK_CGROUP_PARENT=/lf-settings-test lf-tree put " + rec, "lf-tree --cgroup-parent /lf-settings-test put " + rec} {
			e.must(cmd)
		}
		e.must("lf-tree rm 0000000000aa")
	})
}
