package fork

import (
	"context"
	"os"

	"github.com/lazyfork/lazyfork/lib/snapshot"
)

// The snapshot store, the state lock and the rewrite step live in lib/snapshot (so the
// stages that only read or rewrite images link none of the pipeline's CRIU, cgroup and
// runtime code); these names keep the pipeline's code and its callers as they were.
type MemfileOptions = snapshot.MemfileOptions

var (
	ErrStateBusy    = snapshot.ErrStateBusy
	Save            = snapshot.Save
	LoadSnapshot    = snapshot.LoadSnapshot
	Snapshots       = snapshot.Snapshots
	RemoveSnapshot  = snapshot.RemoveSnapshot
	ReadSnapshotArg = snapshot.ReadSnapshotArg
	Memfile         = snapshot.Memfile
	MakeFamilyDir   = snapshot.MakeFamilyDir
	LockState       = snapshot.LockState

	newSnapshotID  = snapshot.NewID
	lockShared     = snapshot.LockShared
	scanSnapshots  = snapshot.Scan
	allocatedPages = snapshot.AllocatedPages
)

const removingPrefix = snapshot.RemovingPrefix

// lockSharedHeld is lockShared with the locked file, for criu to hold as well (see
// criu.DumpOptions.Hold).
func lockSharedHeld(ctx context.Context) (func(), *os.File, error) {
	return snapshot.LockStateFile(ctx, false, 0)
}
