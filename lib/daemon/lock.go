package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/tree"
)

// lock resolves ref and takes the container's own lock: an flock on its directory in the
// tree, so operations that change a container (fork, stop, start, delete, freeze, thaw)
// run one at a time per container, across clients, the daemon and porcelain run without
// it. Waiting ends with ctx. The record is read again once the lock is held: it may have
// changed (or gone) while we waited.
func (s *Service) lock(ctx context.Context, ref string) (*tree.Container, func(), error) {
	c, err := s.RT.Tree.Resolve(ref)
	if err != nil {
		return nil, nil, err
	}
	f, err := os.Open(s.RT.Tree.Path(c.ID))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("%w %q (deleted meanwhile)", tree.ErrNotFound, ref)
		}
		return nil, nil, fmt.Errorf("lock %s: %w", c.ID, err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, nil, fmt.Errorf("lock %s: %w", c.ID, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, nil, fmt.Errorf("wait for %s (busy with another operation): %w", ref, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	unlock := func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }
	fresh, err := s.RT.Tree.Get(c.ID)
	if err != nil {
		unlock()
		return nil, nil, fmt.Errorf("%w %q (deleted meanwhile)", tree.ErrNotFound, ref)
	}
	return fresh, unlock, nil
}
