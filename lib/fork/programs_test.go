package fork_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// What everyday programs hold forks by default: file locks (flock and POSIX), a temporary
// file with no name (tempfile.TemporaryFile), a file opened and then unlinked.
func TestForkFileLocksAndUnlinkedFiles(t *testing.T) {
	rt := testutil.NewRuntime(t)
	const py = `import fcntl, os, tempfile, time, itertools
f = open("/tmp/flock", "w"); fcntl.flock(f, fcntl.LOCK_EX)
g = open("/tmp/posix", "w"); fcntl.lockf(g, fcntl.LOCK_EX)
tf = tempfile.TemporaryFile(); tf.write(b"tmp-" * 100000); tf.flush()
n = open("/tmp/named", "w+"); n.write("named"); n.flush(); os.unlink("/tmp/named")
for i in itertools.count():
    tf.seek(0); n.seek(0)
    print(i, tf.read(4).decode(), n.read(), flush=True)
    time.sleep(0.1)
`
	src := create(t, rt, "locks", "python3", "-c", py)
	testutil.Eventually(t, 10*time.Second, "the program to take its locks", func() bool { return len(lines(src)) > 3 })
	f := doFork(t, rt, src, 1)[0]
	n := len(lines(f))
	testutil.Eventually(t, 10*time.Second, "the fork to go on", func() bool { return len(lines(f)) > n+5 })
	l := lines(f)
	if last := l[len(l)-1]; !strings.HasSuffix(last, " tmp- named") {
		t.Errorf("fork's last line %q: the unnamed and unlinked files did not come back", last)
	}
	// The fork holds both locks itself (pid 1 in its namespace), as the source does.
	locks := execOut(t, rt, f, "cat", "/proc/locks")
	if !strings.Contains(locks, "FLOCK") || !strings.Contains(locks, "POSIX") {
		t.Errorf("fork's /proc/locks:\n%s", locks)
	}
	if got := lastLine(src); strings.HasSuffix(got, " tmp- named") == false {
		t.Errorf("source's last line %q", got)
	}
}

// A file whose opened name was removed while another hard link remains (zdtm
// unlink_fstat03) forks: CRIU carries it by a hard link it makes for the dump and deletes
// afterwards, which a swap (the upper becoming the snapshot's layer) would lose.
func TestForkFileUnlinkedWithOtherName(t *testing.T) {
	rt := testutil.NewRuntime(t)
	const py = `import os, time, itertools
os.makedirs("/srv", exist_ok=True)
f = open("/srv/data", "w+"); f.write("0" * 1000); f.flush()
os.link("/srv/data", "/srv/data.link"); os.unlink("/srv/data")
for i in itertools.count():
    f.seek(0)
    print(i, os.fstat(f.fileno()).st_size, f.read(3), flush=True)
    time.sleep(0.1)
`
	src := create(t, rt, "relinked", "python3", "-c", py)
	testutil.Eventually(t, 10*time.Second, "the program to start", func() bool { return len(lines(src)) > 3 })
	for gen := 1; gen <= 2; gen++ {
		f := doFork(t, rt, src, 1)[0]
		n := len(lines(f))
		testutil.Eventually(t, 10*time.Second, "the fork to go on", func() bool { return len(lines(f)) > n+3 })
		if last := lastLine(f); !strings.HasSuffix(last, " 1000 000") {
			t.Errorf("fork %d's last line %q: the relinked file did not come back", gen, last)
		}
		n = len(lines(src))
		testutil.Eventually(t, 10*time.Second, "the source to go on", func() bool { return len(lines(src)) > n+3 })
		if last := lastLine(src); !strings.HasSuffix(last, " 1000 000") {
			t.Errorf("source's last line %q after fork %d", last, gen)
		}
	}
}

