package main

// Hostile stage documents: every stage is fed JSON (or a record) naming paths outside the
// state roots, `..` escapes, symlinks planted inside a root that lead out, and cgroups
// outside the project's subtree. Each must fail with one line on stderr and a non-zero
// exit, and nothing may change: not the decoy files and processes outside, not the state
// roots, not the mounts.

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/container"
)

// world is what a hostile document could damage, as text to compare.
type world struct {
	e       *env
	dirs    []string // walked: path, type, mode, size
	decoyCg []string // cgroup dirs of the decoy group
	pid     int      // the decoy process (in the decoy group)
}

func (w *world) state(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, d := range w.dirs {
		_ = filepath.WalkDir(d, func(p string, de fs.DirEntry, err error) error {
			if err != nil {
				fmt.Fprintf(&b, "%s error %v\n", p, err)
				return nil
			}
			fi, err := os.Lstat(p)
			if err != nil {
				return nil
			}
			size := fi.Size()
			if fi.IsDir() {
				size = 0
			}
			fmt.Fprintf(&b, "%s %v %d %d\n", p, fi.Mode(), size, fi.ModTime().UnixNano())
			return nil
		})
	}
	// Mounts at or under what the test owns, and on / and /etc (other tests on the machine
	// mount elsewhere meanwhile).
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		f := strings.Fields(l)
		if len(f) <= 4 {
			continue
		}
		mine := f[4] == "/" || f[4] == "/etc" || strings.HasPrefix(f[4], "/etc/")
		for _, d := range w.dirs {
			mine = mine || f[4] == d || strings.HasPrefix(f[4], d+"/")
		}
		if mine {
			fmt.Fprintf(&b, "mount %s %s\n", f[4], f[len(f)-3])
		}
	}
	for _, d := range w.decoyCg {
		procs, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		fmt.Fprintf(&b, "cgroup %s %q %v\n", d, procs, err)
		if st, err := os.ReadFile(filepath.Join(d, "freezer.state")); err == nil {
			fmt.Fprintf(&b, "freezer %s %s\n", d, st)
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", w.pid))
	if f := strings.Fields(string(stat)); err == nil && len(f) > 2 {
		fmt.Fprintf(&b, "decoy process %d state %s\n", w.pid, f[2])
	} else {
		fmt.Fprintf(&b, "decoy process %d gone: %v\n", w.pid, err)
	}
	return b.String()
}

// refuse runs one hostile command: it must fail, say so in one line, and change nothing.
func (w *world) refuse(t *testing.T, what, cmd, wantInErr string) {
	t.Helper()
	before := w.state(t)
	out, errOut, code := w.e.sh(cmd)
	after := w.state(t)
	errLine := strings.TrimRight(errOut, "\n")
	switch {
	case code == 0:
		t.Errorf("%s: accepted (exit 0), stdout %q", what, out)
	case errLine == "" || strings.Contains(errLine, "\n"):
		t.Errorf("%s: error is not one line: %q", what, errOut)
	case wantInErr != "" && !strings.Contains(errLine, wantInErr):
		t.Errorf("%s: error %q does not say %q", what, errLine, wantInErr)
	case strings.TrimSpace(out) != "":
		t.Errorf("%s: printed %q on stdout", what, out)
	}
	if before != after {
		t.Errorf("%s: something changed:\n%s", what, diffLines(before, after))
	}
	t.Logf("%s: %s", what, errLine)
}

func diffLines(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out []string
	for _, l := range al {
		if !slices.Contains(bl, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range bl {
		if !slices.Contains(al, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

func (e *env) root() string {
	for _, v := range e.vars {
		if r, ok := strings.CutPrefix(v, "LAZYFORK_ROOT="); ok {
			return r
		}
	}
	e.t.Fatal("no LAZYFORK_ROOT")
	return ""
}

// docFile writes v as JSON to a file outside the state roots and returns its path.
func docFile(t *testing.T, dir, name string, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, strings.Map(func(r rune) rune {
		if r == '/' || r == ' ' || r == '.' {
			return '_'
		}
		return r
	}, name)+".json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func withFields(t *testing.T, doc string, set map[string]any) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatalf("parse %q: %v", doc, err)
	}
	for k, v := range set {
		m[k] = v
	}
	return m
}

// decoyCgroup makes a group outside the project's subtree, in every hierarchy LazyFork
// uses here, with a sleeping process in it; the test removes both at the end.
func decoyCgroup(t *testing.T, e *env) (paths map[string]string, dirs []string, pid int) {
	t.Helper()
	var host struct {
		Backend  string            `json:"backend"`
		V1Mounts map[string]string `json:"v1_mounts"`
		V2Mount  string            `json:"v2_mount"`
	}
	if err := json.Unmarshal([]byte(e.must("lf-cgroup host")), &host); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("lf-decoy-%d", os.Getpid())
	mounts := map[string]string{}
	if host.Backend == "v2" {
		mounts["unified"] = host.V2Mount
	} else {
		for _, k := range []string{"memory", "pids", "freezer"} {
			mounts[k] = host.V1Mounts[k]
		}
	}
	sleep := exec.Command("sleep", "1000")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sleep.Process.Kill()
		_ = sleep.Wait()
		for _, d := range dirs {
			_ = os.WriteFile(filepath.Join(d, "freezer.state"), []byte("THAWED"), 0)
			for i := 0; i < 50 && syscall.Rmdir(d) == syscall.EBUSY; i++ {
				time.Sleep(20 * time.Millisecond)
			}
		}
	})
	paths = map[string]string{}
	for k, m := range mounts {
		d := filepath.Join(m, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d)
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(sleep.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
		paths[k] = "/" + name
	}
	return paths, dirs, sleep.Process.Pid
}

func TestHostileStageDocuments(t *testing.T) {
	e := newEnv(t)
	root, run := e.root(), e.run
	docs := t.TempDir()
	// Outside the roots: what a forged document aims at.
	decoy := t.TempDir()
	for _, f := range []string{"etc/passwd", "victim/keep", "snap/snapshot.json", "layer/bin/sh"} {
		if err := os.MkdirAll(filepath.Join(decoy, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(decoy, f), []byte("decoy\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cgPaths, cgDirs, decoyPid := decoyCgroup(t, e)

	e.must("lazyfork create lazyfork/debian:bookworm --name c1 -- sleep 1000")
	dumped := e.must("lf-dump c1")
	m := withFields(t, dumped, nil)
	snapID, snapDir, famDir := m["id"].(string), m["dir"].(string), m["family_dir"].(string)
	memfiled := e.must("lf-memfile " + snapID)
	// Symlinks planted inside both roots, leading out; some under names of the right shape.
	const linkedID = "s0000000000ee"
	for l, target := range map[string]string{
		filepath.Join(root, "layers", "evil"):     decoy,
		filepath.Join(run, "families", linkedID):  filepath.Join(decoy, "victim"),
		filepath.Join(run, "snapshots", linkedID): filepath.Join(decoy, "snap"),
		filepath.Join(root, "containers", "evil"): decoy,
	} {
		if err := os.MkdirAll(filepath.Dir(l), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, l); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(l) }) // before the env's cleanup (its GC refuses them)
	}
	// A snapshot directory outside the roots holding a forged snapshot.json.
	forgedSnap := withFields(t, memfiled, map[string]any{"dir": filepath.Join(decoy, "snap"), "images_dir": filepath.Join(decoy, "snap", "images")})
	b, _ := json.Marshal(forgedSnap)
	if err := os.WriteFile(filepath.Join(decoy, "snap", "snapshot.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}

	w := &world{e: e, dirs: []string{decoy, root, run}, decoyCg: cgDirs, pid: decoyPid}
	famEscape := filepath.Join(run, "families", "..", "..", filepath.Base(decoy))
	hostileSnapshots := map[string]map[string]any{
		"dir /":                  {"dir": "/", "images_dir": "/images"},
		"dir /etc":               {"dir": "/etc", "images_dir": "/etc/images"},
		"dir ../ escape":         {"dir": snapDir + "/../../../" + filepath.Base(decoy) + "/snap"},
		"images_dir decoy":       {"images_dir": filepath.Join(decoy, "snap")},
		"family_dir decoy":       {"family_dir": filepath.Join(decoy, "victim")},
		"family_dir ../ escape":  {"family_dir": famEscape},
		"family ../":             {"family": "../../victim", "family_dir": filepath.Join(run, "families", "../../victim")},
		"family_dir symlink out": {"family": linkedID, "family_dir": filepath.Join(run, "families", linkedID)},
		"dir symlink out": {"id": linkedID, "dir": filepath.Join(run, "snapshots", linkedID),
			"images_dir": filepath.Join(run, "snapshots", linkedID, "images"), "layer": filepath.Join(root, "layers", linkedID)},
		"lower /":           {"lower": []string{"/"}},
		"lower /etc":        {"lower": []string{"/etc"}},
		"lower decoy":       {"lower": []string{filepath.Join(decoy, "layer")}},
		"lower symlink out": {"lower": []string{filepath.Join(root, "layers", "evil")}},
		"layer decoy":       {"layer": filepath.Join(decoy, "layer")},
		"id ../":            {"id": "../../etc"},
	}
	for name, set := range hostileSnapshots {
		f := docFile(t, docs, "memfile-"+strings.ReplaceAll(name, " ", "-"), withFields(t, dumped, set))
		w.refuse(t, "lf-memfile "+name, "lf-memfile < "+f, "")
		f = docFile(t, docs, "restore-"+strings.ReplaceAll(name, " ", "-"), withFields(t, memfiled, set))
		w.refuse(t, "lf-restore "+name, "lf-restore -n 2 < "+f, "")
	}
	w.refuse(t, "lf-restore of a forged snapshot dir", "lf-restore -n 1 "+filepath.Join(decoy, "snap"), "refused stage input")
	w.refuse(t, "lf-memfile of a forged snapshot dir", "lf-memfile "+filepath.Join(decoy, "snap"), "refused stage input")

	// lf-overlay: teardown removes what its document names; prepare creates and mounts.
	cdir := filepath.Join(root, "containers")
	layer := func(upper, work, target string) map[string]any {
		return map[string]any{"lower": []string{filepath.Join(decoy, "layer")}, "upper": upper, "work": work, "target": target}
	}
	for name, l := range map[string]map[string]any{
		"decoy":              layer(filepath.Join(decoy, "victim"), filepath.Join(decoy, "etc"), filepath.Join(decoy, "layer")),
		"/":                  layer("/", "/", "/"),
		"/etc":               layer("/etc", "/etc", "/etc"),
		"../ escape":         layer(cdir+"/../../"+filepath.Base(decoy)+"/victim", cdir+"/x/work", cdir+"/x/rootfs"),
		"symlink out":        layer(filepath.Join(cdir, "evil", "victim"), filepath.Join(cdir, "evil", "etc"), filepath.Join(cdir, "evil")),
		"the containers dir": layer(cdir, cdir+"/x/work", cdir+"/x/rootfs"),
		"the state root":     layer(root, run, root),
		"a frozen layer":     layer(filepath.Join(root, "layers", snapID), cdir+"/x/work", cdir+"/x/rootfs"),
		"the family":         layer(famDir, cdir+"/x/work", cdir+"/x/rootfs"),
	} {
		f := docFile(t, docs, "overlay-"+strings.ReplaceAll(name, "/", "_"), l)
		w.refuse(t, "lf-overlay teardown "+name, "lf-overlay teardown --in "+f, "")
		w.refuse(t, "lf-overlay prepare "+name, fmt.Sprintf("lf-overlay prepare --lower %s --upper %s --work %s --target %s",
			l["lower"].([]string)[0], l["upper"], l["work"], l["target"]), "")
	}
	w.refuse(t, "lf-overlay prepare lower /", fmt.Sprintf("lf-overlay prepare --lower / --upper %s/x/u --work %s/x/w --target %s/x/t", cdir, cdir, cdir), "")

	// lf-cgroup: groups outside the project's subtree.
	foreign := map[string]map[string]string{"decoy": cgPaths}
	up, sys, inside := map[string]string{}, map[string]string{}, map[string]string{}
	for k := range cgPaths {
		up[k] = "../../" + filepath.Base(cgPaths[k])
		sys[k] = "/system.slice"
		inside[k] = "/lazyfork/../.." + cgPaths[k]
	}
	foreign["../../"] = up
	foreign["/lazyfork/../.."] = inside
	for name, p := range foreign {
		f := docFile(t, docs, "cgroup-"+strings.ReplaceAll(name, "/", "_"), map[string]any{"name": filepath.Base(cgPaths[firstKey(cgPaths)]), "paths": p})
		for _, op := range []string{"stats", "procs", "freeze", "thaw", "kill", "remove"} {
			w.refuse(t, "lf-cgroup "+op+" "+name, "lf-cgroup "+op+" --in "+f, "not a LazyFork cgroup")
		}
	}
	// /system.slice only with the operations that read: the others are proven on the decoy.
	f := docFile(t, docs, "cgroup-system", map[string]any{"name": "system.slice", "paths": sys})
	for _, op := range []string{"stats", "procs"} {
		w.refuse(t, "lf-cgroup "+op+" /system.slice", "lf-cgroup "+op+" < "+f, "not a LazyFork cgroup")
	}
	name := filepath.Base(cgPaths[firstKey(cgPaths)])
	w.refuse(t, "lf-cgroup kill --name decoy --parent /", "lf-cgroup kill --name "+name+" --parent /", "")
	w.refuse(t, "lf-cgroup create --parent /", "lf-cgroup create lfhostile --parent /", "")

	// lf-dump and lf-tree: a forged record (written straight into the tree, or put).
	rec := withFields(t, e.must("lf-tree get c1"), nil)
	forgedID := "0000000000ff"
	forgedRec := func(set map[string]any) map[string]any {
		r := map[string]any{}
		for k, v := range rec {
			r[k] = v
		}
		r["id"], r["name"] = forgedID, "forged"
		for k, v := range set {
			r[k] = v
		}
		return r
	}
	cases := map[string]map[string]any{}
	for name, set := range map[string]map[string]any{
		"cgroup decoy":      {"cgroup": cgPaths, "pid": decoyPid},
		"cgroup ../../":     {"cgroup": up},
		"upper decoy":       {"upper": filepath.Join(decoy, "victim")},
		"upper symlink out": {"upper": filepath.Join(cdir, "evil", "victim")},
		"lower /":           {"lower": []string{"/"}},
		"rootfs /":          {"rootfs": "/"},
	} {
		cases[name] = set
	}
	// Everything else c1's own, but the pid the host's init: CRIU would dump it.
	initStart, err := container.StartTime(1)
	if err != nil {
		t.Fatal(err)
	}
	cases["pid of the host's init"] = map[string]any{"pid": 1, "start_time": initStart}
	for name, set := range cases {
		r := forgedRec(set)
		f := docFile(t, docs, "record-"+strings.ReplaceAll(name, " ", "-"), r)
		if name != "pid of the host's init" { // a record's pid is not a path: put takes it
			w.refuse(t, "lf-tree put "+name, "lf-tree put < "+f, "refused stage input")
		}
		// The same record written behind lf-tree's back: lf-dump must refuse it.
		recDir := filepath.Join(cdir, forgedID)
		if err := os.MkdirAll(recDir, 0o700); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(r)
		if err := os.WriteFile(filepath.Join(recDir, "container.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
		w.refuse(t, "lf-dump of a record with "+name, "lf-dump "+forgedID, "refused stage input")
		if err := os.RemoveAll(recDir); err != nil {
			t.Fatal(err)
		}
	}
	w.refuse(t, "lf-tree --dir outside the roots", "echo '{}' | lf-tree --dir "+filepath.Join(decoy, "victim")+" put", "")

	// The real documents still work: the guards refuse only what is foreign.
	out := e.must("lf-restore -n 1 " + snapID)
	if !strings.Contains(out, `"kind":"lazyfork.fork"`) {
		t.Errorf("restore of the real snapshot: %s", out)
	}
}

func firstKey(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys[0]
}
