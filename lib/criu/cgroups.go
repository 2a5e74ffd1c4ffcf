package criu

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/cgroup"
	criucore "github.com/checkpoint-restore/go-criu/v8/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/inventory"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v8/magic"
	"google.golang.org/protobuf/proto"
)

// CheckpointCgroupsFlat reports whether every task of the checkpoint sat in one set of
// cgroups, with no group below it in any hierarchy and no cgroup namespace of the tree's
// own. Such a tree needs nothing from criu's cgroup restore when criu is already in all of
// the tree's new groups before it clones it (RestoreOptions.JoinCgroupAll): the clone
// inherits them. Anything unreadable or unexpected answers false (criu then places the tree
// as usual).
func CheckpointCgroupsFlat(checkpointDir string) bool {
	cg, err := readOne(checkpointDir, "cgroup.img", "CGROUP", &cgroup.CgroupEntry{})
	if err != nil {
		return false
	}
	ce := cg.(*cgroup.CgroupEntry)
	if len(ce.GetSets()) > 1 {
		return false
	}
	for _, s := range ce.GetSets() {
		for _, m := range s.GetCtls() {
			if m.GetCgnsPrefix() != 0 {
				return false
			}
		}
	}
	for _, c := range ce.GetControllers() {
		for _, d := range c.GetDirs() {
			if len(d.GetChildren()) > 0 {
				return false
			}
		}
	}
	// A cgroup namespace of the tree's own shows as an id other than criu's own at the dump.
	inv, err := readOne(checkpointDir, "inventory.img", "INVENTORY", &inventory.InventoryEntry{})
	if err != nil {
		return false
	}
	pst, err := readOne(checkpointDir, "pstree.img", "PSTREE", &pstree.PstreeEntry{})
	if err != nil {
		return false
	}
	ids, err := readOne(checkpointDir, fmt.Sprintf("ids-%d.img", pst.(*pstree.PstreeEntry).GetPid()), "IDS", &criucore.TaskKobjIdsEntry{})
	if err != nil {
		return false
	}
	root := inv.(*inventory.InventoryEntry).GetRootIds()
	return root != nil && root.GetCgroupNsId() == ids.(*criucore.TaskKobjIdsEntry).GetCgroupNsId()
}

// imageMagics is go-criu's table of image magics, built once: LoadMagic fills two maps of
// every magic on each call, and a batch of forks reads a checkpoint's images for each.
// Read-only afterwards.
var imageMagics = sync.OnceValue(magic.LoadMagic)

// readOne decodes the first entry of a checkpoint image (the root task's for pstree.img),
// whose magic must be want. The image is hostile input: its framing is checked against
// the file's size before anything is allocated, and images over 4 MiB are refused.
func readOne(dir, name, want string, entry proto.Message) (proto.Message, error) {
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4<<20+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if len(b) > 4<<20 {
		return nil, fmt.Errorf("read %s: larger than 4 MiB", name)
	}
	magics := imageMagics()
	word := func() (uint64, bool) {
		if len(b) < 4 {
			return 0, false
		}
		v := uint64(binary.LittleEndian.Uint32(b))
		b = b[4:]
		return v, true
	}
	m, ok := word()
	if ok && (m == magics.ByName["IMG_COMMON"] || m == magics.ByName["IMG_SERVICE"]) {
		m, ok = word()
	}
	if !ok || m != magics.ByName[want] {
		return nil, fmt.Errorf("read %s: not a %s image", name, want)
	}
	size, ok := word()
	if !ok || size > uint64(len(b)) {
		return nil, fmt.Errorf("read %s: no whole first entry", name)
	}
	if err := proto.Unmarshal(b[:size], entry); err != nil {
		return nil, fmt.Errorf("decode %s: %w", name, err)
	}
	return entry, nil
}
