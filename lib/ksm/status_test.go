package ksm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadStatus(t *testing.T) {
	dir := t.TempDir()
	if s, err := readDir(dir); err != nil || s.Available {
		t.Fatalf("no run file: %+v %v, want unavailable", s, err)
	}
	for name, v := range map[string]string{"run": "1\n", "pages_shared": "7\n", "pages_sharing": "300\n", "pages_unshared": "2\n",
		"full_scans": "4\n", "pages_to_scan": "100\n", "sleep_millisecs": "20\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := readDir(dir)
	if err != nil || s != (Status{Available: true, Run: 1, PagesShared: 7, PagesSharing: 300, PagesUnshared: 2, FullScans: 4, PagesToScan: 100, SleepMillis: 20}) {
		t.Fatalf("%+v %v", s, err)
	}
	if d, fix := s.Summary(); !strings.Contains(d, "running: 300 pages sharing 7") || fix != "" {
		t.Fatalf("summary %q fix %q", d, fix)
	}
	s.Run = 0
	if d, fix := s.Summary(); !strings.Contains(d, "stopped") || !strings.Contains(fix, "same-tenant") {
		t.Fatalf("summary %q fix %q", d, fix)
	}
	if err := os.WriteFile(filepath.Join(dir, "pages_sharing"), []byte("lots"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readDir(dir); err == nil || !strings.Contains(err.Error(), "pages_sharing") {
		t.Fatalf("garbage counter: %v", err)
	}
}
