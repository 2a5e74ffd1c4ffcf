package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docFields reads docs/stages.md: for each document kind (a "## `lazyfork.x`" heading),
// the fields its table lists, each with its row (which says when a field is omitted).
func docFields(t *testing.T) map[string]map[string]string {
	t.Helper()
	b, err := os.ReadFile("../../docs/stages.md")
	if err != nil {
		t.Fatal(err)
	}
	heading := regexp.MustCompile("^## `(lazyfork\\.[a-z-]+)`")
	tick := regexp.MustCompile("`([a-z0-9_]+)`")
	out := map[string]map[string]string{}
	var kind string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "## ") {
			kind = ""
			if m := heading.FindStringSubmatch(line); m != nil {
				kind = m[1]
				out[kind] = map[string]string{}
			}
			continue
		}
		if kind == "" || !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(line, "|")
		for _, m := range tick.FindAllStringSubmatch(cells[1], -1) {
			out[kind][m[1]] = line
		}
	}
	return out
}

// Every stage run for real, every document it prints checked against docs/stages.md: a
// field printed must be documented, a field documented must be printed by some run unless
// its row says when it is omitted, every document carries its kind and version 1, and
// every documented kind is printed.
func TestStageDocumentsMatchDocs(t *testing.T) {
	documented := docFields(t)
	e := newEnv(t)
	root := strings.TrimPrefix(e.vars[0], "LAZYFORK_ROOT=")
	work := filepath.Join(root, "docs-test")
	if err := os.MkdirAll(work, 0o700); err != nil {
		t.Fatal(err)
	}
	printed := map[string][]map[string]any{}
	collect := func(what, out string) {
		t.Helper()
		n := 0
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if !strings.HasPrefix(line, "{") {
				continue
			}
			var doc map[string]any
			if err := json.Unmarshal([]byte(line), &doc); err != nil {
				t.Fatalf("%s: not JSON: %v: %s", what, err, line)
			}
			kind, _ := doc["kind"].(string)
			if kind == "" || doc["version"] != float64(1) {
				t.Errorf("%s: document without kind or version 1: %.200s", what, line)
				continue
			}
			printed[kind] = append(printed[kind], doc)
			n++
		}
		if n == 0 {
			t.Errorf("%s printed no document: %q", what, out)
		}
	}
	run := func(cmd string) string {
		t.Helper()
		out := e.must(cmd)
		collect(cmd, out)
		return out
	}
	file := func(name, content string) string {
		p := filepath.Join(work, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	e.counting("c1", 1)
	rec := file("c1.json", run("lf-tree get c1"))
	run("lf-tree list")
	run("lf-tree put " + rec)
	dumped := file("d.json", run("lf-tree get c1 | lf-dump -"))
	run("lf-inspect --json " + dumped)
	run("lf-memfile --dry-run < " + dumped)
	memfiled := file("m.json", run("lf-memfile - < "+dumped))
	run("lf-inspect --json < " + memfiled)
	forkLines, progress, code := e.sh("lf-restore -n 2 --progress " + memfiled)
	if code != 0 {
		t.Fatalf("lf-restore: exit %d: %s", code, progress)
	}
	collect("lf-restore", forkLines)
	collect("lf-restore --progress (stderr)", progress)
	run("lf-tree children c1")

	// A fork stopped, then its record removed: nothing of it runs or stays mounted.
	var f struct{ ID string }
	if err := json.Unmarshal([]byte(strings.Split(forkLines, "\n")[0]), &f); err != nil {
		t.Fatal(err)
	}
	e.must("lazyfork stop " + f.ID)
	run("lf-tree get " + f.ID) // stopped: snapshot
	run("lf-tree rm " + f.ID)
	e.must("lazyfork gc")

	// Raw mode on a copy of a plain dump of c1.
	d2 := e.must("lf-dump c1")
	var s2 struct {
		CheckpointDir string `json:"images_dir"`
	}
	if err := json.Unmarshal([]byte(d2), &s2); err != nil {
		t.Fatal(err)
	}
	raw := filepath.Join(e.run, "raw") // the memory files must live on tmpfs
	e.must(fmt.Sprintf("cp -a %s %s", s2.CheckpointDir, raw))
	run("lf-memfile --no-file-private " + raw) // its libraries are paths inside the container
	run("lf-inspect --json " + raw)

	// lf-overlay and lf-cgroup on their own.
	low := filepath.Join(work, "low")
	if err := os.MkdirAll(low, 0o700); err != nil {
		t.Fatal(err)
	}
	layer := file("layer.json", run(fmt.Sprintf("lf-overlay prepare --lower %s --upper %s/up --work %s/wk --target %s/mnt", low, work, work, work)))
	run("lf-overlay teardown - < " + layer)
	name := fmt.Sprintf("lfdocs-%d", os.Getpid())
	cg := file("cg.json", run("lf-cgroup create "+name))
	t.Cleanup(func() { e.sh("lf-cgroup remove " + cg) })
	run("lf-cgroup stats " + cg)
	run("lf-cgroup procs < " + cg)
	run("lf-cgroup freeze " + cg + " | lf-cgroup thaw")
	run("lf-cgroup kill " + cg)
	run("lf-cgroup host")
	run("lf-cgroup remove " + cg)

	for kind, docs := range printed {
		fields, ok := documented[kind]
		if !ok {
			t.Errorf("%s is printed but docs/stages.md has no section for it", kind)
			continue
		}
		seen := map[string]bool{}
		for _, d := range docs {
			for k := range d {
				seen[k] = true
				if _, ok := fields[k]; !ok {
					t.Errorf("%s: field %q is printed but not in docs/stages.md", kind, k)
				}
			}
		}
		for k, row := range fields {
			if !seen[k] && !strings.Contains(row, "omitted") && !strings.Contains(row, "only") {
				t.Errorf("%s: field %q is documented but never printed (and its row does not say when it is omitted)", kind, k)
			}
		}
	}
	var missing []string
	for kind := range documented {
		if len(printed[kind]) == 0 {
			missing = append(missing, kind)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("documented but never printed by any stage: %v", missing)
	}
}
