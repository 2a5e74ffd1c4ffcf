package fork_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

func lines(c *store.Container) []string {
	b, _ := os.ReadFile(container.LogPath(c))
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// A program that opened inet sockets forks: CRIU 4.1 failed on every inet socket on Linux
// >= 6.16 ("Can't get 1:16 opt"), so set-up installs CRIU >= 4.2 there. The sockets are
// unbound: a port bound in the source would be taken in the host network namespace that
// forks share today (the network issue gives each fork its own).
func TestForkProgramHoldingInetSockets(t *testing.T) {
	rt := testutil.NewRuntime(t)
	const py = `import socket, itertools, time
t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
v = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
for i in itertools.count():
    print(i, t.type == socket.SOCK_STREAM, u.type == socket.SOCK_DGRAM, v.family == socket.AF_INET6, flush=True)
    time.sleep(0.1)
`
	src := create(t, rt, "sockets", "python3", "-c", py)
	testutil.Eventually(t, 10*time.Second, "the program to open its sockets", func() bool { return len(lines(src)) > 4 })
	forks := doFork(t, rt, src, 2)
	for _, f := range forks {
		f := f
		n := len(lines(f))
		testutil.Eventually(t, 10*time.Second, "the fork to go on", func() bool { return len(lines(f)) > n+8 })
		// Its sockets came back with their types and families.
		l := lines(f)
		last := l[len(l)-1]
		if !strings.HasSuffix(last, "True True True") {
			t.Errorf("fork %s last line %q", f.ID, last)
		}
		if got := execOut(t, rt, f, "sh", "-c", "ls -l /proc/1/fd | grep -c socket:"); got != "3" {
			t.Errorf("fork %s holds %s sockets, want 3", f.ID, got)
		}
	}
}
