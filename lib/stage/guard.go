package stage

import (
	"errors"
	"fmt"
	"net/netip"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/lazyfork/lazyfork/lib/cgroup/owned"
	"github.com/lazyfork/lazyfork/lib/exitcode"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/store"
)

// ErrForged marks stage input that names something LazyFork does not manage: a path
// outside the state roots, a cgroup outside the project's subtree, a malformed id. Every
// stage document is possibly forged (a pipe, a file, an edited snapshot.json), so the
// library functions check what they are given before touching anything.
var ErrForged = errors.New("refused stage input")

// ErrNoSnapshot: a stage was pointed at something that holds no snapshot.json.
var ErrNoSnapshot = exitcode.NewNotFound("not a LazyFork snapshot")

var (
	snapIDRe      = regexp.MustCompile(`^s[0-9a-f]{12}$`)
	containerIDRe = regexp.MustCompile(`^[0-9a-f]{12}$`)
	// The shape lib/network creates and deletes (kept here without its netlink imports).
	bridgeRe = regexp.MustCompile(`^lfbr[a-z0-9]{0,11}$`)
)

// checkNet refuses a bridge or address that lib/network would never have given: a
// forged record must not aim a bridge deletion at a foreign interface.
func checkNet(bridge, addr string) error {
	if bridge != "" && !bridgeRe.MatchString(bridge) {
		return fmt.Errorf("bad bridge %q", bridge)
	}
	if addr != "" {
		if p, err := netip.ParsePrefix(addr); err != nil || !p.Addr().Is4() {
			return fmt.Errorf("bad address %q", addr)
		}
	}
	return nil
}

func validContainerID(id string) bool { return containerIDRe.MatchString(id) }

// ValidSnapshotID reports whether id has the form of a snapshot (or family) id.
func ValidSnapshotID(id string) bool { return snapIDRe.MatchString(id) }

const fixHint = "pass a document a LazyFork stage printed, unedited"

func forged(what string, err error) error {
	return fmt.Errorf("%w: %s: %v (%s)", ErrForged, what, err, fixHint)
}

// CheckSnapshot refuses a snapshot document whose ids or paths are not the ones LazyFork
// gives a snapshot: its directory and image must be $LAZYFORK_RUN/snapshots/<id>[/images],
// its memory files $LAZYFORK_RUN/families/<family>, its frozen layer
// $LAZYFORK_ROOT/layers/<id>, and every lower layer inside the state roots (no symlink
// leading out). It reads the file system (symlinks) but changes nothing.
func CheckSnapshot(s *Snapshot) error {
	if !snapIDRe.MatchString(s.ID) {
		return forged("snapshot", fmt.Errorf("bad id %q (want s + 12 hex digits)", s.ID))
	}
	if !snapIDRe.MatchString(s.Family) {
		return forged("snapshot "+s.ID, fmt.Errorf("bad family %q (want s + 12 hex digits)", s.Family))
	}
	want := []struct{ field, got, want string }{
		{"dir", s.Dir, filepath.Join(paths.Snapshots(), s.ID)},
		{"images_dir", s.CheckpointDir, filepath.Join(paths.Snapshots(), s.ID, "images")},
		{"family_dir", s.FamilyDir, filepath.Join(paths.Families(), s.Family)},
	}
	if s.Layer != "" {
		want = append(want, struct{ field, got, want string }{"layer", s.Layer, filepath.Join(paths.Layers(), s.ID)})
	}
	for _, w := range want {
		if w.got != w.want {
			return forged("snapshot "+s.ID, fmt.Errorf("%s is %q, want %q", w.field, w.got, w.want))
		}
		if _, err := paths.InState(w.got); err != nil {
			return forged("snapshot "+s.ID+" "+w.field, err)
		}
	}
	if err := checkLower(s.Lower); err != nil {
		return forged("snapshot "+s.ID, err)
	}
	if err := ValidateHookPath(s.Hook); err != nil {
		return forged("snapshot "+s.ID, err)
	}
	if s.Source.ID != "" && !validContainerID(s.Source.ID) {
		return forged("snapshot "+s.ID, fmt.Errorf("bad source id %q", s.Source.ID))
	}
	if err := checkNet(s.Bridge, s.Addr); err != nil {
		return forged("snapshot "+s.ID, err)
	}
	return nil
}

func checkLower(lower []string) error {
	for _, l := range lower {
		if strings.ContainsAny(l, ",:") {
			return fmt.Errorf("lower layer %q contains ',' or ':'", l)
		}
		if _, err := paths.InState(l); err != nil {
			return fmt.Errorf("lower layer: %w", err)
		}
	}
	return nil
}

// CheckRecord refuses a container record (container.json, `lf-tree put`) whose paths
// or cgroup are not LazyFork's: its upper, work dir, root, memory dir and lower layers
// must lie inside the state roots, its cgroup inside the project's subtree.
func CheckRecord(c *store.Container) error {
	what := "container " + c.ID
	if !validContainerID(c.ID) {
		return forged("container", fmt.Errorf("bad id %q (want 12 hex digits)", c.ID))
	}
	for _, f := range []struct{ field, p string }{{"upper", c.Upper}, {"work", c.Work}, {"rootfs", c.RootFS}, {"mem_dir", c.MemDir}} {
		if f.p == "" {
			continue
		}
		if _, err := paths.InState(f.p); err != nil {
			return forged(what+" "+f.field, err)
		}
	}
	if err := checkLower(c.Lower); err != nil {
		return forged(what, err)
	}
	if len(c.Cgroup) > 0 {
		if err := owned.Check(c.Cgroup); err != nil {
			return forged(what, err)
		}
	}
	if c.Family != "" && !snapIDRe.MatchString(c.Family) {
		return forged(what, fmt.Errorf("bad family %q", c.Family))
	}
	if c.Snapshot != "" && !snapIDRe.MatchString(c.Snapshot) {
		return forged(what, fmt.Errorf("bad snapshot %q", c.Snapshot))
	}
	if c.Parent != "" && !validContainerID(c.Parent) {
		return forged(what, fmt.Errorf("bad parent %q", c.Parent))
	}
	if err := ValidateHookPath(c.Hook); err != nil {
		return forged(what, err)
	}
	if err := checkNet(c.Bridge, c.Addr); err != nil {
		return forged(what, err)
	}
	return nil
}

// ValidateHookPath checks a runtime hook path (`lazyfork create --hook`, a record's or a
// snapshot's hook): the absolute, clean path of a unix socket inside the container.
func ValidateHookPath(p string) error {
	if p == "" {
		return nil
	}
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return fmt.Errorf("invalid hook path %q: give the absolute, clean path of a unix socket inside the container (e.g. /run/agent.sock)", p)
	}
	if len(path.Base(p)) > 100 {
		return fmt.Errorf("invalid hook path %q: the socket's file name is too long for a unix socket", p)
	}
	return nil
}
