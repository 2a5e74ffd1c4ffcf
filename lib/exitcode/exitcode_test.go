package exitcode_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/lazyfork/lazyfork/lib/exitcode"
)

func TestOf(t *testing.T) {
	missing := exitcode.NewNotFound("no such thing")
	other := exitcode.NewNotFound("no such other thing")
	wrapped := fmt.Errorf("dump c1: %w", missing)
	if got := exitcode.Of(wrapped); got != exitcode.NotFound {
		t.Errorf("wrapped not-found: %d", got)
	}
	if !errors.Is(wrapped, missing) || errors.Is(wrapped, other) {
		t.Error("sentinels must compare by value and only equal themselves")
	}
	if got := exitcode.Of(errors.New("boom")); got != exitcode.Failed {
		t.Errorf("plain error: %d", got)
	}
	if got := exitcode.Of(nil); got != exitcode.OK {
		t.Errorf("nil: %d", got)
	}
}
