package store

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/resolve"
)

// TestResolve: a whole id (read directly, without listing the store), a name, a unique id
// prefix, an ambiguous prefix and an unknown reference, in a store of a few records.
func TestResolve(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	recs := []*Container{
		{ID: "0a0000000001", Name: "alpha", Created: time.Unix(1, 0)},
		{ID: "0a0000000002", Name: "beta", Created: time.Unix(2, 0)},
		{ID: "0b0000000003", Created: time.Unix(3, 0)},
	}
	for _, c := range recs {
		if err := s.Put(c); err != nil {
			t.Fatal(err)
		}
	}
	for ref, want := range map[string]string{
		"0a0000000002": "0a0000000002", "alpha": "0a0000000001", "0b": "0b0000000003", "0a0000000001": "0a0000000001",
	} {
		c, err := s.Resolve(ref)
		if err != nil || c.ID != want {
			t.Errorf("Resolve(%q) = %v, %v; want %s", ref, c, err, want)
		}
	}
	if _, err := s.Resolve("0a"); !errors.Is(err, resolve.ErrAmbiguous) || err.Error() != `ambiguous container reference "0a" matches 0a0000000001, 0a0000000002: give more of the id` {
		t.Errorf("Resolve(0a): %v, want ambiguous", err)
	}
	for _, ref := range []string{"0c0000000000", "gamma", "0c", ""} {
		if _, err := s.Resolve(ref); !errors.Is(err, ErrNotFound) {
			t.Errorf("Resolve(%q): %v, want not found", ref, err)
		}
	}
	// A whole id whose record is unreadable is not found, as when listing skips it.
	if err := s.Put(&Container{ID: "0d0000000004"}); err != nil {
		t.Fatal(err)
	}
	if err := writeFile(s.Path("0d0000000004")+"/container.json", "{"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve("0d0000000004"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Resolve of an unreadable record: %v, want not found", err)
	}
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o600) }