// A program whose file lease is being broken forks, and the source gets no second break
// signal: a swap restored the source itself, and CRIU restores a breaking lease by
// breaking it again (zdtm file_lease02-04 failed in the source on that signal).
func TestForkBreakingLeaseLeavesSourceAlone(t *testing.T) {
	rt := testutil.NewRuntime(t)
	const py = `import fcntl, os, signal, time, itertools
n = [0]
signal.signal(signal.SIGIO, lambda *a: n.__setitem__(0, n[0] + 1))
os.makedirs("/srv", exist_ok=True)
open("/srv/leased", "w").close()
fd = os.open("/srv/leased", os.O_RDONLY)
fcntl.fcntl(fd, 1024, fcntl.F_RDLCK)  # F_SETLEASE
fcntl.fcntl(fd, 10, signal.SIGIO)     # F_SETSIG
try:
    os.open("/srv/leased", os.O_WRONLY | os.O_NONBLOCK)
except BlockingIOError:
    pass
for i in itertools.count():
    print(i, n[0], flush=True)
    time.sleep(0.1)
`
	src := create(t, rt, "lease", "python3", "-c", py)
	testutil.Eventually(t, 10*time.Second, "the lease to be breaking", func() bool { return strings.HasSuffix(lastLine(src), " 1") })
	f := doFork(t, rt, src, 1)[0]
	n := len(lines(f))
	testutil.Eventually(t, 10*time.Second, "the fork to go on", func() bool { return len(lines(f)) > n+3 })
	n = len(lines(src))
	testutil.Eventually(t, 10*time.Second, "the source to go on", func() bool { return len(lines(src)) > n+5 })
	if last := lastLine(src); !strings.HasSuffix(last, " 1") {
		t.Errorf("source's last line %q: it got another lease-break signal from the fork", last)
	}
	t.Logf("fork's last line %q (CRIU breaks the lease again in a restored copy)", lastLine(f))
}

// A stopped task (SIGSTOP) forks at once and stays stopped in the fork. The dump used to
// hang on it in the frozen cgroup until its deadline, and left the source frozen.
func TestForkStoppedTask(t *testing.T) {
	rt := testutil.NewRuntime(t)
	const py = `import subprocess, os, signal, time, itertools
p = subprocess.Popen(["sleep", "1000"]); time.sleep(0.2); os.kill(p.pid, signal.SIGSTOP)
for i in itertools.count():
    print(i, flush=True); time.sleep(0.1)
`
	src := create(t, rt, "stopped", "python3", "-c", py)
	testutil.Eventually(t, 10*time.Second, "the child to be stopped", func() bool {
		return strings.Contains(tryExec(rt, src, "ps", "-o", "stat=,comm=", "-e"), "T    sleep")
	})
	// Far below the dump deadline: a hang fails here rather than after two minutes.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	forks, _, err := fork.Fork(cctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1}})
	if err != nil {
		t.Fatalf("fork of a tree holding a stopped task: %v", err)
	}
	f, err := rt.Containers.Get(forks[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if ps := execOut(t, rt, f, "ps", "-o", "stat=,comm=", "-e"); !strings.Contains(ps, "T    sleep") {
		t.Errorf("the fork's sleep is not stopped:\n%s", ps)
	}
	n := len(lines(src))
	testutil.Eventually(t, 10*time.Second, "the source to go on", func() bool { return len(lines(src)) > n+3 })
}

// A dump cancelled half way (a client that went away, Ctrl-C, SIGTERM) leaves the source
// running, never frozen.
func TestCancelledDumpLeavesSourceRunning(t *testing.T) {
	rt := testutil.NewRuntime(t)
	const py = "import os, time, itertools\nheap = bytearray(os.urandom(1 << 20)) * 128\nfor i in itertools.count():\n    print(i, flush=True); time.sleep(0.1)\n"
	src := create(t, rt, "cancelled", "python3", "-c", py)
	testutil.Eventually(t, 20*time.Second, "the heap to be filled", func() bool { return len(lines(src)) > 2 })
	cancelled := 0
	for _, after := range []time.Duration{5 * time.Millisecond, 20 * time.Millisecond, 60 * time.Millisecond, 120 * time.Millisecond} {
		cctx, cancel := context.WithTimeout(ctx, after)
		_, _, err := fork.Fork(cctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1}})
		cancel()
		if err == nil {
			continue // the machine was fast enough: nothing to check for this delay
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("fork cancelled after %v: %v, want a deadline error", after, err)
		}
		cancelled++
		if st := rt.State(src); st != store.StateRunning {
			t.Fatalf("after a fork cancelled at %v the source is %s", after, st)
		}
		n := len(lines(src))
		testutil.Eventually(t, 20*time.Second, "the source to go on counting", func() bool { return len(lines(src)) > n+2 })
	}
	if cancelled == 0 {
		t.Fatal("no fork was cancelled mid-way: the delays are too long for this machine")
	}
	t.Logf("%d of 4 forks cancelled mid-way; the source ran on after each", cancelled)
}

