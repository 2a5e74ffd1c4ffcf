// Package testutil holds what the privileged tests share: the root requirement (a skip
// on a developer's machine, a failure in CI) and waiting helpers.
package testutil

import (
	"os"
	"testing"
	"time"
)

// RequireRoot skips a test that needs root, or fails it where privileged tests must run
// (CI=true or LF_REQUIRE_PRIV=1).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" || os.Getenv("LF_REQUIRE_PRIV") == "1" {
		t.Fatal("this test needs root and privileged tests are required here (CI/LF_REQUIRE_PRIV)")
	}
	t.Skip("needs root (namespaces, mounts, cgroups, CRIU)")
}

// Eventually polls cond every 50 ms until it holds or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
