package container_test

import (
	"archive/tar"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/image"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// entry is one file of a layer built by symImage.
type entry struct {
	name, body, link string
	dir              bool
}

// symImage writes an OCI layout of a one-layer image holding the host's static busybox
// plus entries, with the given config user, and returns the layout's directory.
func symImage(t *testing.T, user string, entries ...entry) string {
	t.Helper()
	layer := testutil.Busybox(t, "sh", "cat", "ls", "sleep", "readlink", "id", "stat", "mount")
	for _, e := range entries {
		switch {
		case e.dir:
			layer = append(layer, testutil.TarEntry{Hdr: tar.Header{Name: e.name + "/", Typeflag: tar.TypeDir, Mode: 0o755}})
		case e.link != "":
			layer = append(layer, testutil.TarEntry{Hdr: tar.Header{Name: e.name, Typeflag: tar.TypeSymlink, Linkname: e.link, Mode: 0o777}})
		default:
			layer = append(layer, testutil.TarEntry{Hdr: tar.Header{Name: e.name, Typeflag: tar.TypeReg, Mode: 0o644}, Body: []byte(e.body)})
		}
	}
	return layoutOf(t, testutil.Tar(t, layer...), v1.Config{User: user, Cmd: []string{"sleep", "100000"}})
}

// ownImageRuntime is a test runtime whose image store is its own, inside the test's
// state root (lower layers must lie inside the state roots), for images the test makes.
func ownImageRuntime(t *testing.T) *container.Runtime {
	t.Helper()
	rt := testutil.NewRuntime(t)
	dir := filepath.Join(paths.Root(), "images")
	if fi, err := os.Lstat(dir); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if err := os.Remove(dir); err != nil {
			t.Fatal(err)
		}
	}
	s, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	rt.Images = s
	return rt
}

