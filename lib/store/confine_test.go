package store

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/lazyfork/lazyfork/lib/confine"
)

// TestConfineRecordCompatible: a record written before confinement existed has no
// "confine", "memory" or "pids_limit" and reads as what it runs with (privileged, root,
// no limits); a confined record keeps its profile through a write and a read.
func TestConfineRecordCompatible(t *testing.T) {
	old := `{"version":1,"id":"0123456789ab","image":"x","command":["sh"],"hostname":"h","depth":0,
		"created":"2026-11-30T06:50:40Z","lower":[],"upper":"/u","work":"/w","rootfs":"/r","mem_dir":"/m",
		"cgroup":{"memory":"/a","pids":"/a","freezer":"/a"},"pid":0,"start_time":0,"state":"stopped"}`
	var c Container
	if err := json.Unmarshal([]byte(old), &c); err != nil {
		t.Fatal(err)
	}
	if c.Confine != nil || c.Memory != 0 || c.PidsLimit != 0 {
		t.Fatalf("old record read as confine %v memory %d pids %d", c.Confine, c.Memory, c.PidsLimit)
	}
	if p := c.ConfineProfile(); !p.Privileged || p.UID != 0 {
		t.Fatalf("old record's profile %+v, want privileged root", p)
	}
	p := confine.Default()
	p.UID, p.GID, p.Groups, p.User = 1000, 1000, []uint32{27}, "alice"
	c.Confine, c.Memory, c.PidsLimit = &p, 1<<30, 99
	b, err := json.Marshal(&c)
	if err != nil {
		t.Fatal(err)
	}
	var back Container
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.ConfineProfile(), p) || back.Memory != 1<<30 || back.PidsLimit != 99 {
		t.Fatalf("round trip: %+v %d %d, want %+v", back.ConfineProfile(), back.Memory, back.PidsLimit, p)
	}
}
