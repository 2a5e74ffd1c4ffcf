package main

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// docs parses a stage's stdout: one JSON document a line.
func docs(t *testing.T, what, out string) []map[string]any {
	t.Helper()
	var all []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var d map[string]any
		if err := json.Unmarshal([]byte(line), &d); err != nil {
			t.Fatalf("%s: stdout is not JSON lines: %v: %.300s", what, err, out)
		}
		all = append(all, d)
	}
	return all
}

// sameDocs checks that --explain left stdout alone: as many documents, of the same kind,
// with the same fields and, where the run is repeatable (exact), the same values.
func sameDocs(t *testing.T, what, plain, explained string, exact bool) []map[string]any {
	t.Helper()
	a, b := docs(t, what, plain), docs(t, what+" --explain", explained)
	if len(a) != len(b) {
		t.Fatalf("%s: %d documents, with --explain %d", what, len(a), len(b))
	}
	for i := range a {
		ka, kb := slices.Sorted(maps.Keys(a[i])), slices.Sorted(maps.Keys(b[i]))
		if !slices.Equal(ka, kb) || a[i]["kind"] != b[i]["kind"] {
			t.Errorf("%s: --explain changed the document: fields %v, with --explain %v", what, ka, kb)
		}
		if exact && !reflect.DeepEqual(a[i], b[i]) {
			t.Errorf("%s: --explain changed the document:\n%v\n%v", what, a[i], b[i])
		}
	}
	return b
}

// account checks that an --explain account on stderr says each of want.
func account(t *testing.T, what, stderr string, want ...string) {
	t.Helper()
	t.Logf("%s --explain:\n%s", what, stderr)
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Errorf("%s --explain: stderr does not say %q:\n%s", what, w, stderr)
		}
	}
}

