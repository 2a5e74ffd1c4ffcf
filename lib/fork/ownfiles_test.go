package fork

import (
	"slices"
	"testing"

	"github.com/lazyfork/lazyfork/lib/stage"
)

// The background collapse opens only the snapshot's own memory files, inside its family
// directory, whatever names its checkpoint's images hold.
func TestOwnFilesKeepsOnlyTheSnapshotsFiles(t *testing.T) {
	m := &stage.Snapshot{ID: "s0123456789ab", FamilyDir: "/dev/shm/lazyfork/families/f1"}
	refs := []string{
		"s0123456789ab-1.mem",
		"s0123456789ab-../../../etc/passwd",
		"s0123456789ab-/x",
		"../s0123456789ab-2.mem",
		"/dev/shm/s0123456789ab-3.mem",
		"s0123456789ac-4.mem", // another snapshot's
		"s0123456789ab",
		"s0123456789ab-..",
		"s0123456789ab-5.mem",
	}
	got := ownFiles(m, refs)
	want := []string{
		"/dev/shm/lazyfork/families/f1/s0123456789ab-1.mem",
		"/dev/shm/lazyfork/families/f1/s0123456789ab-..",
		"/dev/shm/lazyfork/families/f1/s0123456789ab-5.mem",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
