package porcelain

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/exitcode"
)

type createCmd struct {
	Image   string   `arg:"" help:"Image: registry reference, OCI layout dir, docker-save tarball, or a local name."`
	Command []string `arg:"" optional:"" passthrough:"" help:"Command to run as the container's pid 1 (after --)."`
	Name    string   `short:"n" help:"Name for the container."`
	Env     []string `short:"e" help:"Environment variable KEY=VALUE (repeatable)."`
	Hook    string   `help:"Path of a unix socket inside the container on which the workload answers QUIESCE and RESEED (see lazyfork/hook.py); also given to it as $LAZYFORK_HOOK."`
	JSON    bool     `help:"Print the container as JSON."`

	User       string `short:"u" help:"User to run as: uid[:gid] or names from the image's /etc/passwd and /etc/group (default: the image's User, else root)."`
	Memory     string `short:"m" help:"Memory limit of the container and each fork, in bytes with an optional k, m or g suffix (e.g. 512m)."`
	PidsLimit  int64  `name:"pids-limit" help:"Most tasks (threads) the container and each fork may hold."`
	Privileged bool   `help:"Run without confinement: every capability, no seccomp filter, no masked /proc paths, no device list (see docs/security.md)."`
	Net        string `placeholder:"none|bridge|host" help:"Network: none (the default: a network namespace of its own, loopback only; each fork gets its own, so a server's port is free in every fork), bridge (the same plus an address on the LazyFork bridge, LAZYFORK_BRIDGE and LAZYFORK_SUBNET; each fork gets its own address) or host (the host's network). A --join member takes its cluster's."`
	Join       string `help:"Join the network namespace of this running --net none or --net bridge container: the two (and any others that join) are a cluster sharing its loopback and address, forked as one cut with 'lazyfork cluster fork'."`
	NAT        bool   `name:"nat" help:"With --net bridge: masquerade the container's (and its forks') traffic to the host's other networks; off by default, it reaches the host and other bridge containers only."`
}

func (c *createCmd) Run(ctx context.Context, g *Globals) error {
	e, err := g.Engine(ctx)
	if err != nil {
		return err
	}
	mem, err := Limits(c.Memory, c.PidsLimit)
	if err != nil {
		return err
	}
	in, err := e.Create(ctx, client.CreateRequest{Image: c.Image, Name: c.Name, Command: DashDash(c.Command), Env: c.Env, Hook: c.Hook,
		User: c.User, Memory: mem, PidsLimit: c.PidsLimit, Privileged: c.Privileged, Net: c.Net, NAT: c.NAT, Join: c.Join}, os.Stderr)
	if err != nil {
		return err
	}
	return PrintResult(in, in.ID, c.JSON)
}

// Limits checks --memory and --pids-limit and gives the memory limit in bytes.
func Limits(memory string, pidsLimit int64) (int64, error) {
	if pidsLimit < 0 {
		return 0, fmt.Errorf("--pids-limit %d: give a positive number of tasks", pidsLimit)
	}
	return ParseBytes(memory)
}

