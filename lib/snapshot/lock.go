package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/stage"
)

// ErrStateBusy: GC gave up waiting for the state lock.
var ErrStateBusy = errors.New("a dump, memfile or restore is in progress")

// StateLockPath is the file whose flock orders GC against the pipeline: dumps, rewrites
// and restores hold it shared while they create snapshots, layers and family files that
// no record references yet; GC holds it exclusively while it decides what is garbage.
func StateLockPath() string { return filepath.Join(paths.Run(), "state.lock") }

// LockState takes the state lock, shared (the pipeline) or exclusive (GC). It waits while
// ctx lasts and, when wait > 0, at most wait; unlock releases it.
func LockState(ctx context.Context, exclusive bool, wait time.Duration) (unlock func(), err error) {
	unlock, _, err = LockStateFile(ctx, exclusive, wait)
	return unlock, err
}

// LockStateFile is LockState that also returns the locked file: a child given a copy of
// it (criu, see criu.DumpOptions.Hold) keeps the lock until it exits too. unlock only
// closes this process's descriptor (an explicit LOCK_UN would release the child's too).
func LockStateFile(ctx context.Context, exclusive bool, wait time.Duration) (unlock func(), f *os.File, err error) {
	if err := os.MkdirAll(paths.Run(), 0o700); err != nil {
		return nil, nil, fmt.Errorf("lock state: %w", err)
	}
	f, err = os.OpenFile(StateLockPath(), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("lock state: %w", err)
	}
	how, kind := unix.LOCK_SH, "shared"
	if exclusive {
		how, kind = unix.LOCK_EX, "exclusive"
	}
	var deadline <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		deadline = t.C
	}
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, nil, fmt.Errorf("lock state %s: %w", StateLockPath(), err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, nil, fmt.Errorf("wait for the %s state lock %s: %w", kind, StateLockPath(), ctx.Err())
		case <-deadline:
			f.Close()
			return nil, nil, fmt.Errorf("%w (it holds %s for %v and more); run gc again when it ends", ErrStateBusy, StateLockPath(), wait)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// LockShared is what Dump, Memfile and Restore take for their whole run.
func LockShared(ctx context.Context) (func(), error) { return LockState(ctx, false, 0) }

// Scan lists every snapshot strictly (see Snapshots) and what a killed command
// left: directories renamed aside for removal, and empty snapshot directories (a dump
// killed between making the directory and writing its record; dumps hold the state lock
// until the record is written, so under GC's exclusive lock an empty one is garbage).
func Scan() (snaps []*stage.Snapshot, leftovers []string, err error) {
	ents, err := os.ReadDir(paths.Snapshots())
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("list snapshots: %w", err)
	}
	for _, e := range ents {
		dir := filepath.Join(paths.Snapshots(), e.Name())
		if strings.HasPrefix(e.Name(), RemovingPrefix) {
			leftovers = append(leftovers, dir)
			continue
		}
		if sub, err := os.ReadDir(dir); err == nil && e.IsDir() && neverWritten(sub) {
			leftovers = append(leftovers, dir)
			continue
		}
		s, err := LoadSnapshot(dir)
		if err != nil {
			return nil, nil, fmt.Errorf("read snapshot %s: %w", e.Name(), err)
		}
		snaps = append(snaps, s)
	}
	sort.Slice(snaps, func(i, j int) bool { return snaps[i].Created.Before(snaps[j].Created) })
	return snaps, leftovers, nil
}

// neverWritten reports whether a snapshot directory's entries show that its record was
// never written: nothing at all, or only the temporary files of snapshot.json's first
// atomic write (renameio names them ".snapshot.json<digits>"), which a process killed
// before the rename leaves. The record is written before anything it references, so such
// a directory holds nothing else; any other entry keeps it a snapshot (or an error).
func neverWritten(entries []os.DirEntry) bool {
	for _, e := range entries {
		digits, ok := strings.CutPrefix(e.Name(), ".snapshot.json")
		if !ok || digits == "" || !e.Type().IsRegular() || strings.Trim(digits, "0123456789") != "" {
			return false
		}
	}
	return true
}