func lastLine(c *store.Container) string {
	b, _ := os.ReadFile(container.LogPath(c))
	l := strings.Split(strings.TrimSpace(string(b)), "\n")
	return l[len(l)-1]
}

// An inotify watch on a directory of the container's own file system forks, and it still
// reports events in the fork. CRIU must find the watched directory by path (overlayfs file
// handles cannot be reopened), and searched only /etc and a few others.
func TestForkInotifyWatch(t *testing.T) {
	rt := testutil.NewRuntime(t)
	const py = `import ctypes, os, select, struct, itertools
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("/srv/app/in", exist_ok=True)
fd = libc.inotify_init1(0)
assert libc.inotify_add_watch(fd, b"/srv/app/in", 0x100) > 0  # IN_CREATE
assert libc.inotify_add_watch(fd, b"/tmp", 0x100) > 0
for i in itertools.count():
    r, _, _ = select.select([fd], [], [], 0.1)
    if r:
        buf, off = os.read(fd, 4096), 0
        while off < len(buf):
            wd, mask, cookie, n = struct.unpack_from("iIII", buf, off)
            print("event", buf[off + 16:off + 16 + n].rstrip(b"\0").decode(), flush=True)
            off += 16 + n
    else:
        print(i, flush=True)
`
	src := create(t, rt, "inotify", "python3", "-c", py)
	testutil.Eventually(t, 10*time.Second, "the watches to be set", func() bool { return len(lines(src)) > 3 })
	f := doFork(t, rt, src, 1)[0]
	execOut(t, rt, f, "touch", "/srv/app/in/hello-from-fork", "/tmp/tmp-from-fork")
	testutil.Eventually(t, 10*time.Second, "the fork's watches to report", func() bool {
		log := strings.Join(lines(f), "\n")
		return strings.Contains(log, "event hello-from-fork") && strings.Contains(log, "event tmp-from-fork")
	})
	if log := strings.Join(lines(src), "\n"); strings.Contains(log, "from-fork") {
		t.Error("the source saw the fork's file events")
	}
}

