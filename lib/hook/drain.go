package hook

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/store"
)

// drainBacklog accepts and closes the connections waiting on c's hook socket. A runtime
// that listens but does not accept leaves our QUIESCE connection in its backlog, and CRIU
// cannot checkpoint a listening socket with a pending connection whose client is gone;
// before a forced snapshot the host therefore takes it out itself, through a duplicate of
// the listening socket (pidfd_getfd).
func drainBacklog(c *store.Container) error {
	cg, err := cgroup.LoadOwned(c.Cgroup)
	if err != nil {
		return err
	}
	pids, err := cg.Procs()
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if err := drainPid(pid, c.Hook); err != nil {
			return fmt.Errorf("drain hook backlog of %d: %w", pid, err)
		}
	}
	return nil
}

// drainPid looks through pid's file descriptors for a listening unix socket bound to
// sockPath and accepts what is pending on it.
func drainPid(pid int, sockPath string) error {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil // gone
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(pidfd)
	for _, e := range ents {
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || !strings.HasPrefix(link, "socket:") {
			continue
		}
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fd, err := unix.PidfdGetfd(pidfd, n, 0)
		if err != nil {
			continue
		}
		if isListener(fd, sockPath) {
			acceptPending(fd)
		}
		unix.Close(fd)
	}
	return nil
}

func isListener(fd int, sockPath string) bool {
	if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || v != 1 {
		return false
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return false
	}
	u, ok := sa.(*unix.SockaddrUnix)
	return ok && u.Name == sockPath
}

// acceptPending accepts and closes every connection the listening socket fd holds. It
// never blocks: O_NONBLOCK would be shared with the runtime's own descriptor, so each
// accept follows a poll that saw one waiting, and runs where a lost race cannot hang us.
func acceptPending(fd int) {
	for i := 0; i < 64; i++ {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(pfd, 0); err != nil || n == 0 {
			return
		}
		dup, err := unix.Dup(fd)
		if err != nil {
			return
		}
		done := make(chan bool, 1)
		go func() {
			defer unix.Close(dup)
			nfd, _, err := unix.Accept4(dup, unix.SOCK_CLOEXEC)
			if err == nil {
				unix.Close(nfd)
			}
			done <- err == nil
		}()
		select {
		case ok := <-done:
			if !ok {
				return
			}
		case <-time.After(100 * time.Millisecond):
			return // the runtime took it first; our accept waits for the next one
		}
	}
}