// ParseBytes reads a --memory value: bytes, or a number with a k, m or g suffix
// (powers of 1024). "" is no limit.
func ParseBytes(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	num, mult := strings.ToLower(s), int64(1)
	for suffix, m := range map[string]int64{"k": 1 << 10, "m": 1 << 20, "g": 1 << 30} {
		if t, ok := strings.CutSuffix(num, suffix); ok {
			num, mult = t, m
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("--memory %q: give a positive size in bytes or with a k, m or g suffix, e.g. 512m", s)
	}
	return n * mult, nil
}

// DashDash drops the "--" that separates a command from lazyfork's own flags.
func DashDash(args []string) []string {
	if len(args) > 0 && args[0] == "--" {
		return args[1:]
	}
	return args
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
	e, err := g.Engine(ctx)
	if err != nil {
		return err
	}
	req := client.ExecRequest{Argv: DashDash(c.Command), Env: c.Env, Cwd: c.Cwd, Timeout: c.Timeout.Seconds()}
	if c.JSON {
		res, err := e.Exec(ctx, c.Container, req)
		if err != nil {
			return err
		}
		return PrintJSON(res)
	}
	code, err := e.ExecStream(ctx, c.Container, req, client.Stdio{Stdin: stdinFor(e), Stdout: os.Stdout, Stderr: os.Stderr})
	return exitCode(code, err)
}

// stdinFor is what an exec reads: this process's stdin, except that a terminal is not
// forwarded to a daemon (a command without --tty would only steal keystrokes).
func stdinFor(e Engine) io.Reader {
	if _, ok := e.(viaDaemon); ok && term.IsTerminal(int(os.Stdin.Fd())) {
		return nil
	}
	return os.Stdin
}

func exitCode(code int, err error) error {
	if err != nil {
		return err
	}
	if code != 0 {
		return ExitError{code}
	}
	return nil
}

type shellCmd struct {
	Container string `arg:"" help:"Name, id or unique id prefix."`
	Shell     string `help:"Shell to run (default: bash if the image has it, else sh)."`
	Term      string `name:"term" env:"TERM" hidden:"" help:"The shell's TERM (this terminal's)."`
}

func (c *shellCmd) Run(ctx context.Context, g *Globals) error {
	e, err := g.Engine(ctx)
	if err != nil {
		return err
	}
	in, err := e.Get(ctx, c.Container)
	if err != nil {
		return err
	}
	fd := int(os.Stdin.Fd())
	if !term.IsTerminal(fd) {
		return fmt.Errorf("shell needs a terminal; use `lazyfork exec %s -- CMD` from scripts", c.Container)
	}
	args := []string{"sh", "-c", "command -v bash >/dev/null && exec bash -i || exec sh -i"}
	if c.Shell != "" {
		args = []string{c.Shell, "-i"}
	}
	req := client.ExecRequest{Argv: args, Env: []string{"TERM=" + c.Term, "PS1=" + in.ID + ":\\w# "}}
	stdio := client.Stdio{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
	// The shell owns this terminal; Ctrl-C belongs to it, not to us.
	signal.Ignore(os.Interrupt)
	if _, ok := e.(viaDaemon); ok {
		// Through the daemon: the shell gets a terminal there, this one goes raw.
		req.TTY = true
		if w, h, err := term.GetSize(fd); err == nil {
			req.Rows, req.Cols = uint16(h), uint16(w)
		}
		old, err := term.MakeRaw(fd)
		if err != nil {
			return err
		}
		defer term.Restore(fd, old)
		stdio.Resize = resizes(ctx, fd)
	}
	return exitCode(e.ExecStream(context.Background(), c.Container, req, stdio))
}

// resizes reports this terminal's size whenever it changes.
func resizes(ctx context.Context, fd int) <-chan [2]uint16 {
	ch := make(chan [2]uint16, 1)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGWINCH)
	go func() {
		defer signal.Stop(sig)
		for {
			select {
			case <-sig:
				if w, h, err := term.GetSize(fd); err == nil {
					select {
					case ch <- [2]uint16{uint16(h), uint16(w)}:
					default:
					}
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

type attachCmd struct {
	Container string `arg:"" help:"Name, id or unique id prefix."`
	NoFollow  bool   `help:"Print the output so far and return."`
}

func (c *attachCmd) Run(ctx context.Context, g *Globals) error {
	e, err := g.Engine(ctx)
	if err != nil {
		return err
	}
	if _, err := e.Get(ctx, c.Container); err != nil {
		return err
	}
	if !c.NoFollow {
		fmt.Fprintf(os.Stderr, "attached to %s; Ctrl-C detaches\n", c.Container)
	}
	return e.Logs(ctx, c.Container, !c.NoFollow, os.Stdout)
}

type freezeCmd struct {
	Containers []string `arg:"" help:"Names, ids or unique id prefixes."`
}

func (c *freezeCmd) Run(ctx context.Context, g *Globals) error {
	return eachContainer(ctx, g, c.Containers, Engine.Freeze)
}

type thawCmd struct {
	Containers []string `arg:"" help:"Names, ids or unique id prefixes."`
}

func (c *thawCmd) Run(ctx context.Context, g *Globals) error {
	return eachContainer(ctx, g, c.Containers, Engine.Thaw)
}

type deleteCmd struct {
	Containers []string `arg:"" help:"Names, ids or unique id prefixes."`
	// Docker's and Podman's `rm -f`: here a running container is always stopped first.
	Force bool `short:"f" help:"Accepted as in docker rm -f: a running container is always stopped first."`
}

func (c *deleteCmd) Run(ctx context.Context, g *Globals) error {
	e, err := g.Engine(ctx)
	if err != nil {
		return err
	}
	// In this process: collect what the containers shared once, after the last of them.
	if svc, ok := e.(interface {
		DeleteAll(ctx context.Context, refs []string, done func(ref string, err error)) error
	}); ok {
		var st failures
		if err := svc.DeleteAll(ctx, c.Containers, st.report); err != nil {
			st.report("", err)
		}
		return st.exit()
	}
	return eachContainerOn(ctx, e, c.Containers, Engine.Delete)
}

// eachContainer runs op for every reference and reports every failure, not just the first.
func eachContainer(ctx context.Context, g *Globals, refs []string, op func(Engine, context.Context, string) error) error {
	e, err := g.Engine(ctx)
	if err != nil {
		return err
	}
	return eachContainerOn(ctx, e, refs, op)
}

func eachContainerOn(ctx context.Context, e Engine, refs []string, op func(Engine, context.Context, string) error) error {
	var st failures
	for _, ref := range refs {
		st.report(ref, op(e, ctx, ref))
	}
	return st.exit()
}

// failures prints each reference done (stdout) or its error (stderr) and keeps the exit
// status: the failures' own (lib/exitcode: 3 not found, 4 invalid state, ...) when they
// agree, else 1.
type failures struct{ status int }

func (f *failures) report(ref string, err error) {
	if err == nil {
		if ref != "" {
			fmt.Println(ref)
		}
		return
	}
	fmt.Fprintf(os.Stderr, "lazyfork: %v\n", err)
	if code := exitcode.Of(err); f.status == exitcode.OK || f.status == code {
		f.status = code
	} else {
		f.status = exitcode.Failed
	}
}

func (f *failures) exit() error {
	if f.status != exitcode.OK {
		return ExitError{f.status}
	}
	return nil
}

type listCmd struct {
	JSON  bool `help:"Print JSON."`
	Quiet bool `short:"q" help:"Print ids only."`
}

func (c *listCmd) Run(ctx context.Context, g *Globals) error {
	e, err := g.Engine(ctx)
	if err != nil {
		return err
	}
	rows, err := e.List(ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return PrintJSON(rows)
	}
	if c.Quiet {
		for _, r := range rows {
			fmt.Println(r.ID)
		}
		return nil
	}
	// Name and parent columns grow with the longest value, as docker ps does.
	nameW, parentW := 6, 8
	parents := make([]string, len(rows))
	for i, r := range rows {
		parents[i] = Dash(r.ParentName)
		if parents[i] == "-" && r.Parent != "" {
			parents[i] = r.Parent
		}
		nameW, parentW = max(nameW, len(r.Name)+2), max(parentW, len(parents[i])+2)
	}
	format := fmt.Sprintf(" %%-12s   %%-%ds %%-8s  %%-%ds %%5v %%8s %%5v   %%-15s %%11s\n", nameW, parentW)
	head := fmt.Sprintf(format, "id", "name", "state", "parent", "depth", "pid", "procs", "network", "memory")
	fmt.Print(head)
	fmt.Println(" " + strings.Repeat("─", len(head)-2))
	var total int64
	for i, r := range rows {
		pid := "-"
		if r.Pid > 0 {
			pid = fmt.Sprint(r.Pid)
		}
		fmt.Printf(format, r.ID, Dash(r.Name), r.State, parents[i], r.Depth, pid, r.Procs, network(r), HumanBytes(r.MemoryBytes))
		total += r.MemoryBytes
	}
	fmt.Printf(" %-*s%11s\n", len(head)-13, fmt.Sprintf("%d total", len(rows)), HumanBytes(total))
	return nil
}

// network is a row's network column: the address in bridge mode, else the mode.
func network(r client.Info) string {
	if r.Address != "" {
		return r.Address
	}
	return Dash(r.Net)
}

func Dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func HumanBytes(b int64) string {
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

func PrintJSONLine(v any) error { return json.NewEncoder(os.Stdout).Encode(v) }

// PrintResult prints an operation's result: the document with --json, else line (an id).
func PrintResult(v any, line string, asJSON bool) error {
	if asJSON {
		return PrintJSON(v)
	}
	fmt.Println(line)
	return nil
}

func PrintJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