// A process with tens of thousands of mappings forks: its anonymous memory goes into one
// memory file (one per process, not per mapping: 20,000 files ran out of descriptors).
func TestForkManyMappings(t *testing.T) {
	rt := testutil.NewRuntime(t)
	const py = `import ctypes, itertools, time, zlib
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
N, PS = 20000, 4096
base = libc.mmap(None, N * PS, 3, 0x22, -1, 0)
for i in range(N):
    ctypes.memset(base + i * PS, i % 251 + 1, 64)
    if i % 2:
        libc.mprotect(ctypes.c_void_p(base + i * PS), PS, 1)  # alternate protections: no merging
want = zlib.crc32(ctypes.string_at(base, N * PS))
maps = sum(1 for _ in open("/proc/self/maps"))
for i in itertools.count():
    print(i, maps, zlib.crc32(ctypes.string_at(base, N * PS)) == want, flush=True)
    time.sleep(0.2)
`
	src := create(t, rt, "maps", "python3", "-c", py)
	testutil.Eventually(t, 30*time.Second, "the mappings to be made", func() bool { return len(lines(src)) > 1 })
	forks, _, err := fork.Fork(ctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1}})
	if err != nil {
		t.Fatalf("fork of a process with 20,000 mappings: %v", err)
	}
	f, err := rt.Containers.Get(forks[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	n := len(lines(f))
	testutil.Eventually(t, 20*time.Second, "the fork to go on", func() bool { return len(lines(f)) > n+2 })
	l := lines(f)
	if last := strings.Fields(l[len(l)-1]); len(last) != 3 || last[2] != "True" {
		t.Fatalf("fork's last line %q: its memory differs from the source's", l[len(l)-1])
	}
	mem, _ := os.ReadDir(f.MemDir)
	anon := 0
	for _, m := range mem {
		if strings.HasSuffix(m.Name(), "-anon.mem") {
			anon++
		}
	}
	if anon != 1 || len(mem) > 100 {
		t.Errorf("%d memory files, %d of them anonymous memory, for one process with 20,000 mappings; want one anonymous file and one per library", len(mem), anon)
	}
}

// A server listening on a unix socket bound to a path, with a client connected to it in
// the same container, forks: in the fork the pair goes on talking over the same
// connection, and new clients reach the fork's own server.
func TestForkUnixSocketServer(t *testing.T) {
	rt := testutil.NewRuntime(t)
	const py = `import os, socket, threading, time, itertools
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind("/tmp/app.sock"); srv.listen(8)
def serve():
    while True:
        c, _ = srv.accept()
        threading.Thread(target=lambda c=c: [c.sendall(b"pong " + c.recv(64)) for _ in iter(int, 1)], daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
cl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); cl.connect("/tmp/app.sock")
for i in itertools.count():
    cl.sendall(b"%d" % i)
    print(cl.recv(64).decode(), flush=True)
    time.sleep(0.1)
`
	src := create(t, rt, "unixsrv", "python3", "-c", py)
	testutil.Eventually(t, 10*time.Second, "the pair to talk", func() bool { return len(lines(src)) > 3 })
	f := doFork(t, rt, src, 1)[0]
	n := len(lines(f))
	testutil.Eventually(t, 10*time.Second, "the fork's pair to go on talking", func() bool { return len(lines(f)) > n+5 })
	if l := lines(f); !strings.HasPrefix(l[len(l)-1], "pong ") {
		t.Errorf("fork's last line %q", l[len(l)-1])
	}
	got := execOut(t, rt, f, "python3", "-c", `import socket; s = socket.socket(socket.AF_UNIX); s.connect("/tmp/app.sock"); s.sendall(b"x"); print(s.recv(64).decode())`)
	if got != "pong x" {
		t.Errorf("a new client of the fork's server got %q", got)
	}
}

// A program talking to a child through a pseudo-terminal (the container's own devpts)
// forks, and the conversation goes on in the fork.
func TestForkPseudoTerminal(t *testing.T) {
	rt := testutil.NewRuntime(t)
	const py = `import pty, os, time, itertools
pid, fd = pty.fork()
if pid == 0:
    os.execvp("sh", ["sh", "-c", "while true; do read l; echo got:$l; done"])
for i in itertools.count():
    os.write(fd, b"%d\n" % i); time.sleep(0.1)
    print(" ".join(os.read(fd, 200).decode().split()), flush=True)
`
	src := create(t, rt, "pty", "python3", "-c", py)
	testutil.Eventually(t, 10*time.Second, "the terminal to answer", func() bool { return len(lines(src)) > 3 })
	f := doFork(t, rt, src, 1)[0]
	n := len(lines(f))
	testutil.Eventually(t, 10*time.Second, "the fork's terminal to answer", func() bool { return len(lines(f)) > n+3 })
	if l := lines(f); !strings.Contains(l[len(l)-1], "got:") {
		t.Errorf("fork's last line %q", l[len(l)-1])
	}
}

// A container holding a fanotify descriptor is forked by copy: a restore gives its marks
// back other than they were (zdtm fanotify00 fails in a plain CRIU copy too), so the
// source is not swapped onto its snapshot and keeps its own processes.
func TestForkFanotifyLeavesSourceAlone(t *testing.T) {
	rt := testutil.NewRuntime(t)
	const py = `import ctypes, itertools, os, time
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(300, 0, os.O_RDONLY)  # fanotify_init(FAN_CLASS_NOTIF, O_RDONLY)
assert fd >= 0, os.strerror(ctypes.get_errno())
assert libc.syscall(301, fd, 1, 0x08, -100, b"/tmp") == 0  # fanotify_mark(ADD, CLOSE_WRITE)
for i in itertools.count():
    print(i, flush=True)
    time.sleep(0.1)
`
	src, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "fanotify", Privileged: true, Command: []string{"python3", "-c", py}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the counter to start", func() bool { return len(lines(src)) > 2 })
	pid := src.Pid
	f := doFork(t, rt, src, 1)[0]
	n := len(lines(f))
	testutil.Eventually(t, 10*time.Second, "the fork to go on", func() bool { return len(lines(f)) > n+3 })
	cur, err := rt.Containers.Get(src.ID)
	if err != nil {
		t.Fatal(err)
	}
	if cur.Pid != pid {
		t.Errorf("the source was swapped (pid %d -> %d): a container holding fanotify must be forked by copy", pid, cur.Pid)
	}
	n = len(lines(src))
	testutil.Eventually(t, 10*time.Second, "the source to go on", func() bool { return len(lines(src)) > n+3 })
}

// A program holding a userfaultfd (over anonymous memory it drops with MADV_DONTNEED and
// expects back as zeros) cannot be checkpointed: CRIU has no dumper for the descriptor.
// The fork is refused with an error naming the process and the descriptor, nothing is
// left behind, and the source runs on.
func TestForkUserfaultfdRefused(t *testing.T) {
	rt := testutil.NewRuntime(t)
	const py = `import ctypes, itertools, mmap, os, time
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(323, os.O_CLOEXEC)  # userfaultfd(2)
assert fd >= 0, os.strerror(ctypes.get_errno())
m = mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE); m.write(b"x" * (1 << 20))
for i in itertools.count():
    m.madvise(mmap.MADV_DONTNEED)
    print(i, m[0], flush=True)
    time.sleep(0.1)
`
	// Privileged: Docker's seccomp profile, which confined containers run under, allows
	// userfaultfd(2) only with CAP_SYS_PTRACE.
	src, err := rt.Create(ctx, container.CreateOptions{Image: testutil.DefaultImage, Name: "uffd", Privileged: true, Command: []string{"python3", "-c", py}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the program to start", func() bool { return len(lines(src)) > 2 })
	if last := lastLine(src); !strings.HasSuffix(last, " 0") {
		t.Fatalf("source's line %q: MADV_DONTNEED did not zero-fill anonymous memory", last)
	}
	before := strings.Split(leftovers(t, rt.Containers), " cgroups=")[0]
	_, _, err = fork.Fork(ctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1}})
	if !errors.Is(err, fork.ErrUserfaultfd) || !strings.Contains(err.Error(), itoa(src.Pid)+" (python3)") {
		t.Fatalf("fork of a userfaultfd holder: %v, want ErrUserfaultfd naming process %d (python3)", err, src.Pid)
	}
	if after := strings.Split(leftovers(t, rt.Containers), " cgroups=")[0]; after != before {
		t.Errorf("left behind: before %s, after %s", before, after)
	}
	n := len(lines(src))
	testutil.Eventually(t, 10*time.Second, "the source to go on", func() bool { return len(lines(src)) > n+3 })
}

// A program watching (inotify) a file it deleted while holding it open cannot be forked:
// CRIU saves a watch by file handle, which overlayfs refuses without nfs_export, or by a
// path, which a deleted file has not (zdtm inotify00: "fsnotify: Can't dump that
// handle"). The fork fails at once naming the process and the file, nothing is left
// behind and the source goes on; a watch on a file with a name forks (TestForkInotifyWatch).
func TestForkWatchOnDeletedFileRefused(t *testing.T) {
	rt := testutil.NewRuntime(t)
	const py = `import ctypes, itertools, os, time
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("/srv/w", exist_ok=True)
keep = open("/srv/w/gone", "w")
fd = libc.inotify_init1(os.O_CLOEXEC)
assert fd >= 0 and libc.inotify_add_watch(fd, b"/srv/w/gone", 0x8) >= 0, os.strerror(ctypes.get_errno())
os.unlink("/srv/w/gone")
for i in itertools.count():
    print(i, flush=True)
    time.sleep(0.1)
`
	src := create(t, rt, "watchgone", "python3", "-c", py)
	testutil.Eventually(t, 10*time.Second, "the program to start", func() bool { return len(lines(src)) > 2 })
	before := strings.Split(leftovers(t, rt.Containers), " cgroups=")[0]
	_, _, err := fork.Fork(ctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1}})
	if !errors.Is(err, fork.ErrWatchNoPath) || !strings.Contains(err.Error(), itoa(src.Pid)+" (python3)") || !strings.Contains(err.Error(), "/srv/w/gone") {
		t.Fatalf("fork of a program watching a deleted file: %v, want ErrWatchNoPath naming process %d (python3) and /srv/w/gone", err, src.Pid)
	}
	if after := strings.Split(leftovers(t, rt.Containers), " cgroups=")[0]; after != before {
		t.Errorf("left behind: before %s, after %s", before, after)
	}
	n := len(lines(src))
	testutil.Eventually(t, 10*time.Second, "the source to go on", func() bool { return len(lines(src)) > n+3 })
}

