package container_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/testutil"
	"github.com/lazyfork/lazyfork/lib/testutil/timescale"
)

// layerFile is one entry of a layer a test builds.
type layerFile struct {
	name string
	body []byte
	mode int64
	link string // symlink target
	dir  bool
}

// busyboxLayout writes an OCI layout of a one-layer image: the host's static busybox as
// /bin/sh and friends, plus files, with the given config environment. It returns the
// layout directory (a path `lazyfork create` takes).
func busyboxLayout(t *testing.T, env []string, files ...layerFile) string {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal("needs busybox-static on the host: run `make setup`")
	}
	all := []layerFile{{name: "bin/", dir: true}, {name: "bin/busybox", body: bb, mode: 0o755}, {name: "tmp/", dir: true}}
	for _, l := range []string{"sh", "echo", "sleep", "cat", "hostname", "head", "ls", "env", "test", "readlink", "rm", "ln", "mkfifo", "mknod", "mkdir", "grep"} {
		all = append(all, layerFile{name: "bin/" + l, link: "busybox"})
	}
	all = append(all, files...)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range all {
		h := &tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.body)), Typeflag: tar.TypeReg}
		switch {
		case f.dir:
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		case f.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.link, 0o777
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(f.body)
	}
	tw.Close()
	return layoutOf(t, buf.Bytes(), v1.Config{Env: env, Cmd: []string{"sleep", "100000"}})
}

const preloadSrc = `#include <fcntl.h>
#include <unistd.h>
#include <string.h>
__attribute__((constructor)) static void pwn(void) {
	int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (fd >= 0) { write(fd, "preload ran\n", 12); close(fd); }
}
`

// TestExecIgnoresHostileImageEnv: an image whose Env sets PATH and LD_PRELOAD to paths
// that also exist on the host (a directory any local user could have made) must not get
// its code run on the host by exec: the helper starts with an empty environment, the
// command is looked up inside the container, and the image's environment reaches only
// the command. Before, a host-side helper ran with the image's environment: LD_PRELOAD
// loaded the library into a root process on the host, and PATH picked the host's fake
// nsenter.
func TestExecIgnoresHostileImageEnv(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Fatal("needs gcc to build the LD_PRELOAD library: apt-get install gcc")
	}
	host := t.TempDir() // the same path exists on the host and in the image
	marker := filepath.Join(host, "marker")
	src := filepath.Join(host, "evil.c")
	os.WriteFile(src, []byte(preloadSrc), 0o644)
	so := filepath.Join(host, "evil.so")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", fmt.Sprintf("-DMARKER=%q", marker), "-o", so, src).CombinedOutput(); err != nil {
		t.Fatalf("build the preload library: %v\n%s", err, out)
	}
	lib, _ := os.ReadFile(so)
	// Host-side fakes a host lookup with the image's PATH would find.
	os.MkdirAll(filepath.Join(host, "bin"), 0o755)
	fake := fmt.Sprintf("#!/bin/sh\necho host-$(basename $0) >> %s\n", marker)
	for _, n := range []string{"nsenter", "hostname", "sh", "whereami", "env"} {
		os.WriteFile(filepath.Join(host, "bin", n), []byte(fake), 0o755)
	}
	rel := strings.TrimPrefix(host, "/")
	env := []string{"PATH=" + host + "/bin:/bin", "LD_PRELOAD=" + so, "LD_LIBRARY_PATH=" + host}
	dir := busyboxLayout(t, env,
		layerFile{name: rel + "/", dir: true}, layerFile{name: rel + "/bin/", dir: true},
		layerFile{name: rel + "/evil.so", body: lib, mode: 0o755},
		layerFile{name: rel + "/bin/whereami", body: []byte("#!/bin/sh\necho inside-image\n"), mode: 0o755})

	rt := ownImageRuntime(t)
	ctx := context.Background()
	c, err := rt.Create(ctx, container.CreateOptions{Image: dir, Name: "hostile-env"})
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) *container.ExecResult {
		t.Helper()
		res, err := rt.Exec(ctx, c, container.ExecOptions{Args: args, Timeout: 30 * time.Second})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %v: %v %+v", args, err, res)
		}
		return res
	}
	if got := strings.TrimSpace(run("hostname").Stdout); got != c.ID {
		t.Errorf("hostname = %q, want %s", got, c.ID)
	}
	// Resolved with the container's PATH, in the container's root.
	if got := strings.TrimSpace(run("whereami").Stdout); got != "inside-image" {
		t.Errorf("whereami = %q, want the image's script", got)
	}
	// The image's environment reaches the command, and the caller's extra variables too.
	res, err := rt.Exec(ctx, c, container.ExecOptions{Args: []string{"sh", "-c", `echo "$PATH|$LD_PRELOAD|$X"`}, Env: []string{"X=1"}})
	if err != nil || strings.TrimSpace(res.Stdout) != env[0][len("PATH="):]+"|"+so+"|1" {
		t.Errorf("environment inside = %q, %v", res.Stdout, err)
	}
	// A missing command is an error naming the container's PATH, not a host lookup.
	_, err = rt.Exec(ctx, c, container.ExecOptions{Args: []string{"no-such-command"}})
	if err == nil || !strings.Contains(err.Error(), `command "no-such-command" not found in the container (PATH=`+host+"/bin:/bin)") {
		t.Errorf("missing command: %v", err)
	}
	// A working directory the container lacks is an error too, from inside.
	_, err = rt.Exec(ctx, c, container.ExecOptions{Args: []string{"true"}, Cwd: host + "/nowhere"})
	if err == nil || !strings.Contains(err.Error(), "working directory "+host+"/nowhere in the container: no such file or directory") {
		t.Errorf("missing working directory: %v", err)
	}
	if b, err := os.ReadFile(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("image code ran on the host: marker %q (%v)", b, err)
	}
}

