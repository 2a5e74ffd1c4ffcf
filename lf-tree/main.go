// Command lf-tree reads and writes LazyFork's on-disk container store: one directory per
// container holding container.json. Every record is printed as one lazyfork.container
// JSON line on stdout.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/lazyfork/lazyfork/lib/cgroup/owned"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/stagecmd"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/treedoc"
)

type cli struct {
	stagecmd.ExplainFlag
	stagecmd.Roots
	Dir string `help:"Container store directory (default: $LAZYFORK_ROOT/containers)." env:"LF_STORE_DIR,LF_TREE_DIR"`
	// Records are checked as every binary checks them: a group directly under the
	// operator's parent is LazyFork's too.
	CgroupParent string `help:"The operator's parent cgroup path: records whose groups sit directly under it are accepted (as under a directory named lazyfork)." env:"LAZYFORK_CGROUP_PARENT"`

	List     listCmd     `cmd:"" help:"Print every record as JSON lines."`
	Get      getCmd      `cmd:"" help:"Print one record (name, id or unique id prefix)."`
	Put      putCmd      `cmd:"" help:"Write a record read from a file or stdin (atomically)."`
	Rm       rmCmd       `cmd:"" help:"Remove a record's directory; prints the record with removed: true."`
	Children childrenCmd `cmd:"" help:"Print the records whose parent is the given container."`
	Trees    treesCmd    `cmd:"" help:"Print every snapshot tree document (tree.json, kind lazyfork.tree) as JSON lines."`
	Tree     treeDocCmd  `cmd:"" name:"tree" help:"Print one snapshot tree document (id, unique id prefix or name)."`
}

// treesCmd prints the snapshot trees' documents as their last operation wrote them
// (lib/treedoc; lazyfork tree nodes measures them live).
type treesCmd struct{}

func (treesCmd) Run() error {
	all, err := treedoc.ReadAll()
	if err != nil {
		return err
	}
	for _, t := range all {
		if err := stagecmd.Print(t); err != nil {
			return err
		}
	}
	return nil
}

type treeDocCmd struct {
	Ref string `arg:""`
}

func (c treeDocCmd) Run() error {
	t, err := treedoc.Read(c.Ref)
	if err != nil {
		return err
	}
	return stagecmd.Print(t)
}

// KindContainer is the document of one record.
const KindContainer = "lazyfork.container"

// record is a container record as printed: the record carries its own version.
type record struct {
	Kind string `json:"kind"`
	*store.Container
	Removed bool `json:"removed,omitempty"`
}

// explain is the store's account of op on recs.
func explain(s *store.Store, op string, recs ...*store.Container) stagecmd.Explainer {
	return stagecmd.ExplainFunc(func(w io.Writer) { s.Explain(w, op, recs) })
}

func printRecord(c *store.Container) error {
	return stagecmd.Print(record{Kind: KindContainer, Container: c})
}

type listCmd struct{}

func (listCmd) Run(s *store.Store, x *stagecmd.ExplainFlag) error {
	all, err := s.List()
	if err != nil {
		return err
	}
	x.Tell(explain(s, "list", all...))
	for _, c := range all {
		if err := printRecord(c); err != nil {
			return err
		}
	}
	return nil
}

type getCmd struct {
	Ref string `arg:""`
}

func (c getCmd) Run(s *store.Store, x *stagecmd.ExplainFlag) error {
	ct, err := s.Resolve(c.Ref)
	if err != nil {
		return err
	}
	x.Tell(explain(s, "get", ct))
	return printRecord(ct)
}

type putCmd struct {
	Record string `arg:"" optional:"" help:"File holding the record (lf-tree get's output); - or nothing: stdin."`
}

func (p putCmd) Run(s *store.Store, x *stagecmd.ExplainFlag) error {
	in, err := stagecmd.Input(p.Record)
	if err != nil {
		return err
	}
	defer in.Close()
	var r struct {
		Kind string `json:"kind"`
		store.Container
	}
	dec := json.NewDecoder(io.LimitReader(in, stagecmd.MaxDocument))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return fmt.Errorf("read record: %w", err)
	}
	if r.Kind != "" && r.Kind != KindContainer {
		return fmt.Errorf("document of kind %q, want %q: pass the output of `lf-tree get`", r.Kind, KindContainer)
	}
	c := r.Container
	// Later commands kill the record's cgroup and remove its directories: only ones
	// LazyFork owns may be written.
	if err := stage.CheckRecord(&c); err != nil {
		return err
	}
	if err := s.Put(&c); err != nil {
		return err
	}
	x.Tell(explain(s, "put", &c))
	return printRecord(&c)
}

type rmCmd struct {
	Ref string `arg:""`
}

func (c rmCmd) Run(s *store.Store, x *stagecmd.ExplainFlag) error {
	ct, err := s.Resolve(c.Ref)
	if err != nil {
		return err
	}
	if err := s.Remove(ct.ID); err != nil {
		return err
	}
	x.Tell(explain(s, "rm", ct))
	return stagecmd.Print(record{Kind: KindContainer, Container: ct, Removed: true})
}

type childrenCmd struct {
	Ref string `arg:""`
}

func (c childrenCmd) Run(s *store.Store, x *stagecmd.ExplainFlag) error {
	ct, err := s.Resolve(c.Ref)
	if err != nil {
		return err
	}
	kids, err := s.Children(ct.ID)
	if err != nil {
		return err
	}
	x.Tell(explain(s, "children", kids...))
	for _, k := range kids {
		if err := printRecord(k); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	var c cli
	kctx := stagecmd.Parse(&c, "lf-tree", "Read and write LazyFork's container store (its records) and snapshot tree documents (JSON lines on stdout).",
		"lf-tree get c1 | lf-dump -\nlf-tree children c1 | jq -r .id\nlf-tree tree t1 | jq '.nodes[] | select(.state == \"suspended\") | .id'")
	owned.SetParent(c.CgroupParent)
	stagecmd.Run("lf-tree", func(ctx context.Context) error {
		dir := c.Dir
		if dir == "" {
			dir = paths.Containers()
		} else {
			// put and rm write and remove below it: only inside the state roots.
			var err error
			if dir, err = paths.InState(dir); err != nil {
				return err
			}
		}
		s, err := store.Open(dir)
		if err != nil {
			return err
		}
		return kctx.Run(s, &c.ExplainFlag)
	})
}
