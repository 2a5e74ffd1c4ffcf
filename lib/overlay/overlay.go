// Package overlay prepares and tears down a container's root file system: an overlayfs
// whose lower layers are the image layers (plus, for forks, the frozen uppers of their
// ancestors) and whose upper is the container's own.
package overlay

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/fsutil"
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

// Prepare creates upper, work and target and mounts the overlay. On failure nothing it
// created remains.
func Prepare(l Layer) (retErr error) {
	if len(l.Lower) == 0 {
		return errors.New("prepare overlay: no lower layers")
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
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(l.Lower, ":"), l.Upper, l.Work)
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

// Unmount detaches everything mounted at or below the target. Missing mounts are fine.
func Unmount(target string) error {
	if target == "" {
		return errors.New("unmount: empty target")
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

// Teardown unmounts the overlay and removes upper, work and target.
func Teardown(l Layer) error {
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
