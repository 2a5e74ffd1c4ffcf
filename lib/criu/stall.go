package criu

import (
	"bufio"
	"context"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// ErrorGrace is how long a restoring criu may run on after its log reports an error before
// it is killed: it then only cleans up, and some failures leave it waiting forever.
var ErrorGrace = 5 * time.Second

// watchErrors follows the criu log at path while ctx lives. Once the log holds an error
// line (not a harmless one) and criu has not ended within grace, the returned context is
// cancelled; stalled reports whether that happened.
func watchErrors(ctx context.Context, path string, grace time.Duration) (context.Context, func() bool) {
	ctx, cancel := context.WithCancel(ctx)
	var fired atomic.Bool
	go func() {
		defer cancel()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		var off int64
		var seen time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if seen.IsZero() {
				var found bool
				off, found = scanErrors(path, off)
				if found {
					seen = time.Now()
				}
			}
			if !seen.IsZero() && time.Since(seen) >= grace {
				fired.Store(true)
				return
			}
		}
	}()
	// The watcher ends with the call: callers cancel ctx's parent (their deadline) on return.
	return ctx, fired.Load
}

// scanErrors reads the log from off and reports whether a complete line from there is a
// criu error ("Error (" in criu's format) that is not harmless; it returns the offset of
// the first unread (incomplete) line.
func scanErrors(path string, off int64) (int64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return off, false
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return off, false
	}
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return off, false // an incomplete line is read again next time
		}
		off += int64(len(line))
		if strings.Contains(line, "Error (") && !harmlessError(line) {
			return off, true
		}
	}
}