// snapshotDir lists a host directory's entries with their contents, to compare later.
func snapshotDir(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		b.WriteString(p + " " + fi.Mode().String())
		if fi.Mode().IsRegular() {
			c, _ := os.ReadFile(p)
			b.WriteString(" " + string(c))
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestHostileImageSymlinks: an image whose runtime paths are symlinks to host
// directories must not make create write or mount anything on the host. The container is
// made with real directories in their place (a contained result); a User looked up
// through a symlinked /etc/passwd resolves inside the root (a clear error here).
func TestHostileImageSymlinks(t *testing.T) {
	rt := ownImageRuntime(t)
	victim := t.TempDir()
	for _, d := range []string{"lazyfork", "proc", "dev", "tmp", "log"} {
		if err := os.Mkdir(filepath.Join(victim, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	passwd := filepath.Join(victim, "passwd")
	if err := os.WriteFile(passwd, []byte("evil:x:4242:4242::/:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := snapshotDir(t, victim)
	links := []entry{
		{name: ".lazyfork", link: filepath.Join(victim, "lazyfork")},
		{name: "proc", link: filepath.Join(victim, "proc")},
		{name: "dev", link: filepath.Join(victim, "dev")},
		{name: "tmp", link: filepath.Join(victim, "tmp")},
		{name: "var", dir: true}, {name: "var/log", dir: true},
		{name: "var/log/lazyfork", link: filepath.Join(victim, "log")},
		{name: "etc", dir: true},
		{name: "etc/passwd", link: passwd},
	}
	ctx := context.Background()

	// User "evil" exists only in the host file the image's /etc/passwd points at.
	_, err := rt.Create(ctx, container.CreateOptions{Image: symImage(t, "evil", links...), Name: "evil"})
	// Resolved inside the root the link leads nowhere (or loops through the image's own
	// /tmp link): an error about the image's /etc/passwd, never the host's file.
	if err == nil || !strings.Contains(err.Error(), "/etc/passwd") {
		t.Fatalf("create with a symlinked /etc/passwd: err = %v, want the user looked up inside the root only", err)
	}

	c, err := rt.Create(ctx, container.CreateOptions{Image: symImage(t, "", links...), Name: "links"})
	if err != nil {
		t.Fatalf("create with symlinked runtime paths: %v", err)
	}
	testutil.Eventually(t, 5*time.Second, "container to run", func() bool { return container.Alive(c) })
	// Inside, the runtime's paths are real: proc is mounted, /dev has its nodes, the
	// output log and the memory bind are where they belong.
	out, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", c.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, mp := range []string{" /proc ", " /.lazyfork/mem ", " /proc/sys/vm/overcommit_memory "} {
		if !strings.Contains(string(out), mp) {
			t.Errorf("container has no mount at%s:\n%s", mp, out)
		}
	}
	if after := snapshotDir(t, victim); after != before {
		t.Errorf("the host directories changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if fi, err := os.Lstat(filepath.Join(c.Upper, "var/log/lazyfork/output.log")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("output log not in the container's upper layer: %v", err)
	}
}

// status returns the named fields of a host pid's /proc status.
func status(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// mountOpts maps the container's mount points to their per-mount options.
func mountOpts(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		m[f[4]] = f[5]
	}
	return m
}

// devicesList is the v1 devices cgroup's list, or "" on v2 (no such file: the rules are
// an eBPF program there, checked by deviceAccess).
func devicesList(t *testing.T, c *store.Container) string {
	t.Helper()
	if _, ok := c.Cgroup["devices"]; !ok {
		if _, v2 := c.Cgroup["unified"]; !v2 {
			t.Fatalf("container %s has neither a v1 devices group nor a v2 group: %v", c.ID, c.Cgroup)
		}
		return ""
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/devices", c.Cgroup["devices"], "devices.list"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// deviceAccess is what the device rules (v1 devices cgroup or v2 eBPF program) let a
// process exec'd in c do: mknod of a block device (7:0), of a char device off the
// allow-list (1:1, /dev/mem) and of one on it (1:3, /dev/null).
func deviceAccess(t *testing.T, rt *container.Runtime, c *store.Container) string {
	t.Helper()
	script := `for n in "b 7 0" "c 1 1" "c 1 3"; do if mknod /tmp/lf-dev $n 2>/dev/null; then r=ok; else r=refused; fi; rm -f /tmp/lf-dev; printf '%s:%s ' "$n" $r; done`
	res, err := rt.Exec(context.Background(), c, container.ExecOptions{Args: []string{"sh", "-c", script}, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(res.Stdout)
}

// TestConfinedByDefaultPrivilegedOptOut: a container gets Docker's capabilities,
// no_new_privs, the seccomp filter, masked and read-only /proc paths, a read-only
// nosuid nodev memory bind and the device list; --privileged gets none of it.
func TestConfinedByDefaultPrivilegedOptOut(t *testing.T) {
	rt := testutil.NewRuntime(t)
	ctx := context.Background()
	c, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "confined", Command: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	st := status(t, c.Pid)
	for k, want := range map[string]string{"CapEff": "00000000a80425fb", "CapBnd": "00000000a80425fb", "CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"} {
		if st[k] != want {
			t.Errorf("confined %s = %s, want %s", k, st[k], want)
		}
	}
	mo := mountOpts(t, c.Pid)
	for mp, want := range map[string][]string{
		"/proc/sys": {"ro"}, "/proc/keys": {"ro"}, "/proc/timer_list": {"ro"}, "/proc/sys/vm/overcommit_memory": {"ro"},
		container.MemMount: {"ro", "nosuid", "nodev"},
		"/dev":             {"nosuid"}, "/dev/shm": {"nosuid", "nodev", "noexec"},
	} {
		opts := strings.Split(mo[mp], ",")
		for _, w := range want {
			if !slices.Contains(opts, w) {
				t.Errorf("confined mount %s has options %q, want %s", mp, mo[mp], w)
			}
		}
	}
	if strings.Contains(mo[container.MemMount], "noexec") {
		t.Errorf("%s is noexec: forks map text and JIT pages from it", container.MemMount)
	}
	if got := devicesList(t, c); got != "" && (strings.Contains(got, "a *:*") || !strings.Contains(got, "c 1:3 rwm")) {
		t.Errorf("confined devices.list = %q, want the allow-list", got)
	}
	if got, want := deviceAccess(t, rt, c), "b 7 0:refused c 1 1:refused c 1 3:ok"; got != want {
		t.Errorf("confined device access %q, want %q", got, want)
	}
	if c.Confine == nil || c.Confine.Privileged || !c.Confine.NoNewPrivs {
		t.Errorf("record confine = %+v, want the default profile", c.Confine)
	}

	p, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "privileged", Command: []string{"sleep", "1000"}, Privileged: true})
	if err != nil {
		t.Fatal(err)
	}
	st, self := status(t, p.Pid), status(t, os.Getpid())
	if st["CapEff"] != self["CapEff"] || st["NoNewPrivs"] != "0" || st["Seccomp"] != "0" {
		t.Errorf("privileged: CapEff %s (ours %s) NoNewPrivs %s Seccomp %s, want all of ours, 0, 0", st["CapEff"], self["CapEff"], st["NoNewPrivs"], st["Seccomp"])
	}
	mo = mountOpts(t, p.Pid)
	if _, ok := mo["/proc/keys"]; ok {
		t.Errorf("privileged container has /proc/keys masked")
	}
	if _, ok := mo["/proc/sys"]; ok {
		t.Errorf("privileged container has /proc/sys read-only")
	}
	if got := devicesList(t, p); got != "" && got != "a *:* rwm" {
		t.Errorf("privileged devices.list = %q, want a *:* rwm", got)
	}
	if got, want := deviceAccess(t, rt, p), "b 7 0:ok c 1 1:ok c 1 3:ok"; got != want {
		t.Errorf("privileged device access %q, want %q", got, want)
	}
}

// TestUserFromFlagAndImage: --user by name (the image's /etc/passwd), by numbers, and
// the image's own User; an unknown name is a one-line error and leaves nothing.
func TestUserFromFlagAndImage(t *testing.T) {
	rt := testutil.NewRuntime(t)
	ctx := context.Background()
	for _, tc := range []struct{ user, uid, gid string }{
		{"nobody", "65534", "65534"},
		{"1000:1000", "1000", "1000"},
		{"daemon:nogroup", "1", "65534"},
	} {
		c, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Command: []string{"sleep", "1000"}, User: tc.user})
		if err != nil {
			t.Fatalf("--user %s: %v", tc.user, err)
		}
		st := status(t, c.Pid)
		if f := strings.Fields(st["Uid"]); len(f) == 0 || f[0] != tc.uid {
			t.Errorf("--user %s: Uid %q, want %s", tc.user, st["Uid"], tc.uid)
		}
		if f := strings.Fields(st["Gid"]); len(f) == 0 || f[0] != tc.gid {
			t.Errorf("--user %s: Gid %q, want %s", tc.user, st["Gid"], tc.gid)
		}
		if st["CapEff"] != "0000000000000000" || st["Seccomp"] != "2" {
			t.Errorf("--user %s: CapEff %s Seccomp %s, want none and the filter", tc.user, st["CapEff"], st["Seccomp"])
		}
	}
	_, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Command: []string{"true"}, User: "nosuchuser"})
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), `"nosuchuser"`) {
		t.Fatalf("unknown user: err = %v, want a one-line error naming it", err)
	}
	list, _ := rt.Containers.List()
	if len(list) != 3 {
		t.Errorf("%d containers recorded, want 3: the failed create must leave nothing", len(list))
	}

	own := ownImageRuntime(t)
	c, err := own.Create(ctx, container.CreateOptions{Image: symImage(t, "1234:5678")})
	if err != nil {
		t.Fatal(err)
	}
	if st := status(t, c.Pid); !strings.HasPrefix(st["Uid"], "1234\t") || !strings.HasPrefix(st["Gid"], "5678\t") {
		t.Errorf("image User 1234:5678: Uid %q Gid %q", st["Uid"], st["Gid"])
	}
}
