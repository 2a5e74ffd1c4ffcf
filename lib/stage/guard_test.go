package stage

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lazyfork/lazyfork/lib/cgroup/owned"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/store"
)

func roots(t *testing.T) {
	t.Helper()
	paths.Set(t.TempDir(), t.TempDir()) // as a main would
	t.Cleanup(func() { paths.Set("", "") })
	old := owned.Parent()
	owned.SetParent("") // the default subtree only, whatever the run's operator parent
	t.Cleanup(func() { owned.SetParent(old) })
}

func goodSnapshot() *Snapshot {
	id, fam := "s0123456789ab", "sba9876543210"
	dir := filepath.Join(paths.Snapshots(), id)
	return &Snapshot{Kind: KindSnapshot, Version: Version, ID: id, State: SnapDumped, Dir: dir,
		CheckpointDir: filepath.Join(dir, "images"), Family: fam, FamilyDir: filepath.Join(paths.Families(), fam),
		Layer: filepath.Join(paths.Layers(), id), Lower: []string{filepath.Join(paths.Layers(), id), filepath.Join(paths.Images(), "layers", "abc")},
		Source: Source{ID: "0123456789ab"}}
}

func TestCheckSnapshot(t *testing.T) {
	roots(t)
	if err := CheckSnapshot(goodSnapshot()); err != nil {
		t.Fatalf("a real snapshot's shape refused: %v", err)
	}
	// A symlink planted in the store that leads out.
	if err := os.MkdirAll(paths.Layers(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(paths.Layers(), "evil")); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(s *Snapshot){
		"id with slash":        func(s *Snapshot) { s.ID = "../../etc" },
		"dir /":                func(s *Snapshot) { s.Dir = "/" },
		"dir /etc":             func(s *Snapshot) { s.Dir = "/etc" },
		"dir escape":           func(s *Snapshot) { s.Dir = filepath.Join(paths.Snapshots(), "..", "..", "etc") },
		"images_dir":           func(s *Snapshot) { s.CheckpointDir = "/etc" },
		"family_dir /":         func(s *Snapshot) { s.FamilyDir = "/" },
		"family_dir elsewhere": func(s *Snapshot) { s.FamilyDir = filepath.Join(paths.Run(), "x") },
		"family ../":           func(s *Snapshot) { s.Family = "../../etc"; s.FamilyDir = filepath.Join(paths.Families(), s.Family) },
		"layer /etc":           func(s *Snapshot) { s.Layer = "/etc" },
		"lower /":              func(s *Snapshot) { s.Lower = []string{"/"} },
		"lower escape":         func(s *Snapshot) { s.Lower = []string{paths.Layers() + "/../../../etc"} },
		"lower symlink out":    func(s *Snapshot) { s.Lower = []string{filepath.Join(paths.Layers(), "evil")} },
		"lower overlay opts":   func(s *Snapshot) { s.Lower = []string{paths.Layers() + "/a,upperdir=/etc"} },
		"hook relative":        func(s *Snapshot) { s.Hook = "../x.sock" },
		"source id":            func(s *Snapshot) { s.Source.ID = "../x" },
	}
	for name, mutate := range cases {
		s := goodSnapshot()
		mutate(s)
		err := CheckSnapshot(s)
		if !errors.Is(err, ErrForged) {
			t.Errorf("%s: %v, want ErrForged", name, err)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error not one line: %q", name, err)
		}
	}
}

func TestCheckRecord(t *testing.T) {
	roots(t)
	dir := filepath.Join(paths.Containers(), "0123456789ab")
	good := func() *store.Container {
		return &store.Container{ID: "0123456789ab", Upper: dir + "/upper", Work: dir + "/work", RootFS: dir + "/rootfs",
			MemDir: filepath.Join(paths.Run(), "mem", "0123456789ab"), Lower: []string{filepath.Join(paths.Images(), "layers", "a")},
			Cgroup: map[string]string{"unified": "/x/lazyfork/0123456789ab"}, Family: "s0123456789ab"}
	}
	if err := CheckRecord(good()); err != nil {
		t.Fatalf("a real record's shape refused: %v", err)
	}
	cases := map[string]func(c *store.Container){
		"upper /etc":       func(c *store.Container) { c.Upper = "/etc" },
		"rootfs /":         func(c *store.Container) { c.RootFS = "/" },
		"work escape":      func(c *store.Container) { c.Work = dir + "/../../../../etc" },
		"lower /":          func(c *store.Container) { c.Lower = []string{"/"} },
		"cgroup system":    func(c *store.Container) { c.Cgroup = map[string]string{"unified": "/system.slice"} },
		"cgroup escape":    func(c *store.Container) { c.Cgroup = map[string]string{"unified": "/x/lazyfork/../../.."} },
		"snapshot ref":     func(c *store.Container) { c.Snapshot = "/etc" },
		"family":           func(c *store.Container) { c.Family = "../x" },
		"bad id":           func(c *store.Container) { c.ID = "../x" },
		"mem_dir /dev/shm": func(c *store.Container) { c.MemDir = "/dev/shm" },
	}
	for name, mutate := range cases {
		c := good()
		mutate(c)
		if err := CheckRecord(c); !errors.Is(err, ErrForged) {
			t.Errorf("%s: %v, want ErrForged", name, err)
		}
	}
}
