// Package hook is the host side of LazyFork's runtime hook: a workload that wants a say
// in when it is forked listens on a unix socket inside its container (`lazyfork create
// --hook PATH`). Before every snapshot the host sends QUIESCE and waits, bounded, for the
// answer; after every restore it sends RESEED <id> to the new fork.
//
// Wire protocol (docs/api.md, "Runtime hook"): one connection per message. The host writes
// one line, `QUIESCE` or `RESEED <id>`; the runtime answers one line, `OK` or
// `ERR <reason>`, and closes the connection. For QUIESCE the host also waits for that close
// before the snapshot, so no connection to the host is inside the checkpoint.
//
// PATH is a path inside the container; the host reaches it through the container's root
// (its overlay mount), resolved with RESOLVE_IN_ROOT so a symlink in the container cannot
// point the host at one of its own sockets.
package hook

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
)

// DefaultTimeout bounds one message: connect, answer and close.
var DefaultTimeout = 5 * time.Second

// EnvVar is set in a container created with a hook, so the runtime inside finds its socket.
const EnvVar = "LAZYFORK_HOOK"

// MaxAnswer bounds the runtime's answer line (`OK` or `ERR <reason>`); a longer one is an
// error, so a workload cannot make the host buffer without end.
const MaxAnswer = 4096

// maxTrailer bounds what the host reads after the answer while it waits for the close.
const maxTrailer = 64 << 10

var (
	// ErrAnswerTooLong: the runtime sent more than MaxAnswer bytes without a newline, or
	// kept writing after its answer instead of closing.
	ErrAnswerTooLong = errors.New("runtime hook answer too long")
	// ErrNoAnswer: nothing listens on the socket, or the runtime did not answer in time.
	ErrNoAnswer = errors.New("runtime hook did not answer")
	// ErrRefused: the runtime answered ERR.
	ErrRefused = errors.New("runtime hook refused")
)

// Options are a caller's choices for the hook messages of one operation.
type Options struct {
	Timeout time.Duration // per message; 0 means DefaultTimeout
	// Force goes ahead (snapshot or fork anyway) when the runtime does not answer in time,
	// instead of failing. A runtime that answers ERR is never overridden.
	Force bool
}

// ValidatePath checks a hook path given to `lazyfork create --hook` (stage.ValidateHookPath:
// records and snapshots carry it, and lib/stage checks them without linking this package).
func ValidatePath(p string) error { return stage.ValidateHookPath(p) }

// Quiesce tells c's runtime that a snapshot is about to be taken and waits for it to be
// ready. A container without a hook returns at once. o.Force turns "no answer in time"
// into a go-ahead.
func Quiesce(ctx context.Context, c *store.Container, o Options) error {
	if c.Hook == "" {
		return nil
	}
	err := Send(ctx, c.RootFS, c.Hook, "QUIESCE", o.Timeout)
	if err != nil && errors.Is(err, ErrNoAnswer) && o.Force {
		// Best effort: if something is left in the backlog, the dump says so.
		_ = drainBacklog(c)
		return nil
	}
	return err
}

// Reseed tells a new fork its id, so it can reseed random generators and reconnect.
func Reseed(ctx context.Context, c *store.Container, o Options) error {
	if c.Hook == "" {
		return nil
	}
	err := Send(ctx, c.RootFS, c.Hook, "RESEED "+c.ID, o.Timeout)
	if err != nil && errors.Is(err, ErrNoAnswer) && o.Force {
		return nil
	}
	return err
}

// Send delivers one message to the hook socket at sockPath inside root and waits for the
// runtime's answer and its close of the connection.
func Send(ctx context.Context, root, sockPath, msg string, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	verb, _, _ := strings.Cut(msg, " ")
	fail := func(err error) error {
		if ctx.Err() != nil || isNoListener(err) {
			return fmt.Errorf("%s to hook %s: %w within %v: %v", verb, sockPath, ErrNoAnswer, timeout, err)
		}
		return fmt.Errorf("%s to hook %s: %w", verb, sockPath, err)
	}
	sock, err := openInRoot(root, sockPath)
	if err != nil {
		return fail(err)
	}
	defer sock.Close()
	// Through an O_PATH fd of the socket itself: short (sun_path is 108 bytes), and
	// resolved inside the container's root with no symlink followed at the end.
	addr := fmt.Sprintf("/proc/self/fd/%d", sock.Fd())
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", addr)
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	if _, err := conn.Write([]byte(msg + "\n")); err != nil {
		return fail(err)
	}
	r := bufio.NewReaderSize(conn, MaxAnswer)
	b, err := r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return fmt.Errorf("%s to hook %s: %w: no newline in the first %d bytes (answer one line, `OK` or `ERR <reason>`)", verb, sockPath, ErrAnswerTooLong, MaxAnswer)
	}
	if err != nil && len(b) == 0 {
		return fail(fmt.Errorf("no answer: %w", err))
	}
	line := strings.TrimSpace(string(b))
	switch {
	case line == "OK" || strings.HasPrefix(line, "OK "):
	case strings.HasPrefix(line, "ERR"):
		return fmt.Errorf("%s to hook %s: %w: %s", verb, sockPath, ErrRefused, strings.TrimSpace(strings.TrimPrefix(line, "ERR")))
	default:
		return fmt.Errorf("%s to hook %s: unexpected answer %q (want OK or ERR <reason>)", verb, sockPath, line)
	}
	// Wait for the runtime to close its end: a connection still open in the container
	// would be part of the checkpoint, with its peer outside. What it sends meanwhile is
	// read and dropped, up to a bound.
	if n, _ := io.Copy(io.Discard, io.LimitReader(r, maxTrailer+1)); n > maxTrailer {
		return fmt.Errorf("%s to hook %s: %w: more than %d bytes after the answer (close the connection after answering)", verb, sockPath, ErrAnswerTooLong, maxTrailer)
	}
	return nil
}

// openInRoot opens the socket file p (a path inside the container) with O_PATH, resolving
// every component as if root were "/" and refusing a symlink or anything but a socket.
func openInRoot(root, p string) (*os.File, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open container root %s: %w", root, err)
	}
	defer unix.Close(rfd)
	fd, err := unix.Openat2(rfd, strings.TrimPrefix(path.Clean(p), "/"), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, fmt.Errorf("open %s in the container: %w", p, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat %s in the container: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		unix.Close(fd)
		return nil, fmt.Errorf("%s in the container is not a unix socket: %w", p, unix.ENOTSOCK)
	}
	return os.NewFile(uintptr(fd), p), nil
}

func isNoListener(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ENOTSOCK) || errors.Is(err, os.ErrDeadlineExceeded)
}

// Flags are the hook options as command-line flags; stages and the porcelain embed them
// in their kong CLI structs.
type Flags struct {
	HookTimeout time.Duration `help:"How long to wait for the runtime hook's answer (QUIESCE before a dump, RESEED after a restore)." default:"0s"`
	HookForce   bool          `help:"Go ahead when the runtime hook does not answer in time."`
}

// Options are the flags as hook options.
func (f Flags) Options() Options { return Options{Timeout: f.HookTimeout, Force: f.HookForce} }