// A program holding a flock(2) lock, which recorded the locked file's device number,
// still finds its lock on that device after its container was forked: the first fork
// used to swap the source onto a new overlay mount, which gives every file another
// device number (zdtm file_locks01 failed in the source so). The fork itself is a copy,
// on its own mount. The program prints the device:inode its lock is held on as the kernel
// reports it (/proc/self/fdinfo), compared before and after the fork: which device that is
// differs between kernels (6.18 gives the overlay's, as fstat does; 6.12, the v2 guest's,
// gave the upper layer's), so it is not compared with fstat.
func TestForkFlockKeepsSourceDevice(t *testing.T) {
	rt := testutil.NewRuntime(t)
	const py = `import fcntl, itertools, os, time
os.makedirs("/srv", exist_ok=True)
f = open("/srv/lock", "w"); fcntl.flock(f, fcntl.LOCK_EX)
for i in itertools.count():
    held = [l.split()[6] for l in open("/proc/self/fdinfo/%d" % f.fileno()) if l.startswith("lock:")]
    print(i, "held on", ",".join(held) or "nothing", flush=True)
    time.sleep(0.1)
`
	src := create(t, rt, "flock", "python3", "-c", py)
	testutil.Eventually(t, 10*time.Second, "the lock to be taken", func() bool { return len(lines(src)) > 2 })
	heldOn := func(line string) string { _, on, _ := strings.Cut(line, " held on "); return on }
	want := heldOn(lastLine(src))
	if want == "" || want == "nothing" {
		t.Fatalf("source's line %q: no lock held before the fork", lastLine(src))
	}
	pid := src.Pid
	f := doFork(t, rt, src, 1)[0]
	n := len(lines(f))
	testutil.Eventually(t, 10*time.Second, "the fork to go on", func() bool { return len(lines(f)) > n+3 })
	t.Logf("fork's last line %q (a copy: its own mount)", lastLine(f))
	cur, err := rt.Containers.Get(src.ID)
	if err != nil {
		t.Fatal(err)
	}
	n = len(lines(cur))
	testutil.Eventually(t, 10*time.Second, "the source to go on", func() bool { return len(lines(cur)) > n+3 })
	if last := lastLine(cur); heldOn(last) != want {
		t.Errorf("source's last line %q (pid %d -> %d): its lock was held on %s before the fork: its locked file's device changed under it", last, pid, cur.Pid, want)
	}
}
