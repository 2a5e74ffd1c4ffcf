package porcelain

import (
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/term"

	"github.com/lazyfork/lazyfork/lib/client"
)

type forkCmd struct {
	Container string   `arg:"" help:"Name, id or unique id prefix of the container to fork."`
	N         int      `short:"n" default:"1" help:"How many forks."`
	Name      []string `help:"Name for a fork (repeat for several)."`
	Force     bool     `help:"Fork even if the workload uses an allocator that relies on MADV_DONTNEED zero-fill."`
	Share     bool     `help:"Move the source onto the snapshot by ending and restoring it (the behaviour before the swap; if its restore fails it stays stopped)."`
	Copy      bool     `help:"Leave the source on its own memory and copy its files for the forks (by default the first fork moves the source onto the snapshot: later forks then dump only what it changed)."`
	HugePages *bool    `negatable:"" help:"Put each dense 2 MiB stretch of the heap in one huge page: each working fork costs ~0.4 MB less (256 MiB heap). A running container's first fork does it by default, before the freeze, while fresh huge pages come fast (on a VM whose balloon hands free memory back to the host they may not: then 4 KiB pages; --huge-pages makes them however slowly); with --copy (and later snapshots) only when asked, as it slows the rewrite. --no-huge-pages keeps 4 KiB pages everywhere."`
	hookFlags
	JSON bool `help:"Print one JSON line per fork."`
}

// hookFlags choose what happens when a container's runtime hook does not answer.
type hookFlags struct {
	HookTimeout time.Duration `help:"How long the runtime hook may take to answer QUIESCE or RESEED (default 5s)."`
	HookForce   bool          `help:"Snapshot anyway when the runtime hook does not answer in time (default: fail)."`
}

func (h hookFlags) options() client.HookOptions {
	return client.HookOptions{HookTimeout: h.HookTimeout.Seconds(), HookForce: h.HookForce}
}

func (c *forkCmd) Run(ctx context.Context, g *Globals) error {
	e, err := g.Engine(ctx)
	if err != nil {
		return err
	}
	n := max(c.N, len(c.Name))
	var done atomic.Int32
	bar := term.IsTerminal(int(os.Stderr.Fd())) && n > 1
	var onFork func(client.Fork)
	if bar {
		onFork = func(f client.Fork) {
			d := int(done.Add(1))
			w := 30 * d / n
			fmt.Fprintf(os.Stderr, "\rforking %s [%s%s] %d/%d", c.Container, strings.Repeat("█", w), strings.Repeat(" ", 30-w), d, n)
		}
	}
	res, err := e.Fork(ctx, c.Container, client.ForkRequest{N: n, Names: c.Name, Force: c.Force, Share: c.Share, Copy: c.Copy, HugePages: c.HugePages, HookOptions: c.hookFlags.options()}, onFork)
	if bar {
		fmt.Fprintln(os.Stderr)
	}
	if err != nil {
		return err
	}
	for _, f := range res.Forks {
		if c.JSON {
			if err := PrintJSONLine(f); err != nil {
				return err
			}
			continue
		}
		fmt.Println(f.ID)
	}
	return nil
}

type stopCmd struct {
	Containers []string `arg:"" help:"Names, ids or unique id prefixes."`
	hookFlags
}

func (c *stopCmd) Run(ctx context.Context, g *Globals) error {
	return eachContainer(ctx, g, c.Containers, func(e Engine, ctx context.Context, ref string) error {
		_, err := e.Stop(ctx, ref, client.StopRequest{HookOptions: c.hookFlags.options()})
		return err
	})
}

type startCmd struct {
	Containers []string `arg:"" help:"Names, ids or unique id prefixes."`
}

func (c *startCmd) Run(ctx context.Context, g *Globals) error {
	return eachContainer(ctx, g, c.Containers, func(e Engine, ctx context.Context, ref string) error {
		_, err := e.Start(ctx, ref)
		return err
	})
}

type statsCmd struct {
	Container string `arg:"" help:"Name, id or unique id prefix."`
	CSV       bool   `help:"Print one CSV row (with a header)."`
	JSON      bool   `help:"Print JSON."`
}

func (c *statsCmd) Run(ctx context.Context, g *Globals) error {
	e, err := g.Engine(ctx)
	if err != nil {
		return err
	}
	st, err := e.Stats(ctx, c.Container)
	if err != nil {
		return err
	}
	switch {
	case c.JSON:
		return PrintJSON(st)
	case c.CSV:
		w := csv.NewWriter(os.Stdout)
		keys := []string{"dump_ms", "frozen_ms", "memfile_ms", "restore_ms"}
		head := []string{"id", "name", "state", "parent", "depth", "pid", "procs", "memory_bytes", "rss_bytes", "cache_bytes", "kmem_bytes", "mapped_file_bytes", "family", "family_bytes"}
		row := []string{st.ID, st.Name, st.State, st.Parent, strconv.Itoa(st.Depth), strconv.Itoa(st.Pid), strconv.Itoa(st.Procs),
			fmt.Sprint(st.MemoryBytes), fmt.Sprint(st.Rss), fmt.Sprint(st.Cache), fmt.Sprint(st.Kmem), fmt.Sprint(st.MappedFile), st.Family, fmt.Sprint(st.FamilyBytes)}
		for _, k := range keys {
			head = append(head, k)
			row = append(row, strconv.FormatFloat(st.Timings[k], 'f', 1, 64))
		}
		_ = w.Write(head)
		_ = w.Write(row)
		w.Flush()
		return w.Error()
	}
	fmt.Printf("%s  %s  %s  depth %d  pid %d  procs %d\n", st.ID, Dash(st.Name), st.State, st.Depth, st.Pid, st.Procs)
	fmt.Printf("memory (cgroup)   %s  (rss %s, cache %s, kmem %s; mapped from files %s)\n",
		HumanBytes(st.MemoryBytes), HumanBytes(int64(st.Rss)), HumanBytes(int64(st.Cache)), HumanBytes(int64(st.Kmem)), HumanBytes(int64(st.MappedFile)))
	if st.Address != "" {
		nat := ""
		if st.NAT {
			nat = ", masqueraded (--nat)"
		}
		fmt.Printf("network           bridge: %s on %s%s\n", st.Address, st.Bridge, nat)
	} else if st.Net != "" {
		fmt.Printf("network           %s\n", st.Net)
	}
	if st.Family != "" {
		fmt.Printf("family memory     %s in %s (shared by the family, on tmpfs)\n", HumanBytes(st.FamilyBytes), st.Family)
	}
	for _, k := range []string{"dump_ms", "frozen_ms", "memfile_ms", "restore_ms"} {
		if v, ok := st.Timings[k]; ok {
			fmt.Printf("%-17s %.1f ms\n", strings.TrimSuffix(k, "_ms"), v)
		}
	}
	if st.Snapshot != nil && st.Snapshot.Memfile != nil {
		fmt.Printf("snapshot          %s: %d pages in checkpoint, %d in memory files, %d files\n", st.Snapshot.ID,
			st.Snapshot.Memfile.PagesKept, st.Snapshot.Memfile.PagesMoved, st.Snapshot.Memfile.Files)
	}
	return nil
}

type gcCmd struct{}

func (gcCmd) Run(ctx context.Context, g *Globals) error {
	e, err := g.Engine(ctx)
	if err != nil {
		return err
	}
	return e.GC(ctx)
}
