package store

import (
	"os"
	"testing"
)

// TestUpdate: Update replaces a record Put wrote, whole (the new state is read back, no
// temporary file is left beside it), and refuses an id that is not one.
func TestUpdate(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := &Container{ID: "0c0000000001", Name: "f", State: StateCreating}
	if err := s.Put(c); err != nil {
		t.Fatal(err)
	}
	c.State, c.Pid = StateRunning, 4242
	if err := s.Update(c); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateRunning || got.Pid != 4242 || got.Name != "f" {
		t.Errorf("read back %s pid %d name %q, want running 4242 f", got.State, got.Pid, got.Name)
	}
	names, err := os.ReadDir(s.Path(c.ID))
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0].Name() != "container.json" {
		t.Errorf("record directory holds %v, want container.json alone", names)
	}
	if err := s.Update(&Container{ID: "../x"}); err == nil {
		t.Error("Update accepted the id ../x")
	}
}
