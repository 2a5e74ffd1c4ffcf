// Package priv is the one rule every privileged test follows: a test whose requirement
// is missing skips with the reason on a developer's machine, and fails where privileged
// tests must run (CI=true or LF_REQUIRE_PRIV=1). It imports only the standard library, so
// any package's own tests can use it (lib/testutil cannot be imported by the packages it
// builds on).
package priv

import (
	"os"
	"testing"
)

// Required reports whether privileged tests must run here.
func Required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("LF_REQUIRE_PRIV") == "1"
}

// Miss ends t for a missing requirement: a failure where privileged tests are required,
// else a skip; why names what is missing.
func Miss(t testing.TB, why string) {
	t.Helper()
	if Required() {
		t.Fatalf("privileged test cannot run: %s (privileged tests are required here: CI/LF_REQUIRE_PRIV)", why)
	}
	t.Skipf("skipping: %s", why)
}

// Root requires root; what says what the test needs it for.
func Root(t testing.TB, what string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Miss(t, "needs root: "+what)
	}
}
