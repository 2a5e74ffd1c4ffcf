// Package stagecmd is the contract every stage binary's main shares (docs/stages.md):
// kong parsing whose --help shows a pipeline example and whose usage errors exit 2; one
// way to read input (stdin, or a path argument, "-" for stdin); versioned JSON documents
// on stdout; a context that Ctrl-C and SIGTERM cancel (so a stage undoes half-made work
// instead of dying mid-way); and on error one line on stderr and the exit status
// lib/exitcode gives it; --explain (ExplainFlag) for a human account on stderr of what the
// lib step read, changed and why.
package stagecmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/alecthomas/kong"

	"github.com/lazyfork/lazyfork/lib/exitcode"
	"github.com/lazyfork/lazyfork/lib/paths"
)

// Version is the version of every document the stages print.
const Version = 1

// Header starts every document a stage prints: what it is and which version.
type Header struct {
	Kind    string `json:"kind"`
	Version int    `json:"version"`
}

// H is the header of a version-1 document of kind.
func H(kind string) Header { return Header{Kind: kind, Version: Version} }

// Check refuses a document of another kind or version. A document with neither (printed
// before the stages had a contract) is read as version 1.
func (h Header) Check(kind string) error {
	if h.Kind == "" && h.Version == 0 {
		return nil
	}
	if h.Kind != kind {
		return fmt.Errorf("document of kind %q, want %q: pass the output of the stage that prints %s", h.Kind, kind, kind)
	}
	if h.Version != Version {
		return fmt.Errorf("%s version %d not supported (want %d)", kind, h.Version, Version)
	}
	return nil
}

// exitUsage is kong's status for a parse error.
const kongUsage = 80

// Parse parses the command line into cli. --help shows purpose, the pipeline example and
// the exit statuses; a usage error exits with exitcode.Usage.
func Parse(cli any, name, purpose, example string, opts ...kong.Option) *kong.Context {
	desc := purpose + "\n\nExample:\n\n" + indent(example) + "\n\n" + ExitHelp
	opts = append([]kong.Option{kong.Name(name), kong.Description(desc), kong.Exit(func(code int) {
		if code == kongUsage {
			code = exitcode.Usage
		}
		os.Exit(code)
	})}, opts...)
	kctx := kong.Parse(cli, opts...)
	if r, ok := cli.(interface{ stateRoots() *Roots }); ok {
		paths.Set(r.stateRoots().Root, r.stateRoots().Run)
	}
	return kctx
}

// Roots are the state roots, which every stage embeds in its command line: flags, or
// the operator's environment. This is the one place they are read from it; lib/paths
// gets them by paths.Set.
type Roots struct {
	Root string `name:"root" help:"Persistent state directory." env:"LAZYFORK_ROOT" default:"/var/lib/lazyfork"`
	Run  string `name:"run" help:"State directory on tmpfs (snapshots, memory files)." env:"LAZYFORK_RUN" default:"/dev/shm/lazyfork"`
}

func (r *Roots) stateRoots() *Roots { return r }

// ExitHelp is the exit status table as --help shows it.
const ExitHelp = "Exit status: 0 done, 1 failed, 2 usage, 3 not found, 4 invalid state, 5 busy."

func indent(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		lines[i] = "  " + l
	}
	return strings.Join(lines, "\n")
}

// Run runs fn after checking the state roots (0700, root's, no symlinks: anything else is
// refused) and exits the process with its outcome.
func Run(name string, fn func(ctx context.Context) error) {
	run(name, true, fn)
}

// RunWithoutRoots is Run for a stage that touches nothing under the state roots
// (lf-cgroup).
func RunWithoutRoots(name string, fn func(ctx context.Context) error) {
	run(name, false, fn)
}

func run(name string, roots bool, fn func(ctx context.Context) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if roots {
		err = paths.Ensure()
	}
	if err == nil {
		err = fn(ctx)
	}
	stop()
	Exit(name, err)
}

// Exit prints err on one line of stderr and exits with its status (0 for nil).
func Exit(name string, err error) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s\n", name, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	os.Exit(exitcode.Of(err))
}

// MaxDocument bounds a document read from stdin or a file (real ones are a few KiB).
const MaxDocument = 1 << 20

// Input opens a stage's input: stdin when arg is "" or "-", else the file arg.
func Input(arg string) (io.ReadCloser, error) {
	if arg == "" || arg == "-" {
		return io.NopCloser(os.Stdin), nil
	}
	f, err := os.Open(arg)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("read %s: %w", arg, exitcode.NewNotFound("no such file"))
		}
		return nil, fmt.Errorf("read %s: %w", arg, err)
	}
	return f, nil
}

// ReadDoc decodes one JSON document of kind from arg (Input) into v, whose Header it
// checks. what names the stage whose output is expected, for the error.
func ReadDoc(arg, kind, what string, v interface{ header() *Header }) error {
	in, err := Input(arg)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := json.NewDecoder(io.LimitReader(in, MaxDocument)).Decode(v); err != nil {
		return fmt.Errorf("read %s JSON: %w (pass the output of %s)", kind, err, what)
	}
	return v.header().Check(kind)
}

func (h *Header) header() *Header { return h }

// Explainer is a lib step's result that can tell a human what the step read, what it
// changed and why. The account is written from the facts the step returned, so it says
// what happened, not what a main guesses happened.
type Explainer interface{ Explain(w io.Writer) }

// ExplainFunc makes a function an Explainer (an account that needs the operation's name).
type ExplainFunc func(w io.Writer)

// Explain calls f.
func (f ExplainFunc) Explain(w io.Writer) { f(w) }

// ExplainFlag is the --explain every stage embeds in its command line.
type ExplainFlag struct {
	Explain bool `help:"Also tell on stderr what the stage read, what it changed and why (stdout stays the same)."`
}

// Tell writes e's account on stderr when --explain was given.
func (x *ExplainFlag) Tell(e Explainer) {
	if x != nil && x.Explain && e != nil {
		e.Explain(os.Stderr)
	}
}

// Print writes v as one JSON line on stdout.
func Print(v any) error { return json.NewEncoder(os.Stdout).Encode(v) }
