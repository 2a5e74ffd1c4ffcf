package criu

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/lazyfork/lazyfork/lib/procfs"
)

// irmapHints finds where the inodes watched by the tree's inotify and fanotify marks live,
// as paths inside the tree's root, for CRIU's --irmap-scan-path.
//
// Why: CRIU stores a watch as a file handle, and handles of overlayfs inodes cannot be
// opened again, so CRIU must find the watched inode's path instead ("irmap"). It only
// searches a few fixed directories (/etc, /var/spool, ...), so a watch on /tmp or an app
// directory failed with "fsnotify: Can't dump that handle". Only trees that hold a mark
// pay for the walk, and the walk is bounded.
func irmapHints(pids []int) []string {
	want := map[uint64]bool{}
	root := ""
	for _, pid := range pids {
		for _, ino := range watchedInodes(pid) {
			want[ino] = true
			if root == "" {
				root = "/proc/" + strconv.Itoa(pid) + "/root/" // the slash: walk the root, not the link
			}
		}
	}
	if len(want) == 0 {
		return nil
	}
	var rootDev uint64
	if st, err := os.Stat(root); err == nil {
		rootDev = st.Sys().(*syscall.Stat_t).Dev
	}
	const maxEntries = 500000
	seen := 0
	hints := map[string]bool{}
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if seen++; seen > maxEntries || len(hints) >= len(want)*4 {
			return filepath.SkipAll
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		st := info.Sys().(*syscall.Stat_t)
		if d.IsDir() && st.Dev != rootDev {
			return filepath.SkipDir // /proc, /dev/pts, the memory files: not the tree's files
		}
		if !want[st.Ino] {
			return nil
		}
		rel := "/" + strings.TrimPrefix(p, root)
		if d.IsDir() {
			hints[rel] = true // irmap looks at a scan path itself and its entries
		} else {
			hints[filepath.Dir(rel)] = true
		}
		return nil
	})
	out := make([]string, 0, len(hints))
	for h := range hints {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

// watchedInodes lists the inodes of pid's inotify watches and fanotify inode marks.
func watchedInodes(pid int) []uint64 {
	dir := "/proc/" + strconv.Itoa(pid) + "/fdinfo"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []uint64
	for _, e := range ents {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, "inotify ") && !strings.HasPrefix(line, "fanotify ") {
				continue
			}
			for _, field := range strings.Fields(line) {
				if v, ok := strings.CutPrefix(field, "ino:"); ok {
					if ino, err := strconv.ParseUint(v, 16, 64); err == nil {
						out = append(out, ino)
					}
				}
			}
		}
		f.Close()
	}
	return out
}

// treePids lists the tasks' process ids of the tree rooted at pid: the freezer group's
// members when there is one, else pid and its descendants.
func treePids(pid int, freezerDir string) []int {
	if freezerDir != "" {
		if b, err := os.ReadFile(filepath.Join(freezerDir, "cgroup.procs")); err == nil {
			var out []int
			for _, f := range strings.Fields(string(b)) {
				if p, err := strconv.Atoi(f); err == nil {
					out = append(out, p)
				}
			}
			if len(out) > 0 {
				return out
			}
		}
	}
	return procfs.Descendants(pid, 100000)
}