// files lists every file under dirs with its size and modification time, but for the
// running containers' own directories (their output log grows).
func files(t *testing.T, dirs ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, de fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if de.IsDir() && de.Name() == "containers" {
				return filepath.SkipDir
			}
			fi, err := de.Info()
			if err != nil {
				return err
			}
			out[p] = fmt.Sprintf("%v %d %d", fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// Every stage with --explain writes its account on stderr, from the facts of the step it
// ran, and prints on stdout the documents it prints without it. lf-memfile --dry-run
// writes nothing.
func TestStageExplain(t *testing.T) {
	e := newEnv(t)
	root := strings.TrimPrefix(e.vars[0], "LAZYFORK_ROOT=")
	work := filepath.Join(root, "explain-test")
	if err := os.MkdirAll(work, 0o700); err != nil {
		t.Fatal(err)
	}
	// both runs cmd (its "%s" replaced by "" and by "--explain") and returns the plain
	// stdout, the explained stdout and the explained stderr.
	both := func(t *testing.T, cmd string) (plain, explained, stderr string) {
		t.Helper()
		plain, stderr, code := e.sh(fmt.Sprintf(cmd, ""))
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", fmt.Sprintf(cmd, ""), code, stderr)
		}
		explained, stderr, code = e.sh(fmt.Sprintf(cmd, "--explain"))
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", fmt.Sprintf(cmd, "--explain"), code, stderr)
		}
		return plain, explained, stderr
	}
	save := func(name, content string) string {
		p := filepath.Join(work, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	e.counting("c1", 1)

	t.Run("lf-tree", func(t *testing.T) {
		plain, explained, stderr := both(t, "lf-tree get %s c1")
		rec := sameDocs(t, "lf-tree get", plain, explained, true)[0]
		account(t, "lf-tree get", stderr, "read: ", fmt.Sprintf("%s/container.json", rec["id"]))
		plain, explained, stderr = both(t, "lf-tree list %s")
		sameDocs(t, "lf-tree list", plain, explained, true)
		account(t, "lf-tree list", stderr, "read 1 record")
		rf := save("c1.json", plain)
		plain, explained, stderr = both(t, "lf-tree children %s c1")
		if plain != "" || explained != "" {
			t.Errorf("lf-tree children of c1 before any fork: %q, with --explain %q", plain, explained)
		}
		account(t, "lf-tree children", stderr, "read 0 record(s)")
		plain, explained, stderr = both(t, "lf-tree put %s "+rf)
		sameDocs(t, "lf-tree put", plain, explained, true)
		account(t, "lf-tree put", stderr, "wrote it atomically", fmt.Sprintf("%s/container.json: c1, state running", rec["id"]))
	})

	// Two dumps of c1, one explained: the same fields, an account with the dump's numbers.
	d1 := e.must("lf-dump c1")
	d2, stderr, code := e.sh("lf-dump --explain c1")
	if code != 0 {
		t.Fatalf("lf-dump --explain: exit %d: %s", code, stderr)
	}
	dumped := sameDocs(t, "lf-dump", d1, d2, false)[0]
	dump := dumped["dump"].(map[string]any)
	account(t, "lf-dump", stderr, "read: container c1 ", "froze its tasks",
		fmt.Sprintf("wrote checkpoint %s: %.0f of %.0f pages", dumped["images_dir"], dump["pages_written"], dump["pages_scanned"]),
		fmt.Sprintf("copied its writable layer to %s", dumped["layer"]), "thawed it", fmt.Sprint("family ", dumped["family"]))
	f1, f2 := save("d1.json", d1), save("d2.json", d2)

	t.Run("lf-memfile --dry-run", func(t *testing.T) {
		before := files(t, root, e.run)
		plain, explained, stderr := both(t, "lf-memfile --dry-run %s < "+f1)
		sameDocs(t, "lf-memfile --dry-run", plain, explained, true)
		account(t, "lf-memfile --dry-run", stderr, "VMAs", "=> ")
		if after := files(t, root, e.run); !maps.Equal(before, after) {
			for p, v := range after {
				if before[p] != v {
					t.Errorf("lf-memfile --dry-run wrote %s", p)
				}
			}
			for p := range before {
				if _, ok := after[p]; !ok {
					t.Errorf("lf-memfile --dry-run removed %s", p)
				}
			}
		}
	})

	t.Run("lf-memfile --dry-run raw", func(t *testing.T) {
		raw := filepath.Join(e.run, "raw") // a plain checkpoint: rewritten in place without --dry-run
		e.must(fmt.Sprintf("cp -a %s %s", dumped["images_dir"], raw))
		before := files(t, root, e.run)
		plain, explained, stderr := both(t, "lf-memfile --dry-run %s "+raw)
		sameDocs(t, "lf-memfile --dry-run (raw)", plain, explained, true)
		account(t, "lf-memfile --dry-run (raw)", stderr, "=> ")
		if after := files(t, root, e.run); !maps.Equal(before, after) {
			t.Errorf("lf-memfile --dry-run of a raw image changed files: %d before, %d after", len(before), len(after))
		}
		if _, err := os.Stat(raw + ".mem"); !os.IsNotExist(err) {
			t.Errorf("lf-memfile --dry-run made the family dir %s.mem (%v)", raw, err)
		}
	})

	inspPlain, inspExplained, stderr := both(t, "lf-inspect --json %s "+f1)
	sameDocs(t, "lf-inspect", inspPlain, inspExplained, true)
	account(t, "lf-inspect", stderr, "VMAs", "pages with data in the checkpoint")

	m1 := e.must("lf-memfile < " + f1)
	m2, stderr, code := e.sh("lf-memfile --explain < " + f2)
	if code != 0 {
		t.Fatalf("lf-memfile --explain: exit %d: %s", code, stderr)
	}
	memfiled := sameDocs(t, "lf-memfile", m1, m2, false)[0]
	mf := memfiled["memfile"].(map[string]any)
	account(t, "lf-memfile", stderr, "=> ", // the plan, then what was done
		fmt.Sprintf("moved %.0f pages of %.0f anonymous VMAs and %.0f copied-on-write file VMAs", mf["pages_moved"], mf["vmas_converted"], mf["file_vmas_converted"]),
		fmt.Sprintf("%.0f memory files in %s", mf["files"], memfiled["family_dir"]),
		fmt.Sprintf("%.0f pages stay in the checkpoint", mf["pages_kept"]), "MAP_PRIVATE")
	g1, g2 := save("m1.json", m1), save("m2.json", m2)

	r1 := e.must("lf-restore -n 1 " + g1)
	r2, stderr, code := e.sh("lf-restore --explain -n 1 " + g2)
	if code != 0 {
		t.Fatalf("lf-restore --explain: exit %d: %s", code, stderr)
	}
	fork := sameDocs(t, "lf-restore", r1, r2, false)[0]
	account(t, "lf-restore", stderr, fmt.Sprintf("read: snapshot %s (state memfiled)", memfiled["id"]),
		fmt.Sprintf("restored 1 fork(s) with CRIU; each maps the memory files of family %s", memfiled["family"]),
		fmt.Sprintf("fork %s: pid %.0f, hostname %s", fork["id"], fork["pid"], fork["hostname"]))

	// lf-tree rm of the stopped fork's record: the record goes, nothing else.
	e.must(fmt.Sprintf("lazyfork stop %s", fork["id"]))
	rm, stderr, code := e.sh(fmt.Sprintf("lf-tree rm --explain %s", fork["id"]))
	if code != 0 {
		t.Fatalf("lf-tree rm --explain: exit %d: %s", code, stderr)
	}
	if d := docs(t, "lf-tree rm", rm); d[0]["removed"] != true || d[0]["id"] != fork["id"] {
		t.Errorf("lf-tree rm --explain printed %v", d[0])
	}
	account(t, "lf-tree rm", stderr, "removed the record's directory", fmt.Sprintf("%s/container.json: %s, state stopped", fork["id"], fork["id"]))
	e.must("lazyfork gc")

	t.Run("lf-overlay", func(t *testing.T) {
		low := filepath.Join(work, "low")
		if err := os.MkdirAll(low, 0o700); err != nil {
			t.Fatal(err)
		}
		prep := fmt.Sprintf("lf-overlay prepare %%s --lower %s --upper %s/up --work %s/wk --target %s/mnt", low, work, work, work)
		l1 := e.must(fmt.Sprintf(prep, ""))
		t1 := e.must("lf-overlay teardown " + save("l1.json", l1))
		l2, stderr, code := e.sh(fmt.Sprintf(prep, "--explain"))
		if code != 0 {
			t.Fatalf("lf-overlay prepare --explain: exit %d: %s", code, stderr)
		}
		sameDocs(t, "lf-overlay prepare", l1, l2, true)
		account(t, "lf-overlay prepare", stderr, fmt.Sprintf("mounted overlay on %s/mnt with lowerdir=%s,upperdir=%s/up", work, low, work))
		t2, stderr, code := e.sh("lf-overlay --explain teardown " + save("l2.json", l2))
		if code != 0 {
			t.Fatalf("lf-overlay teardown --explain: exit %d: %s", code, stderr)
		}
		sameDocs(t, "lf-overlay teardown", t1, t2, true)
		account(t, "lf-overlay teardown", stderr, fmt.Sprintf("unmounted everything at or below %s/mnt", work), "left alone: the lower layers "+low)
	})

	t.Run("lf-cgroup", func(t *testing.T) {
		name := fmt.Sprintf("lfexplain-%d", os.Getpid())
		created, stderr, code := e.sh("lf-cgroup create --explain " + name)
		if code != 0 {
			t.Fatalf("lf-cgroup create --explain: exit %d: %s", code, stderr)
		}
		cg := save("cg.json", created)
		t.Cleanup(func() { e.sh("lf-cgroup remove " + cg) })
		account(t, "lf-cgroup create", stderr, "made group "+name)
		var g struct {
			FreezerDir string `json:"freezer_dir"`
		}
		if err := json.Unmarshal([]byte(created), &g); err != nil {
			t.Fatal(err)
		}
		for _, op := range []string{"freeze", "thaw", "kill"} {
			plain, explained, stderr := both(t, "lf-cgroup "+op+" %s "+cg)
			sameDocs(t, "lf-cgroup "+op, plain, explained, true)
			sameDocs(t, "lf-cgroup "+op+" (vs create)", created, explained, true)
			account(t, "lf-cgroup "+op, stderr, "read: group "+name)
		}
		_, _, stderr = both(t, "lf-cgroup freeze %s "+cg)
		account(t, "lf-cgroup freeze", stderr, "in "+g.FreezerDir+" and waited")
		plain, explained, stderr := both(t, "lf-cgroup stats %s "+cg)
		sameDocs(t, "lf-cgroup stats", plain, explained, false)
		account(t, "lf-cgroup stats", stderr, "nothing changed")
		e.must("lf-cgroup thaw " + cg)
		out, stderr, code := e.sh("lf-cgroup remove --explain " + cg)
		if code != 0 {
			t.Fatalf("lf-cgroup remove --explain: exit %d: %s", code, stderr)
		}
		docs(t, "lf-cgroup remove", out)
		account(t, "lf-cgroup remove", stderr, "removed the group's directory")
	})
}
