package resolve

import (
	"errors"
	"strings"
	"testing"

	"github.com/lazyfork/lazyfork/lib/exitcode"
)

type item struct{ id, name string }

func key(i item) (string, string) { return i.id, i.name }

// A name or whole id wins over prefixes, a prefix must be unique and long enough, and an
// ambiguous one is a usage error naming every id it matches.
func TestFind(t *testing.T) {
	items := []item{{"ab01", "web"}, {"ab02", "ab"}, {"cd03", ""}}
	for ref, want := range map[string]string{"web": "ab01", "ab02": "ab02", "ab": "ab02", "cd": "cd03", "ab01": "ab01"} {
		got, found, err := Find(items, ref, "thing", 2, key)
		if err != nil || !found || got.id != want {
			t.Errorf("Find(%q) = %v, %v, %v; want %s", ref, got, found, err, want)
		}
	}
	for _, ref := range []string{"", "c", "zz", "ab0x"} {
		if got, found, err := Find(items, ref, "thing", 2, key); found || err != nil {
			t.Errorf("Find(%q) = %v, %v, %v; want nothing", ref, got, found, err)
		}
	}
	_, found, err := Find(items, "ab0", "thing", 2, key)
	if found || !errors.Is(err, ErrAmbiguous) || exitcode.Of(err) != exitcode.Usage ||
		err.Error() != `ambiguous thing reference "ab0" matches ab01, ab02: give more of the id` {
		t.Errorf("Find(ab0) = %v, %v", found, err)
	}
}

// NewID draws ids of the asked shape until one is free.
func TestNewID(t *testing.T) {
	seen := 0
	id := NewID("t", func(id string) bool { seen++; return seen < 3 })
	if seen != 3 || len(id) != 13 || id[0] != 't' || strings.Trim(id[1:], "0123456789abcdef") != "" {
		t.Errorf("NewID = %q after %d draws", id, seen)
	}
	if id := NewID("", nil); len(id) != 12 {
		t.Errorf("NewID(\"\", nil) = %q", id)
	}
}
