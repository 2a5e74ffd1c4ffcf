package criu

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/cgroup"
	criucore "github.com/checkpoint-restore/go-criu/v8/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/inventory"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v8/magic"
	"google.golang.org/protobuf/proto"
)

// writeImage writes msg as the one entry of a criu image named name, framed as criu frames
// it (inventory.img has no common magic before its own).
func writeImage(t *testing.T, dir, name, kind string, msg proto.Message) {
	t.Helper()
	m := magic.LoadMagic()
	var b []byte
	if kind != "INVENTORY" {
		b = binary.LittleEndian.AppendUint32(b, uint32(m.ByName["IMG_COMMON"]))
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(m.ByName[kind]))
	payload, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	if err := os.WriteFile(filepath.Join(dir, name), append(b, payload...), 0o600); err != nil {
		t.Fatal(err)
	}
}

// flatCheckpoint writes the images CheckpointCgroupsFlat reads for a one-task tree whose
// cgroup set is sets (ids 2, 3, ...), with the root task's cgroup namespace cgns (criu's
// own: 7).
func flatCheckpoint(t *testing.T, sets int, children bool, cgns uint32, prefix uint32) string {
	t.Helper()
	dir := t.TempDir()
	ce := &cgroup.CgroupEntry{}
	for i := 0; i < sets; i++ {
		ce.Sets = append(ce.Sets, &cgroup.CgSetEntry{Id: proto.Uint32(uint32(2 + i)), Ctls: []*cgroup.CgMemberEntry{
			{Name: proto.String("memory"), Path: proto.String("/lazyfork/abc"), CgnsPrefix: proto.Uint32(prefix)},
			{Name: proto.String("cpu"), Path: proto.String("/")},
		}})
	}
	dirEntry := &cgroup.CgroupDirEntry{DirName: proto.String("lazyfork/abc")}
	if children {
		dirEntry.Children = []*cgroup.CgroupDirEntry{{DirName: proto.String("sub")}}
	}
	ce.Controllers = []*cgroup.CgControllerEntry{{Cnames: []string{"memory"}, Dirs: []*cgroup.CgroupDirEntry{dirEntry}}}
	writeImage(t, dir, "cgroup.img", "CGROUP", ce)
	writeImage(t, dir, "inventory.img", "INVENTORY", &inventory.InventoryEntry{ImgVersion: proto.Uint32(2),
		RootIds: &criucore.TaskKobjIdsEntry{VmId: proto.Uint32(1), FilesId: proto.Uint32(1), FsId: proto.Uint32(1),
			SighandId: proto.Uint32(1), CgroupNsId: proto.Uint32(7)}})
	writeImage(t, dir, "pstree.img", "PSTREE", &pstree.PstreeEntry{Pid: proto.Uint32(1), Ppid: proto.Uint32(0),
		Pgid: proto.Uint32(1), Sid: proto.Uint32(1)})
	writeImage(t, dir, "ids-1.img", "IDS", &criucore.TaskKobjIdsEntry{VmId: proto.Uint32(2), FilesId: proto.Uint32(2),
		FsId: proto.Uint32(2), SighandId: proto.Uint32(2), CgroupNsId: proto.Uint32(cgns)})
	return dir
}

func TestCheckpointCgroupsFlat(t *testing.T) {
	for _, c := range []struct {
		name     string
		dir      string
		wantFlat bool
	}{
		{"one set, no subgroups, criu's cgroup namespace", flatCheckpoint(t, 1, false, 7, 0), true},
		{"no set at all", flatCheckpoint(t, 0, false, 7, 0), true},
		{"two sets (tasks in different groups)", flatCheckpoint(t, 2, false, 7, 0), false},
		{"a group below the tree's", flatCheckpoint(t, 1, true, 7, 0), false},
		{"a cgroup namespace of its own", flatCheckpoint(t, 1, false, 9, 0), false},
		{"a cgroup namespace prefix", flatCheckpoint(t, 1, false, 7, 12), false},
	} {
		if got := CheckpointCgroupsFlat(c.dir); got != c.wantFlat {
			t.Errorf("%s: flat = %v, want %v", c.name, got, c.wantFlat)
		}
	}
}

// A forged or damaged image never reads as flat, and never makes the reader allocate what
// its size fields claim.
func TestCheckpointCgroupsFlatRefusesForgedImages(t *testing.T) {
	forge := func(name string, mutate func(b []byte) []byte) string {
		dir := flatCheckpoint(t, 1, false, 7, 0)
		p := filepath.Join(dir, name)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, mutate(b), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	cases := map[string]string{
		"missing cgroup.img": func() string {
			dir := flatCheckpoint(t, 1, false, 7, 0)
			os.Remove(filepath.Join(dir, "cgroup.img"))
			return dir
		}(),
		"entry size beyond the file": forge("cgroup.img", func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[8:], 0xfffffff0)
			return b
		}),
		"cut in the middle": forge("cgroup.img", func(b []byte) []byte { return b[:len(b)-3] }),
		"wrong magic":       forge("cgroup.img", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[4:], 1); return b }),
		"empty ids image":   forge("ids-1.img", func(b []byte) []byte { return nil }),
		"over 4 MiB":        forge("pstree.img", func(b []byte) []byte { return append(b, make([]byte, 4<<20)...) }),
		"garbage payload": forge("inventory.img", func(b []byte) []byte {
			for i := 8; i < len(b); i++ {
				b[i] = 0xff
			}
			return b
		}),
	}
	for name, dir := range cases {
		if CheckpointCgroupsFlat(dir) {
			t.Errorf("%s: read as flat", name)
		}
	}
}
