// Package resolve resolves what a user types to name a container or a snapshot tree: its name,
// its whole id, or a unique prefix of its id. The container store and the tree documents
// share the rule and the error for a prefix that names several, and make their ids (and
// snapshots theirs) the same way.
package resolve

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/lazyfork/lazyfork/lib/exitcode"
)

// ErrAmbiguous is wrapped by Find's error for a prefix of several ids (exit status 2: give
// more of the id).
var ErrAmbiguous = exitcode.Kind{Msg: "ambiguous", Code: exitcode.Usage}

// NewID is a fresh id: prefix and 12 random hex digits, drawn again while taken says the
// id is in use (nil: never).
func NewID(prefix string, taken func(id string) bool) string {
	for {
		var b [6]byte
		_, _ = rand.Read(b[:])
		id := prefix + hex.EncodeToString(b[:])
		if taken == nil || !taken(id) {
			return id
		}
	}
}

// Find returns the item ref names among items: the first whose name or id is ref, else the
// only one whose id starts with ref (a prefix of at least minPrefix characters). found is
// false when none does; what ("container", "tree") names the kind in the ambiguity error.
func Find[T any](items []T, ref, what string, minPrefix int, key func(T) (id, name string)) (item T, found bool, err error) {
	if ref == "" {
		return item, false, nil
	}
	var hits []int
	for i, it := range items {
		id, name := key(it)
		if id == ref || name == ref {
			return it, true, nil
		}
		if len(ref) >= minPrefix && strings.HasPrefix(id, ref) {
			hits = append(hits, i)
		}
	}
	switch len(hits) {
	case 0:
		return item, false, nil
	case 1:
		return items[hits[0]], true, nil
	}
	ids := make([]string, len(hits))
	for i, h := range hits {
		ids[i], _ = key(items[h])
	}
	return item, false, fmt.Errorf("%w %s reference %q matches %s: give more of the id", ErrAmbiguous, what, ref, strings.Join(ids, ", "))
}
