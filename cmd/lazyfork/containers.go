package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/runtime"
)

type createCmd struct {
	Image   string   `arg:"" help:"Image: registry reference, OCI layout dir, docker-save tarball, or a local name."`
	Command []string `arg:"" optional:"" passthrough:"" help:"Command to run as the container's pid 1 (after --)."`
	Name    string   `short:"n" help:"Name for the container."`
	Env     []string `short:"e" help:"Environment variable KEY=VALUE (repeatable)."`
	Hook    string   `help:"Path of a unix socket inside the container that the runtime hook listens on."`
	JSON    bool     `help:"Print the container record as JSON."`
}

func (c *createCmd) Run(ctx context.Context, g *Globals) error {
	rt, err := g.open()
	if err != nil {
		return err
	}
	cmd := c.Command
	if len(cmd) > 0 && cmd[0] == "--" {
		cmd = cmd[1:]
	}
	ct, err := rt.Create(ctx, runtime.CreateOptions{Image: c.Image, Name: c.Name, Command: cmd, Env: c.Env, Hook: c.Hook, Progress: os.Stderr})
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(ct)
	}
	fmt.Println(ct.ID)
	return nil
}

type execCmd struct {
	Container string        `arg:"" help:"Name, id or unique id prefix."`
	Command   []string      `arg:"" passthrough:"" help:"Command and arguments (after --)."`
	Env       []string      `short:"e" help:"Extra environment variable KEY=VALUE."`
	Cwd       string        `short:"w" help:"Working directory inside the container."`
	Timeout   time.Duration `help:"Kill the command after this long (0: no limit)."`
	JSON      bool          `help:"Capture output; print {stdout, stderr, exit_code} as JSON."`
}

func (c *execCmd) Run(ctx context.Context, g *Globals) error {
	rt, err := g.open()
	if err != nil {
		return err
	}
	ct, err := rt.Tree.Resolve(c.Container)
	if err != nil {
		return err
	}
	args := c.Command
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	o := runtime.ExecOptions{Args: args, Env: c.Env, Cwd: c.Cwd, Timeout: c.Timeout}
	if !c.JSON {
		o.Stdin, o.Stdout, o.Stderr = os.Stdin, os.Stdout, os.Stderr
	}
	res, err := rt.Exec(ctx, ct, o)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(res)
	}
	if res.ExitCode != 0 {
		return exitError{res.ExitCode}
	}
	return nil
}

type shellCmd struct {
	Container string `arg:"" help:"Name, id or unique id prefix."`
	Shell     string `help:"Shell to run (default: bash if the image has it, else sh)."`
}

func (c *shellCmd) Run(ctx context.Context, g *Globals) error {
	rt, err := g.open()
	if err != nil {
		return err
	}
	ct, err := rt.Tree.Resolve(c.Container)
	if err != nil {
		return err
	}
	if !term.IsTerminal(int(os.Stdin.Fd())) {
		return fmt.Errorf("shell needs a terminal; use `lazyfork exec %s -- CMD` from scripts", c.Container)
	}
	// The shell shares this terminal; Ctrl-C belongs to it, not to us.
	signal.Ignore(os.Interrupt)
	args := []string{"sh", "-c", "command -v bash >/dev/null && exec bash -i || exec sh -i"}
	if c.Shell != "" {
		args = []string{c.Shell, "-i"}
	}
	res, err := rt.Exec(context.Background(), ct, runtime.ExecOptions{
		Args: args, Env: []string{"TERM=" + os.Getenv("TERM"), "PS1=" + ct.Hostname + ":\\w# "},
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
	})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return exitError{res.ExitCode}
	}
	return nil
}

type attachCmd struct {
	Container string `arg:"" help:"Name, id or unique id prefix."`
	NoFollow  bool   `help:"Print the output so far and return."`
}

