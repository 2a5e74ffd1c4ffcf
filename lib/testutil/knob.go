package testutil

import (
	"os"
	"strings"
	"testing"
)

// SetKnob writes v to a kernel setting file (sysfs, procfs) and puts the old value back
// when the test ends.
func SetKnob(t testing.TB, path, v string) {
	t.Helper()
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("kernel setting %s: %v", path, err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(path, old, 0o644); err != nil {
			t.Errorf("restore %s to %s: %v", path, strings.TrimSpace(string(old)), err)
		}
	})
	if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
		t.Fatalf("set %s to %s: %v", path, v, err)
	}
}
