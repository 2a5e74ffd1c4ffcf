package testutil

import (
	"context"
	"os"
	"testing"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/snaptree"
	"github.com/lazyfork/lazyfork/lib/store"
)

// PruneAtEnd prunes snapshot tree tr from its root when the test ends, if it is still
// there (the runtime's own cleanup then finds nothing of it left).
func PruneAtEnd(t testing.TB, m *snaptree.Manager, tr *snaptree.Tree) {
	t.Cleanup(func() {
		if _, err := os.Stat(tr.Dir()); err == nil {
			if _, _, err := m.Prune(context.Background(), tr.ID, tr.Root); err != nil {
				t.Errorf("cleanup prune of tree %s: %v", tr.ID, err)
			}
		}
	})
}

// MustGet reads container id's record, failing the test if it cannot.
func MustGet(t testing.TB, rt *container.Runtime, id string) *store.Container {
	t.Helper()
	c, err := rt.Containers.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
