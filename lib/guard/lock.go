package guard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/exitcode"
	"github.com/lazyfork/lazyfork/lib/store"
)

// DefaultWait bounds how long Lock waits for another operation on the same container
// (a fork of many copies, a stop) when the caller gives no wait of its own.
const DefaultWait = 5 * time.Minute

// ErrBusy: the container stayed locked by another operation past the wait.
var ErrBusy = exitcode.Kind{Msg: "container busy with another operation", Code: exitcode.Busy}

// Lock resolves ref and takes the container's own lock: an flock on its directory in the
// store, so operations that change a container run one at a time per container, across
// processes (daemon, porcelain, stage binaries). It waits at most wait (0: DefaultWait)
// and never past ctx. The record is read again once the lock is held: it may have changed
// (or gone) while we waited. The lock is not re-entrant: a process holding it must not
// call Lock again for the same container.
func Lock(ctx context.Context, s *store.Store, ref string, wait time.Duration) (*store.Container, func(), error) {
	c, err := s.Resolve(ref)
	if err != nil {
		return nil, nil, err
	}
	f, err := os.Open(s.Path(c.ID))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("%w %q (deleted meanwhile)", store.ErrNotFound, ref)
		}
		return nil, nil, fmt.Errorf("lock %s: %w", c.ID, err)
	}
	if wait <= 0 {
		wait = DefaultWait
	}
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, nil, fmt.Errorf("lock %s: %w", c.ID, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, nil, fmt.Errorf("%s: %w for more than %v; retry when it is done", ref, ErrBusy, wait)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, nil, fmt.Errorf("wait for %s (busy with another operation): %w", ref, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	unlock := func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }
	fresh, err := s.Get(c.ID)
	if err != nil {
		unlock()
		return nil, nil, fmt.Errorf("%w %q (deleted meanwhile)", store.ErrNotFound, ref)
	}
	return fresh, unlock, nil
}
