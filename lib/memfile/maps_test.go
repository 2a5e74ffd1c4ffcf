package memfile

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	lfcriu "github.com/lazyfork/lazyfork/lib/criu"
	"golang.org/x/sys/unix"
)

// manyMaps is CRIU's zdtm maps06 in Python: 10,240 private mappings of one file, each page
// written, interleaved with 10,240 private anonymous pages, each written (20,480 VMAs with
// dumped pages). SIGUSR1 checks every page and writes status-<pid> {"ok": n, "pid": pid}.
const manyMaps = statusPy + `
import ctypes, mmap
path, n = sys.argv[2], int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
ps = mmap.PAGESIZE
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, ps)
os.pwrite(fd, b'F' * ps, 0)
start = libc.mmap(None, ps * n * 4, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
FIXED = 0x10
def at(i):
    return ctypes.cast(start + i * ps, ctypes.POINTER(ctypes.c_int))
for i in range(n):
    a = libc.mmap(start + i * 3 * ps, ps, 3, mmap.MAP_PRIVATE | FIXED, fd, 0)
    b = libc.mmap(start + (i * 3 + 1) * ps, ps, 3, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | FIXED, -1, 0)
    if a != start + i * 3 * ps or b != start + (i * 3 + 1) * ps:
        sys.exit("mmap failed: %d" % ctypes.get_errno())
    at(i * 3)[0] = i * 2
    at(i * 3 + 1)[0] = i
os.close(fd)
def report(*a):
    ok = 0
    for i in range(n):
        tail = ctypes.string_at(start + i * 3 * ps + 4, 8)
        if at(i * 3)[0] == i * 2 and at(i * 3 + 1)[0] == i and tail == b'F' * 8:
            ok += 1
    write_status({"ok": ok})
serve(report)
`

// A process with 20,480 mappings with dumped pages (maps06) gets one memory file, the
// rewrite holds a handful of descriptors whatever the number of mappings, and CRIU
// restores it under a descriptor limit far below the number of mappings.
func TestManyMappingsOneFile(t *testing.T) {
	requirePriv(t)
	const n = 10240
	l := newLab(t)
	pid := l.run("maps.py", manyMaps, filepath.Join(l.base, "maps.file"), strconv.Itoa(n))
	okOf := func(pid int) int { return statusAs[struct{ OK int }](l, pid).OK }
	if got := okOf(pid); got != n {
		t.Fatalf("the workload checks %d of %d pages before any dump", got, n)
	}
	dumped := l.dump(pid, "img")

	rep, err := Inspect(Options{CheckpointDir: dumped, FamilyDir: l.family, ConvertFilePrivate: true})
	if err != nil {
		t.Fatal(err)
	}
	var moved, converted int
	for _, v := range rep.VMAs {
		switch v.Decision {
		case "move":
			moved++
		case "convert-file":
			converted++
		}
	}
	if len(rep.Files) != 1 || rep.Files[0].VMAs < 2*n || moved < n || converted < n {
		t.Fatalf("inspect: %d files, %d anonymous and %d file VMAs planned; want one file for %d VMAs", len(rep.Files), moved, converted, 2*n)
	}

	// The rewrite must not need a descriptor per mapping or per file: run it with 64.
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	low := unix.Rlimit{Cur: 64, Max: old.Max}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	res, err := Rewrite(context.Background(), Options{CheckpointDir: dumped, FamilyDir: l.family, MountPath: l.family, ConvertFilePrivate: true, Prefix: "m"})
	unix.Setrlimit(unix.RLIMIT_NOFILE, &old)
	if err != nil {
		t.Fatalf("rewrite under 64 descriptors: %v", err)
	}
	t.Logf("rewrite: %d anon + %d file VMAs, %d files, %d pages moved, %v", res.VMAsConverted, res.FileVMAsConverted, len(res.Files), res.PagesMoved, res.Duration)
	if len(res.Files) != 1 || res.FileVMAsConverted < n || res.VMAsConverted < n {
		t.Errorf("result %+v", res)
	}
	if got := listDir(t, l.family); len(got) != 1 {
		t.Errorf("family dir holds %d files", len(got))
	}

	// CRIU restores it with 512 descriptors (it opens the file once per run of VMAs).
	work := filepath.Join(l.base, "work-r")
	os.Mkdir(work, 0o755)
	bin, _ := exec.LookPath("prlimit")
	if bin == "" {
		t.Fatal("needs prlimit (util-linux)")
	}
	crbin, err := lfcriu.FindBinary("")
	if err != nil {
		t.Fatal(err)
	}
	rc := exec.Command("timeout", "-k", "5", "60", bin, "--nofile=512:512", crbin.Path, "restore", "-D", dumped, "-W", work, "-d",
		"--pidfile", filepath.Join(work, "pid"), "-o", "restore.log", "-v4")
	out, rerr := rc.CombinedOutput()
	b, _ := os.ReadFile(filepath.Join(work, "pid"))
	rpid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if rpid > 0 {
		l.track(rpid)
	}
	if rerr != nil || rpid == 0 {
		t.Fatalf("restore under 512 descriptors: %v\n%s\n%s", rerr, out, logErrors(filepath.Join(work, "restore.log")))
	}
	os.Remove(filepath.Join(l.status, fmt.Sprintf("status-%d", rpid)))
	if err := syscall.Kill(rpid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if got := okOf(rpid); got != n {
		t.Errorf("the restored copy checks %d of %d pages", got, n)
	}
}

// childOf waits for the first child of pid (the workload under unshare --fork).
func childOf(t *testing.T, pid int) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		if f := strings.Fields(string(b)); len(f) > 0 {
			c, _ := strconv.Atoi(f[0])
			return c
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("workload did not start")
	return 0
}
