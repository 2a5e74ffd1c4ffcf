// Command lf-tree reads and writes LazyFork's on-disk container tree: one directory per
// container holding container.json. Output is JSON on stdout.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/alecthomas/kong"

	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/tree"
)

type cli struct {
	Dir string `help:"Tree directory." env:"LF_TREE_DIR"`

	List     listCmd     `cmd:"" help:"Print every record as JSON lines."`
	Get      getCmd      `cmd:"" help:"Print one record (name, id or unique id prefix)."`
	Put      putCmd      `cmd:"" help:"Write a record read from stdin (atomically)."`
	Rm       rmCmd       `cmd:"" help:"Remove a record's directory."`
	Children childrenCmd `cmd:"" help:"Print the records whose parent is the given container."`
}

type listCmd struct{}

func (listCmd) Run(s *tree.Store) error {
	all, err := s.List()
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	for _, c := range all {
		if err := enc.Encode(c); err != nil {
			return err
		}
	}
	return nil
}

type getCmd struct {
	Ref string `arg:""`
}

func (c getCmd) Run(s *tree.Store) error {
	ct, err := s.Resolve(c.Ref)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(ct)
}

type putCmd struct{}

func (putCmd) Run(s *tree.Store) error {
	var c tree.Container
	dec := json.NewDecoder(io.LimitReader(os.Stdin, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return fmt.Errorf("read record from stdin: %w", err)
	}
	// Later commands kill the record's cgroup and remove its directories: only ones
	// LazyFork owns may be written.
	if err := stage.CheckRecord(&c); err != nil {
		return err
	}
	if err := s.Put(&c); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(c)
}

type rmCmd struct {
	Ref string `arg:""`
}

func (c rmCmd) Run(s *tree.Store) error {
	ct, err := s.Resolve(c.Ref)
	if err != nil {
		return err
	}
	if err := s.Remove(ct.ID); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]string{"removed": ct.ID})
}

type childrenCmd struct {
	Ref string `arg:""`
}

func (c childrenCmd) Run(s *tree.Store) error {
	ct, err := s.Resolve(c.Ref)
	if err != nil {
		return err
	}
	kids, err := s.Children(ct.ID)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	for _, k := range kids {
		if err := enc.Encode(k); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	var c cli
	ctx := kong.Parse(&c, kong.Name("lf-tree"), kong.Description("Read and write LazyFork's container tree."))
	dir := c.Dir
	err := paths.Ensure() // the state roots are root's, 0700, no symlinks: or refuse
	if err == nil && dir == "" {
		dir = paths.Containers()
	} else if err == nil {
		// put and rm write and remove below it: only inside the state roots.
		dir, err = paths.InState(dir)
	}
	var s *tree.Store
	if err == nil {
		s, err = tree.Open(dir)
	}
	if err == nil {
		err = ctx.Run(s)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "lf-tree: %v\n", err)
		os.Exit(1)
	}
}
