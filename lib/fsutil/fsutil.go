// Package fsutil holds the file-system helpers every stage needs: removal that never
// crosses a mount point (a leftover CRIU cgroup yard or overlay must not be recursed into)
// and atomic JSON writes.
package fsutil

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// ErrMountPoint is returned by RemoveAll when it meets a mount point inside the tree.
var ErrMountPoint = errors.New("refusing to cross a mount point")

// RemoveAll removes path and everything below it, like os.RemoveAll, but refuses to
// descend into anything mounted inside it, so a stale mount can never take host files
// with it. A path that does not exist is not an error.
func RemoveAll(path string) error {
	var root unix.Stat_t
	if err := unix.Lstat(path, &root); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("remove %s: %w", path, err)
	}
	if err := checkNoMounts(path, root.Dev); err != nil {
		return err
	}
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

func checkNoMounts(path string, dev uint64) error {
	return filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return nil
		}
		if st.Dev != dev || IsMountPoint(p) {
			if p == path && st.Dev == dev {
				return nil
			}
			return fmt.Errorf("remove %s: %s is mounted: %w", path, p, ErrMountPoint)
		}
		return nil
	})
}

// IsMountPoint reports whether path is the root of a mount (same-device bind mounts included).
func IsMountPoint(path string) bool {
	// statx knows without reading the whole mount table (Linux 5.8+).
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, 0, &stx); err == nil &&
		stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
	}
	mounted, err := mountinfo.Mounted(path)
	return err == nil && mounted
}

// WriteJSON writes v as indented JSON to path atomically (temp file, fsync, rename).
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	b = append(b, '\n')
	// The temp file goes beside path: renameio would otherwise probe $TMPDIR each time.
	if err := renameio.WriteFile(path, b, 0o644, renameio.WithTempDir(filepath.Dir(path))); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// ReplaceJSON writes v as indented JSON over the existing file at path atomically (temp
// file, rename: readers see the old or the new content) without waiting for the disk. Only
// for a file whose earlier version was written with WriteJSON: until the next commit of the
// file system a crash of the machine may bring back that version, never a torn or empty
// file (ext4 allocates the blocks of a file renamed over another at the rename, as
// auto_da_alloc does by default). An fsync costs a journal commit and a cache flush of the
// disk: ~5 ms of waiting each on these hosts.
func ReplaceJSON(path string, v any) (retErr error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	b = append(b, '\n')
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if retErr != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// ReadJSON decodes the JSON file at path into v.
func ReadJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	return nil
}

// MountsUnder lists mount points at or below dir, deepest first (unmount order).
func MountsUnder(dir string) []string {
	if dir == "" {
		return nil
	}
	abs, _ := filepath.Abs(dir)
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(abs))
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(ms))
	for i := len(ms) - 1; i >= 0; i-- { // mounted later, unmounted first
		out = append(out, ms[i].Mountpoint)
	}
	return out
}
