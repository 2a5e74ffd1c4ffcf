package fork

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
)

// PrepareOptions tune Prepare.
type PrepareOptions struct {
	Force      bool // see Options.Force
	SmallPages bool // see DumpOptions.SmallPages
	KSM        bool // see Options.KSM: a ksm tree's keyframes
}

// Prepare writes a keyframe of running c now: c is dumped, its memory moved into memory
// files and c moved onto them (Swap), exactly as its first fork would, but no fork is
// made and the snapshot is kept (no owner: GC keeps it while c exists). Forks restored
// from the returned snapshot start from c's state at this instant, and c itself maps the
// same files, so its later dumps hold only what it changed since. Called again it writes
// a new generation (its files are a delta over the family's): old generations' files
// stay while anything maps them. If c cannot be frozen for the swap (a stopped task), c
// keeps running on its own memory and the snapshot is still a valid keyframe for forks.
func Prepare(ctx context.Context, rt *container.Runtime, c *store.Container, o PrepareOptions) (*stage.Snapshot, error) {
	defer busy()()
	if err := needKSM(o.KSM, "prepare "+c.Display(), "create the tree without ksm"); err != nil {
		return nil, err
	}
	svc, stop := serviceForSwap(ctx, rt, nil)
	defer stop()
	ready := newSwapReady(svc)
	s, err := Dump(ctx, rt, c, DumpOptions{Force: o.Force, Swap: true, SmallPages: o.SmallPages, ready: ready})
	if err != nil {
		return nil, err
	}
	m, err := Memfile(ctx, s, MemfileOptions{Force: o.Force, KSM: o.KSM})
	if err != nil {
		if s.Swap {
			ready.abort()
			err = errors.Join(err, undoSwapDump(c, s))
		}
		_ = RemoveSnapshot(s)
		_ = Collect(rt)
		return nil, err
	}
	if m.Swap {
		t := time.Now()
		endOld, err := swap(ctx, rt, c, m, svc, ready.take())
		if err != nil {
			_ = RemoveSnapshot(m)
			_ = Collect(rt)
			return nil, err
		}
		defer sweepZeroPages(ctx, m)()
		collapseLater(m)
		// Ended before the snapshot loses its owner below (until then GC would finish it).
		endOld()
		m.SwapMs = stage.Ms(time.Since(t))
	}
	m.Owner = 0
	if err := Save(m); err != nil {
		return nil, fmt.Errorf("prepare %s: %w", c.Display(), err)
	}
	return m, nil
}