// TestExecOutputBound: captured output is bounded; a command writing more is killed and
// exec fails with a one-line error; streamed output is not bounded.
func TestExecOutputBound(t *testing.T) {
	rt := ownImageRuntime(t)
	ctx := context.Background()
	c, err := rt.Create(ctx, container.CreateOptions{Image: busyboxLayout(t, []string{"PATH=/bin"}), Name: "chatty"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := rt.Exec(ctx, c, container.ExecOptions{Args: []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/zero; sleep 1000", container.MaxExecOutput+1)}})
	if err == nil || !errors.Is(err, container.ErrExecOutputLimit) {
		t.Fatalf("exec over the bound: %v", err)
	}
	t.Log(err)
	if msg := err.Error(); !strings.Contains(msg, "more than 16 MiB to stdout") || strings.Contains(msg, "\n") {
		t.Errorf("error = %q", msg)
	}
	// Far below the command's sleep 1000 (scaled for emulated runs: make test-v2).
	if time.Since(start) > timescale.Scale(20*time.Second) {
		t.Errorf("the command was not killed at the bound (took %v)", time.Since(start))
	}
	if res == nil || len(res.Stdout) != container.MaxExecOutput {
		t.Errorf("captured %d bytes, want the first %d", len(res.Stdout), container.MaxExecOutput)
	}
	res, err = rt.Exec(ctx, c, container.ExecOptions{Args: []string{"sh", "-c", "head -c 5000 /dev/zero >&2"}, MaxOutput: 4096})
	if !errors.Is(err, container.ErrExecOutputLimit) || !strings.Contains(err.Error(), "more than 4096 bytes to stderr") {
		t.Errorf("stderr over a small bound: %v", err)
	}
	// Exactly at the bound is fine.
	res, err = rt.Exec(ctx, c, container.ExecOptions{Args: []string{"head", "-c", "4096", "/dev/zero"}, MaxOutput: 4096})
	if err != nil || len(res.Stdout) != 4096 {
		t.Errorf("exec at the bound: %v, %d bytes", err, len(res.Stdout))
	}
	// Streamed: no bound.
	var n countWriter
	res, err = rt.Exec(ctx, c, container.ExecOptions{Args: []string{"head", "-c", "20000", "/dev/zero"}, MaxOutput: 4096, Stdout: &n})
	if err != nil || n != 20000 {
		t.Errorf("streamed exec: %v, %d bytes", err, n)
	}
	// The killed command left nothing running in the container.
	testutil.Eventually(t, 10*time.Second, "only the container's init to remain", func() bool {
		return rt.Inspect(c).Procs == 1
	})
}

type countWriter int

func (w *countWriter) Write(p []byte) (int, error) { *w += countWriter(len(p)); return len(p), nil }

// TestExecConfinedAsInit: a command run by exec has exactly the confinement of the
// container's init (cgroups, user, capability sets, no_new_privs, seccomp), for the default
// profile, a --user container and a privileged one; and the exec helper is not visible
// inside.
func TestExecConfinedAsInit(t *testing.T) {
	rt := ownImageRuntime(t)
	ctx := context.Background()
	layout := busyboxLayout(t, []string{"PATH=/bin"}, layerFile{name: "etc/", dir: true},
		layerFile{name: "etc/passwd", body: []byte("root:x:0:0::/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/sh\n")},
		layerFile{name: "etc/group", body: []byte("root:x:0:\nagent:x:1000:\n")})
	show := func(p string) string {
		return "cat " + p + "/cgroup; grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp|Seccomp_filters):' " + p + "/status"
	}
	for _, o := range []container.CreateOptions{
		{Name: "confined"},
		{Name: "agent", User: "agent"},
		{Name: "privileged", Privileged: true},
	} {
		t.Run(o.Name, func(t *testing.T) {
			o.Image = layout
			c, err := rt.Create(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			res, err := rt.Exec(ctx, c, container.ExecOptions{Args: []string{"sh", "-c", show("/proc/1") + "; echo ---; " + show("/proc/self") + "; echo ---; for p in /proc/[0-9]*; do echo $(cat $p/comm); done"}})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("exec: %v %+v", err, res)
			}
			parts := strings.Split(res.Stdout, "---\n")
			if len(parts) != 3 {
				t.Fatalf("output %q", res.Stdout)
			}
			if parts[0] != parts[1] {
				t.Errorf("exec'd process differs from init:\ninit:\n%s\nexec:\n%s", parts[0], parts[1])
			}
			t.Logf("%s", parts[1])
			// init (sleep) and the exec'd sh (and cat, if it is still listed): no helper.
			for _, comm := range strings.Fields(parts[2]) {
				if comm != "sleep" && comm != "sh" && comm != "cat" {
					t.Errorf("process %q visible inside (all: %q)", comm, parts[2])
				}
			}
			wantSeccomp := "Seccomp:\t2"
			if o.Privileged {
				wantSeccomp = "Seccomp:\t0"
			}
			if !strings.Contains(parts[1], wantSeccomp) {
				t.Errorf("want %q in the exec'd process's status", wantSeccomp)
			}
			if o.User == "agent" && !strings.Contains(parts[1], "Uid:\t1000\t1000\t1000\t1000") {
				t.Errorf("exec'd process does not run as the container's user")
			}
		})
	}
}

// TestLogsStayInsideContainer: the container owns /var/log/lazyfork/output.log; whatever
// it puts there (a symlink to a host file, a symlinked directory, a fifo, a device node),
// reading the log from the host never reads a host file, never blocks, never opens a
// device.
func TestLogsStayInsideContainer(t *testing.T) {
	rt := ownImageRuntime(t)
	ctx := context.Background()
	host := t.TempDir()
	secret := filepath.Join(host, "output.log")
	os.WriteFile(secret, []byte("HOST-SECRET\n"), 0o600)
	c, err := rt.Create(ctx, container.CreateOptions{Image: busyboxLayout(t, []string{"PATH=/bin"}), Name: "liar",
		Command: []string{"sh", "-c", "echo hello; sleep 100000"}})
	if err != nil {
		t.Fatal(err)
	}
	read := func() (string, error) {
		f, err := container.OpenLog(c)
		if err != nil {
			return "", err
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		return string(b), err
	}
	testutil.Eventually(t, 10*time.Second, "the log to say hello", func() bool {
		got, _ := read()
		return got == "hello\n"
	})
	cases := []struct {
		name, script, want string
	}{
		{"symlink to a host file", "rm /var/log/lazyfork/output.log; ln -s " + secret + " /var/log/lazyfork/output.log", "is a symlink inside the container"},
		{"symlinked directory", "rm -rf /var/log/lazyfork; ln -s " + host + " /var/log/lazyfork", "does not exist in the container"},
		{"relative escape", "rm -rf /var/log/lazyfork; ln -s ../../../../../../../../.." + host + " /var/log/lazyfork", "does not exist in the container"},
		{"fifo", "rm -rf /var/log/lazyfork; mkdir /var/log/lazyfork; mkfifo /var/log/lazyfork/output.log", "is a fifo"},
		{"device node", "rm -rf /var/log/lazyfork; mkdir /var/log/lazyfork; mknod /var/log/lazyfork/output.log c 1 3", "is a character device"},
		{"directory", "rm -rf /var/log/lazyfork; mkdir -p /var/log/lazyfork/output.log", "is a directory"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := rt.Exec(ctx, c, container.ExecOptions{Args: []string{"sh", "-c", tc.script}, Timeout: 10 * time.Second})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("prepare: %v %+v", err, res)
			}
			start := time.Now()
			got, err := read()
			if err == nil {
				t.Fatalf("read the log: %q, want an error", got)
			}
			t.Log(err)
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error = %q, want one line with %q", err, tc.want)
			}
			if strings.Contains(got, "HOST-SECRET") {
				t.Errorf("host file content read through the container's log")
			}
			if time.Since(start) > timescale.Scale(5*time.Second) { // a fifo would block for good
				t.Errorf("reading the log blocked for %v", time.Since(start))
			}
		})
	}
	// What the plain path read would have done: the test is not vacuous.
	rt.Exec(ctx, c, container.ExecOptions{Args: []string{"sh", "-c", "rm -rf /var/log/lazyfork; mkdir /var/log/lazyfork; ln -s " + secret + " /var/log/lazyfork/output.log"}})
	if b, _ := os.ReadFile(container.LogPath(c)); string(b) != "HOST-SECRET\n" {
		t.Errorf("the naive read of LogPath gave %q; the symlink case above proves nothing", b)
	}
}

// TestExecHelper: exec starts the runtime's helper (the built lazyfork-helper under make
// test); a missing one fails the exec with one line that names it and the fix, and starts
// nothing in the container.
func TestExecHelper(t *testing.T) {
	rt := ownImageRuntime(t)
	ctx := context.Background()
	if dir := os.Getenv("LAZYFORK_BIN"); dir != "" && rt.Helper != filepath.Join(dir, container.HelperName) {
		t.Fatalf("runtime's helper is %s, want the built one in %s", rt.Helper, dir)
	}
	c, err := rt.Create(ctx, container.CreateOptions{Image: busyboxLayout(t, []string{"PATH=/bin"}), Name: "helped"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := rt.Exec(ctx, c, container.ExecOptions{Args: []string{"hostname"}})
	if err != nil || strings.TrimSpace(res.Stdout) != c.Hostname {
		t.Fatalf("exec through %s: %v, %+v", rt.Helper, err, res)
	}
	good := rt.Helper
	rt.Helper = filepath.Join(t.TempDir(), container.HelperName)
	_, err = rt.Exec(ctx, c, container.ExecOptions{Args: []string{"hostname"}})
	rt.Helper = good
	if err == nil {
		t.Fatal("exec with a missing helper worked")
	}
	if msg := err.Error(); !strings.Contains(msg, container.HelperName+" is missing") || !strings.Contains(msg, "make build") || strings.Contains(msg, "\n") {
		t.Errorf("error = %q, want one line naming the helper and the fix", msg)
	}
	if n := rt.Inspect(c).Procs; n != 1 {
		t.Errorf("%d processes in the container after the failed exec, want its init only", n)
	}
}
