// Package overlay prepares and tears down a container's root file system: an overlayfs
// whose lower layers are the image layers (plus, for forks, the frozen uppers of their
// ancestors) and whose upper is the container's own.
package overlay

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/paths"
)

// Layer is one prepared overlay mount. Lower is top-most first, as overlayfs wants it.
type Layer struct {
	Lower  []string `json:"lower"`
	Upper  string   `json:"upper"`
	Work   string   `json:"work"`
	Target string   `json:"target"`
}

// Dir is the conventional layout inside a container directory.
func Dir(containerDir string, lower []string) Layer {
	return Layer{
		Lower:  lower,
		Upper:  filepath.Join(containerDir, "upper"),
		Work:   filepath.Join(containerDir, "work"),
		Target: filepath.Join(containerDir, "rootfs"),
	}
}

// Check refuses a layer that names directories LazyFork does not own (a layer document
// is stage input, possibly forged): upper, work and target, which Prepare creates and
// Teardown removes, must lie strictly inside $LAZYFORK_ROOT or $LAZYFORK_RUN and outside
// the stores forks share (images, frozen layers, snapshots, memory-file families); lower
// layers, mounted read-only into a container, must lie inside the state roots. Symlinks
// that lead out are refused, not followed (paths.Within).
func Check(l Layer) error {
	shared := []string{paths.Images(), paths.Layers(), paths.Snapshots(), paths.Families()}
	for _, f := range []struct{ field, dir string }{{"upper", l.Upper}, {"work", l.Work}, {"target", l.Target}} {
		if f.dir == "" {
			return fmt.Errorf("layer has no %s", f.field)
		}
		clean, err := paths.Within(f.dir, paths.Root(), paths.Run())
		if err != nil {
			return fmt.Errorf("layer %s: %w (pass a layer `lf-overlay prepare` printed, with its directories under %s or %s)", f.field, err, paths.Root(), paths.Run())
		}
		for _, d := range append(shared, paths.Containers(), filepath.Join(paths.Run(), "work"), filepath.Join(paths.Run(), "mem")) {
			if clean == d || strings.HasPrefix(d, clean+"/") {
				return fmt.Errorf("layer %s %s is one of LazyFork's own stores (%s): %w", f.field, clean, d, paths.ErrOutside)
			}
		}
		for _, d := range shared {
			if strings.HasPrefix(clean, d+"/") {
				return fmt.Errorf("layer %s %s is inside %s, which forks share: %w", f.field, clean, d, paths.ErrOutside)
			}
		}
	}
	for _, d := range l.Lower {
		if _, err := paths.InState(d); err != nil {
			return fmt.Errorf("lower layer: %w (lower layers must be image or frozen layers under %s)", err, paths.Root())
		}
	}
	return nil
}

// Prepare creates upper, work and target and mounts the overlay. On failure nothing it
// created remains. A layer Check refuses is refused before anything is made.
func Prepare(l Layer) (retErr error) {
	if len(l.Lower) == 0 {
		return errors.New("prepare overlay: no lower layers")
	}
	if err := Check(l); err != nil {
		return fmt.Errorf("prepare overlay: %w", err)
	}
	for _, d := range l.Lower {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			return fmt.Errorf("prepare overlay: lower layer %s is missing", d)
		}
		if strings.ContainsAny(d, ",:") {
			return fmt.Errorf("prepare overlay: lower layer path %q contains ',' or ':'", d)
		}
	}
	var made []string
	defer func() {
		if retErr != nil {
			for i := len(made) - 1; i >= 0; i-- {
				_ = fsutil.RemoveAll(made[i])
			}
		}
	}()
	for _, d := range []string{l.Upper, l.Work, l.Target} {
		if _, err := os.Stat(d); err == nil {
			continue
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("prepare overlay: %w", err)
		}
		made = append(made, d)
	}
	opts := l.options()
	// A mount option string is limited to one page; many generations of frozen layers
	// could exceed it, so say so clearly rather than failing with EINVAL.
	if len(opts) >= 4096 {
		return fmt.Errorf("prepare overlay: %d lower layers make the mount options too long", len(l.Lower))
	}
	if err := unix.Mount("overlay", l.Target, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", l.Target, err)
	}
	return nil
}

// options is the overlay mount's option string.
func (l Layer) options() string {
	return fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(l.Lower, ":"), l.Upper, l.Work)
}

// ExplainPrepare tells what Prepare did to the layer (lf-overlay prepare --explain).
func (l Layer) ExplainPrepare(w io.Writer) {
	fmt.Fprintf(w, "read: %d lower layer(s), top-most first: %s (each checked to be inside the state roots)\n", len(l.Lower), strings.Join(l.Lower, ", "))
	fmt.Fprintf(w, "made upper %s, work %s and target %s where missing\n", l.Upper, l.Work, l.Target)
	fmt.Fprintf(w, "mounted overlay on %s with %s\n", l.Target, l.options())
	fmt.Fprintf(w, "  why: the lower layers stay read-only and shared; every write lands in the upper, which is this layer's own\n")
}

// ExplainTeardown tells what Teardown did (lf-overlay teardown --explain).
func (l Layer) ExplainTeardown(w io.Writer) {
	fmt.Fprintf(w, "read: layer with target %s (checked to be LazyFork's own before anything was touched)\n", l.Target)
	fmt.Fprintf(w, "unmounted everything at or below %s, then removed target, work %s and upper %s (the layer's writes are gone)\n", l.Target, l.Work, l.Upper)
	fmt.Fprintf(w, "  left alone: the lower layers %s, which other layers may share\n", strings.Join(l.Lower, ", "))
}

// Unmount detaches everything mounted at or below the target. Missing mounts are fine.
func Unmount(target string) error {
	if target == "" {
		return errors.New("unmount: empty target")
	}
	// Usually target is the mount: detaching it takes what is mounted below it along, so
	// the mount table, which grows with every container, need not be read (twice a
	// delete, it was a cost that grew with the number of containers).
	detached := false
	for i := 0; i < 8 && fsutil.IsMountPoint(target); i++ {
		if err := unix.Unmount(target, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				break
			}
			return fmt.Errorf("unmount %s: %w", target, err)
		}
		detached = true
	}
	if detached && !fsutil.IsMountPoint(target) {
		return nil
	}
	var errs []error
	for _, mp := range fsutil.MountsUnder(target) {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
		}
	}
	if left := fsutil.MountsUnder(target); len(left) > 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("unmount %s: still mounted: %v", target, left))
	}
	return errors.Join(errs...)
}

// Teardown unmounts the overlay and removes upper, work and target. A layer Check refuses
// is refused before anything is unmounted or removed.
func Teardown(l Layer) error {
	if err := Check(l); err != nil {
		return fmt.Errorf("tear down overlay: %w", err)
	}
	if err := Unmount(l.Target); err != nil {
		return err
	}
	var errs []error
	// The mount point stays busy for a moment after the container's last process died:
	// the kernel tears its mount namespace down asynchronously.
	for i := 0; i < 60; i++ {
		err := os.Remove(l.Target)
		if err == nil || errors.Is(err, os.ErrNotExist) || !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, d := range []string{l.Target, l.Work, l.Upper} {
		if d == "" {
			continue
		}
		if err := fsutil.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Supported reports whether the kernel offers overlayfs.
func Supported() error {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return err
	}
	if !strings.Contains(string(b), "\toverlay\n") {
		return errors.New("overlayfs is not available (try: modprobe overlay)")
	}
	return nil
}
