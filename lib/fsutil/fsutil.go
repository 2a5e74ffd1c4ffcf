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
	abs, err := filepath.Abs(path)
	if err != nil {
		return false
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range splitLines(string(mounts)) {
		f := fields(line)
		if len(f) > 4 && unescapeMount(f[4]) == abs {
			return true
		}
	}
	return false
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

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

func fields(s string) []string {
	var out []string
	cur := -1
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			if cur >= 0 {
				out = append(out, s[cur:i])
				cur = -1
			}
		} else if cur < 0 {
			cur = i
		}
	}
	if cur >= 0 {
		out = append(out, s[cur:])
	}
	return out
}

// unescapeMount undoes the octal escapes (\040 etc.) of /proc/self/mountinfo.
func unescapeMount(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			v := (s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0')
			out = append(out, v)
			i += 3
			continue
		}
		out = append(out, s[i])
	}
	return string(out)
}

// MountsUnder lists mount points at or below dir, deepest first (unmount order).
func MountsUnder(dir string) []string {
	if dir == "" {
		return nil
	}
	abs, _ := filepath.Abs(dir)
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range splitLines(string(b)) {
		f := fields(line)
		if len(f) <= 4 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == abs || (len(mp) > len(abs) && mp[:len(abs)] == abs && mp[len(abs)] == '/') {
			out = append(out, mp)
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}
