// Package porcelain is the lazyfork commands that work on containers (create, fork, exec,
// list, ...): their flags, their output and the one implementation of each, run on an
// Engine: the daemon when one serves this state, else the same operations in process.
// It does not link the runtime (CRIU, cgroups, images): the lazyfork command users type
// (cmd/lazyfork) is built from it and starts about as fast as a small Go binary; it hands
// every other command line, and every command that no daemon serves, to lazyfork-engine
// (cmd/lazyfork-engine), which is these commands plus the runtime, the daemon and the
// commands that need them.
package porcelain

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/container/config"
	"github.com/lazyfork/lazyfork/lib/exitcode"
	"github.com/lazyfork/lazyfork/lib/stagecmd"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// Globals are shared by every command; env vars configure them too.
type Globals struct {
	stagecmd.Roots // --root and --run, as every stage takes them
	config.Config
	Socket string `help:"Unix socket of the daemon; commands go through it when a daemon answers there." env:"LAZYFORK_SOCKET" default:"${socket}"`
	Local  bool   `help:"Run in this process even if a daemon is running." env:"LAZYFORK_LOCAL"`
	Trace  bool   `help:"Print on stderr how long each step took, the daemon's steps included." env:"LAZYFORK_TRACE"`
}

// Commands are the container commands, embedded in both binaries' command lines.
type Commands struct {
	Create  createCmd  `cmd:"" help:"Create and start a container from an image."`
	Fork    forkCmd    `cmd:"" help:"Fork a running (or stopped) container into N copies that continue from the same instruction."`
	Cluster clusterCmd `cmd:"" help:"Containers sharing one network namespace (create --join): fork them as one cut."`
	Stop    stopCmd    `cmd:"" help:"Snapshot a container and end its processes; it stays forkable and can be started again."`
	Start   startCmd   `cmd:"" help:"Restart a stopped container from its snapshot."`
	Exec    execCmd    `cmd:"" help:"Run a command inside a container."`
	Shell   shellCmd   `cmd:"" help:"Open an interactive shell inside a container."`
	Attach  attachCmd  `cmd:"" help:"Stream a container's output (Ctrl-C detaches)."`
	Freeze  freezeCmd  `cmd:"" help:"Pause every process of a container."`
	Thaw    thawCmd    `cmd:"" help:"Resume a frozen container."`
	Delete  deleteCmd  `cmd:"" aliases:"rm" help:"Stop a container and remove everything it holds."`
	List    listCmd    `cmd:"" aliases:"ls,ps" help:"List containers."`
	Stats   statsCmd   `cmd:"" help:"Memory, snapshot and timing figures of one container."`
	GC      gcCmd      `cmd:"" name:"gc" help:"Remove memory files, layers and snapshots nothing references any more."`
	Status  statusCmd  `cmd:"" help:"Host facts and container totals."`
}

// Options are kong's options for lazyfork's command line, in both binaries.
func Options(ctx context.Context) []kong.Option {
	return []kong.Option{
		kong.Name("lazyfork"),
		kong.Description("Fork running Linux containers."),
		kong.UsageOnError(),
		kong.Vars{"socket": client.DefaultSocket}, // one copy of the daemon's default
		kong.BindTo(ctx, (*context.Context)(nil)),
		kong.Exit(func(code int) {
			if code == 80 { // kong's status for a usage error: ours is the stages' (lib/exitcode)
				code = exitcode.Usage
			}
			os.Exit(code)
		}),
	}
}

// OneCommand returns a new struct holding the globals and the one command of cli (a
// command-line struct: Globals and commands, Commands embedded or not) that args name
// (the first word that is a command's name or alias), and its globals; nil when args ask
// for help or name no command of cli.
//
// kong builds its model of every command (tags, flags, help text interpolated with
// regexps) before it parses: ~3-4 ms of CPU for the whole CLI, paid by every command. A
// model of one command is much cheaper, and a command line it accepts means the same to
// the whole one: the globals are the same, and the command selected is the first word
// not taken by a flag in both.
func OneCommand(cli reflect.Type, args []string) (any, *Globals) {
	var field *reflect.StructField
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "--help" || strings.HasPrefix(a, "--help=") {
			return nil, nil
		}
		if field == nil && !strings.HasPrefix(a, "-") {
			if f, ok := commandField(cli, a); ok {
				field = &f
			}
		}
	}
	if field == nil {
		return nil, nil
	}
	st := reflect.StructOf([]reflect.StructField{
		{Name: "Globals", Type: reflect.TypeOf(Globals{}), Tag: `embed:""`},
		{Name: field.Name, Type: field.Type, Tag: field.Tag},
	})
	v := reflect.New(st)
	return v.Interface(), v.Elem().Field(0).Addr().Interface().(*Globals)
}

// commandField is t's command field named word (by kong's rules: the name tag, else the
// lower-cased field name, which is kong's for the one-word names used here; or an alias),
// looking into embedded structs (Commands).
func commandField(t reflect.Type, word string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			if g, ok := commandField(f.Type, word); ok {
				return g, true
			}
			continue
		}
		if _, ok := f.Tag.Lookup("cmd"); !ok {
			continue
		}
		name := f.Tag.Get("name")
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		if word == name || slices.Contains(strings.Split(f.Tag.Get("aliases"), ","), word) {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// Run runs the parsed command and exits as the stages do on an error. rec times the
// steps from the start of main (printed with --trace); parsed is when parsing began.
func Run(ctx context.Context, kctx *kong.Context, g *Globals, rec *trace.Recorder, parsed time.Time) {
	if g.Trace {
		ctx := trace.With(ctx, rec)
		trace.Add(ctx, "parse the command line", parsed, time.Since(parsed))
		kctx.BindTo(ctx, (*context.Context)(nil))
	}
	err := kctx.Run(g)
	if g.Trace {
		rec.Write(os.Stderr)
	}
	if err != nil {
		var ee ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.Code)
		}
		fmt.Fprintf(os.Stderr, "lazyfork: %v\n", err)
		os.Exit(exitcode.Of(err)) // the stages' statuses: 3 not found, 4 invalid state, ...
	}
}

// ExitError carries a child's exit code through without printing anything.
type ExitError struct{ Code int }

func (e ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }
