package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/testutil"
)

// lf-inspect explains a real checkpoint before and after the rewrite, in a pipeline, and
// changes nothing.
func TestInspectExplainsACheckpoint(t *testing.T) {
	e := newEnv(t)
	e.must("lazyfork create lazyfork/debian:bookworm --name heap -- python3 -c 'import time; b = bytearray(32 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint(1, flush=True)\nwhile True: time.sleep(1)'")
	testutil.Eventually(t, 20*time.Second, "the heap to be written", func() bool {
		out, _, _ := e.sh("lazyfork attach --no-follow heap")
		return strings.TrimSpace(out) == "1"
	})
	type report struct {
		Tasks     int
		Rewritten bool
		VMAs      []struct {
			Decision, Why, File string
			Pages               int64
		}
		Pages struct {
			InCheckpoint  int64 `json:"in_image"`
			ToMemoryFiles int64 `json:"to_memory_files"`
			SharedFamily  int64 `json:"shared_family"`
		} `json:"pages"`
		Files []struct {
			Name, Kind string
			Exists     bool
		}
	}
	decode := func(out string) report {
		var r report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("lf-inspect --json: %v\n%s", err, out)
		}
		return r
	}
	dumped := e.must("lf-dump heap > " + e.run + "/d.json && cat " + e.run + "/d.json")
	before := e.must("ls -lR " + e.run + "/snapshots")
	r := decode(e.must("lf-inspect --json < " + e.run + "/d.json"))
	if r.Tasks != 1 || r.Rewritten || r.Pages.ToMemoryFiles < 8000 || r.Pages.InCheckpoint < r.Pages.ToMemoryFiles {
		t.Errorf("before the rewrite: %+v", r.Pages)
	}
	moved, kept := 0, 0
	for _, v := range r.VMAs {
		if v.Why == "" {
			t.Errorf("VMA without a reason: %+v", v)
		}
		switch v.Decision {
		case "move":
			moved++
		case "keep":
			kept++
		}
	}
	if moved == 0 || kept == 0 || !strings.Contains(e.must("lf-inspect < "+e.run+"/d.json"), "private anonymous memory") {
		t.Errorf("decisions: %d move, %d keep", moved, kept)
	}
	if after := e.must("ls -lR " + e.run + "/snapshots"); after != before {
		t.Errorf("lf-inspect changed the snapshot:\n%s\n---\n%s", before, after)
	}
	_ = dumped
	// lf-memfile --dry-run prints the same plan and writes nothing.
	if plan := decode(e.must("lf-memfile --dry-run < " + e.run + "/d.json")); plan.Pages.ToMemoryFiles != r.Pages.ToMemoryFiles || len(plan.VMAs) != len(r.VMAs) {
		t.Errorf("dry run plan %+v, inspect %+v", plan.Pages, r.Pages)
	}
	if after := e.must("ls -lR " + e.run + "/snapshots"); after != before {
		t.Errorf("lf-memfile --dry-run changed the snapshot")
	}
	// After the rewrite the checkpoint maps the family's memory files; --explain says why.
	if _, stderr, code := e.sh("lf-memfile --explain < " + e.run + "/d.json > " + e.run + "/m.json"); code != 0 || !strings.Contains(stderr, "pages to memory files") || !strings.Contains(stderr, "private anonymous memory") {
		t.Errorf("lf-memfile --explain: exit %d, stderr:\n%s", code, stderr)
	}
	r = decode(e.must("lf-inspect --json < " + e.run + "/m.json"))
	if !r.Rewritten || r.Pages.SharedFamily < 8000 || r.Pages.ToMemoryFiles != 0 {
		t.Errorf("after the rewrite: rewritten=%v %+v", r.Rewritten, r.Pages)
	}
	anon := false
	for _, f := range r.Files {
		anon = anon || (f.Kind == "anon" && f.Exists)
	}
	if !anon {
		t.Errorf("no anonymous memory file listed: %+v", r.Files)
	}
	// Bad input: one line, non-zero.
	if _, stderr, code := e.sh("lf-inspect /etc"); code == 0 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "neither a snapshot nor a checkpoint") {
		t.Errorf("lf-inspect /etc: exit %d stderr=%q", code, stderr)
	}
}