func (c *attachCmd) Run(ctx context.Context, g *Globals) error {
	rt, err := g.open()
	if err != nil {
		return err
	}
	ct, err := rt.Tree.Resolve(c.Container)
	if err != nil {
		return err
	}
	f, err := os.Open(runtime.LogPath(ct))
	if err != nil {
		return fmt.Errorf("attach %s: %w", c.Container, err)
	}
	defer f.Close()
	if !c.NoFollow {
		fmt.Fprintf(os.Stderr, "attached to %s; Ctrl-C detaches\n", c.Container)
	}
	for {
		if _, err := io.Copy(os.Stdout, f); err != nil {
			return err
		}
		if c.NoFollow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

type freezeCmd struct {
	Containers []string `arg:"" help:"Names, ids or unique id prefixes."`
}

func (c *freezeCmd) Run(g *Globals) error {
	return eachContainer(g, c.Containers, func(rt *runtime.Runtime, ref string) error {
		ct, err := rt.Tree.Resolve(ref)
		if err != nil {
			return err
		}
		return rt.Freeze(ct)
	})
}

type thawCmd struct {
	Containers []string `arg:"" help:"Names, ids or unique id prefixes."`
}

func (c *thawCmd) Run(g *Globals) error {
	return eachContainer(g, c.Containers, func(rt *runtime.Runtime, ref string) error {
		ct, err := rt.Tree.Resolve(ref)
		if err != nil {
			return err
		}
		return rt.Thaw(ct)
	})
}

type deleteCmd struct {
	Containers []string `arg:"" help:"Names, ids or unique id prefixes."`
}

func (c *deleteCmd) Run(g *Globals) error {
	return eachContainer(g, c.Containers, func(rt *runtime.Runtime, ref string) error {
		ct, err := rt.Tree.Resolve(ref)
		if err != nil {
			return err
		}
		if err := rt.Delete(ct); err != nil {
			return err
		}
		return fork.GC(rt)
	})
}

// eachContainer runs fn for every reference and reports every failure, not just the first.
func eachContainer(g *Globals, refs []string, fn func(*runtime.Runtime, string) error) error {
	rt, err := g.open()
	if err != nil {
		return err
	}
	var failed []string
	for _, ref := range refs {
		if err := fn(rt, ref); err != nil {
			fmt.Fprintf(os.Stderr, "lazyfork: %v\n", err)
			failed = append(failed, ref)
			continue
		}
		fmt.Println(ref)
	}
	if len(failed) > 0 {
		return exitError{1}
	}
	return nil
}

type listCmd struct {
	JSON  bool `help:"Print JSON."`
	Quiet bool `short:"q" help:"Print ids only."`
}

func (c *listCmd) Run(g *Globals) error {
	rt, err := g.open()
	if err != nil {
		return err
	}
	rows, err := rt.List()
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(rows)
	}
	if c.Quiet {
		for _, r := range rows {
			fmt.Println(r.ID)
		}
		return nil
	}
	fmt.Printf(" %-12s   %-12s %-8s  %-12s %5s %8s %5s %11s\n", "id", "name", "state", "parent", "depth", "pid", "procs", "memory")
	fmt.Println(" " + strings.Repeat("─", 84))
	var total int64
	for _, r := range rows {
		parent := dash(r.ParentName)
		if parent == "-" && r.Parent != "" {
			parent = r.Parent
		}
		pid := "-"
		if r.Pid > 0 {
			pid = fmt.Sprint(r.Pid)
		}
		fmt.Printf(" %-12s   %-12s %-8s  %-12s %5d %8s %5d %11s\n", r.ID, dash(r.Name), r.State, parent, r.Depth, pid, r.Procs, humanBytes(r.MemoryBytes))
		total += r.MemoryBytes
	}
	fmt.Printf(" %d total%71s\n", len(rows), humanBytes(total))
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func humanBytes(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f kB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

func printJSONLine(v any) error { return json.NewEncoder(os.Stdout).Encode(v) }

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
