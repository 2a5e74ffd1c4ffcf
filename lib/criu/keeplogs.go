package criu

import (
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

var (
	keptLogs    atomic.Int64
	keepLogsDir atomic.Pointer[string]
)

// KeepLogs names a directory into which every dump and restore copies criu's log and
// stats file when it ends (a repeat fork removes its snapshot, and with it the dump's log,
// at once): bench/criu_steps.py breaks them into steps. "" (the default) copies nothing.
// Mains set it once from LAZYFORK_KEEP_CRIU_LOGS (container.Config, applied by Open).
func KeepLogs(dir string) { keepLogsDir.Store(&dir) }

// keepLogs copies log and stats into the KeepLogs directory as
// <pid>-<unix ms>-<n>-<kind>-<name>; failures are ignored (a diagnostic only).
func keepLogs(kind, log, stats string) {
	p := keepLogsDir.Load()
	if p == nil || *p == "" {
		return
	}
	dir := *p
	tag := fmt.Sprintf("%d-%d-%04d-%s", os.Getpid(), time.Now().UnixMilli(), keptLogs.Add(1), kind)
	for _, f := range []string{log, stats} {
		if b, err := os.ReadFile(f); err == nil {
			_ = os.WriteFile(filepath.Join(dir, tag+"-"+filepath.Base(f)), b, 0o600)
		}
	}
}
