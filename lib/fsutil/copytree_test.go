package fsutil_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/testutil/priv"
)

// CopyTree copies what an overlay upper holds exactly as `cp -a --one-file-system`
// does: the two copies of a tree with every kind of entry describe alike, down to
// owners, modes, times, xattrs, hard links, holes and a mount point copied empty.
func TestCopyTreeMatchesCpA(t *testing.T) {
	priv.Root(t, "mknod, chown and trusted xattrs")
	base := t.TempDir() // on the disk file system, as the store
	src := filepath.Join(base, "upper")
	mk := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	mk(os.MkdirAll(filepath.Join(src, "etc/opaque/sub"), 0o755))
	mk(unix.Setxattr(filepath.Join(src, "etc/opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	mk(os.WriteFile(filepath.Join(src, "etc/hosts"), []byte("127.0.0.1 x\n"), 0o644))
	mk(unix.Setxattr(filepath.Join(src, "etc/hosts"), "user.note", []byte("kept"), 0))
	mk(unix.Mknod(filepath.Join(src, "etc/removed"), unix.S_IFCHR|0o000, 0)) // a whiteout
	mk(unix.Mknod(filepath.Join(src, "etc/fifo"), unix.S_IFIFO|0o640, 0))
	mk(os.Symlink("../etc/hosts", filepath.Join(src, "etc/link")))
	mk(os.Symlink("/nonexistent/abs", filepath.Join(src, "dangling")))
	mk(os.WriteFile(filepath.Join(src, "suid"), []byte("#!/bin/sh\n"), 0o755))
	mk(os.Chown(filepath.Join(src, "suid"), 1000, 1000))
	mk(os.Chmod(filepath.Join(src, "suid"), 0o4755))
	mk(os.Lchown(filepath.Join(src, "etc/link"), 1000, 1001))
	mk(os.Link(filepath.Join(src, "etc/hosts"), filepath.Join(src, "etc/opaque/sub/hosts-again")))
	sparse, err := os.Create(filepath.Join(src, "sparse"))
	mk(err)
	_, err = sparse.WriteAt([]byte("head"), 0)
	mk(err)
	_, err = sparse.WriteAt([]byte("tail"), 8<<20)
	mk(err)
	mk(sparse.Close())
	mk(os.MkdirAll(filepath.Join(src, "mnt/point"), 0o755))
	mk(unix.Mount("tmpfs", filepath.Join(src, "mnt/point"), "tmpfs", 0, "size=1m"))
	t.Cleanup(func() { _ = unix.Unmount(filepath.Join(src, "mnt/point"), unix.MNT_DETACH) })
	mk(os.WriteFile(filepath.Join(src, "mnt/point/not-copied"), []byte("x"), 0o644))
	old := time.Date(2020, 1, 2, 3, 4, 5, 6000, time.UTC)
	for _, p := range []string{"etc/hosts", "etc", "sparse", "etc/opaque/sub", ""} {
		mk(os.Chtimes(filepath.Join(src, p), old, old))
	}

	want, got := filepath.Join(base, "by-cp"), filepath.Join(base, "by-go")
	if out, err := exec.Command("cp", "-a", "--one-file-system", src, want).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	mk(fsutil.CopyTree(context.Background(), src, got))
	if w, g := describe(t, want), describe(t, got); w != g {
		t.Errorf("copies differ:\ncp -a:\n%s\nCopyTree:\n%s", w, g)
	}
	if err := fsutil.CopyTree(context.Background(), src, got); err == nil {
		t.Error("copied over an existing destination")
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := fsutil.CopyTree(cancelled, src, filepath.Join(base, "cancelled")); err == nil {
		t.Error("a cancelled copy went on")
	}
}

// describe lists every entry below root with everything a copy must keep.
func describe(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	inodes := map[uint64]string{}
	err := filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		line := fmt.Sprintf("%s type=%o perm=%o uid=%d gid=%d rdev=%d", rel, st.Mode&unix.S_IFMT, st.Mode&0o7777, st.Uid, st.Gid, st.Rdev)
		if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Mode&unix.S_IFMT != unix.S_IFLNK {
			line += fmt.Sprintf(" size=%d blocks=%d", st.Size, st.Blocks)
		}
		line += fmt.Sprintf(" mtime=%d.%09d", st.Mtim.Sec, st.Mtim.Nsec)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case unix.S_IFREG:
			b, _ := os.ReadFile(p)
			line += fmt.Sprintf(" sha=%x", sha256.Sum256(b))
			if st.Nlink > 1 {
				if first, ok := inodes[st.Ino]; ok {
					line += " linked-to=" + first
				} else {
					inodes[st.Ino] = rel
				}
			}
		}
		buf := make([]byte, 4096)
		if n, err := unix.Llistxattr(p, buf); err == nil {
			names := strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00")
			sort.Strings(names)
			for _, name := range names {
				if name == "" {
					continue
				}
				v := make([]byte, 256)
				m, _ := unix.Lgetxattr(p, name, v)
				line += fmt.Sprintf(" %s=%q", name, v[:max(m, 0)])
			}
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}
