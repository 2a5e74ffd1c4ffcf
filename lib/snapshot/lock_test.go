package snapshot

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lazyfork/lazyfork/lib/paths"
)

// A process killed inside the first write of a snapshot's record (after renameio made its
// temporary file, before the rename) leaves a directory holding only that file. Scan must
// hand it to GC as a leftover: before, GC refused the whole state ("no snapshot.json ...
// remove that snapshot by hand"), as a SIGKILL of `lazyfork fork` mid-swap showed on the
// v2 guest. Anything else in a directory without its record stays an error.
func TestScanNeverWrittenRecordIsLeftover(t *testing.T) {
	paths.Set(t.TempDir(), t.TempDir())
	t.Cleanup(func() { paths.Set("", "") })
	mk := func(name string, files ...string) string {
		dir := filepath.Join(paths.Snapshots(), name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			p := filepath.Join(dir, f)
			if strings.HasSuffix(f, "/") {
				if err := os.MkdirAll(p, 0o700); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	empty := mk("s000000000001")
	killed := mk("s000000000002", ".snapshot.json5577006791947779410", ".snapshot.json8674665223082153551")
	_, left, err := Scan()
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	for _, d := range []string{empty, killed} {
		if !slices.Contains(left, d) {
			t.Errorf("%s not a leftover (%v)", d, left)
		}
	}
	for name, files := range map[string][]string{
		"s000000000003": {".snapshot.json123", "images/"},   // a dump's images: not only the temp file
		"s000000000004": {".snapshot.jsonx1"},               // not renameio's name
		"s000000000005": {"pages-1.img"},                    // a checkpoint without its record
		"s000000000006": {".snapshot.json42", "stray.json"}, // anything else (then a symlink)
	} {
		dir := mk(name, files...)
		// A symlink under the temporary file's name (planted to steer GC's removal) is
		// no temporary file.
		if name == "s000000000006" {
			if err := os.Symlink("/etc", filepath.Join(dir, ".snapshot.json7")); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(filepath.Join(dir, "stray.json")); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, err := Scan(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%v in a snapshot directory: scan error %v, want one naming %s", files, err, name)
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
}
