package criu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// With a KeepLogs directory set (LAZYFORK_KEEP_CRIU_LOGS), a call's log and stats are copied there under names
// that say which call they belong to; a missing file is skipped; unset, nothing is copied.
func TestKeepLogs(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	log := filepath.Join(src, "dump.log")
	if err := os.WriteFile(log, []byte("(00.000001) Dumping finished successfully\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { KeepLogs("") })
	KeepLogs("")
	keepLogs("dump", log, filepath.Join(src, "stats-dump"))
	if names, _ := os.ReadDir(dst); len(names) != 0 {
		t.Fatalf("unset: %d files copied", len(names))
	}
	KeepLogs(dst)
	keepLogs("dump", log, filepath.Join(src, "stats-dump")) // no stats file
	names, _ := os.ReadDir(dst)
	if len(names) != 1 || !strings.HasSuffix(names[0].Name(), "-dump-dump.log") {
		t.Fatalf("kept %v, want one *-dump-dump.log", names)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, names[0].Name())); !strings.Contains(string(b), "finished successfully") {
		t.Errorf("kept log holds %q", b)
	}
}
