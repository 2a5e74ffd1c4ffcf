package main

import (
	"context"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/alecthomas/kong"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/exitcode"
)

// parse parses args with kong. kong builds its model of every command (tags, flags, help
// text interpolated with regexps) before it parses: ~3-4 ms of CPU for this CLI, paid by
// every command, and twice by a fork followed by an exec. So a command line that names a
// command is parsed first with a model of that command alone (and the globals); when that
// fails, or asks for help, it is parsed again with the whole CLI, which reports the error or
// prints the help as ever. A command line the one-command model accepts means the same to
// the whole one: the globals are the same, and the command selected is the first word not
// taken by a flag in both.
func parse(ctx context.Context, args []string) (*kong.Context, *Globals) {
	opts := []kong.Option{
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
	if one, g := oneCommand(args); one != nil {
		if p, err := kong.New(one, opts...); err == nil {
			if kctx, err := p.Parse(args); err == nil {
				return kctx, g
			}
		}
	}
	var cli CLI
	return kong.Parse(&cli, opts...), &cli.Globals
}

// oneCommand returns a new struct holding the globals and the one command that args name
// (the first word that is a command's name or alias), and its globals; nil when args ask
// for help or name no command.
func oneCommand(args []string) (any, *Globals) {
	t := reflect.TypeOf(CLI{})
	var field *reflect.StructField
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "--help" || strings.HasPrefix(a, "--help=") {
			return nil, nil
		}
		if field == nil && !strings.HasPrefix(a, "-") {
			if f, ok := commandField(t, a); ok {
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

// commandField is CLI's command field named word (by kong's rules: the name tag, else the
// lower-cased field name, which is kong's for the one-word names used here; or an alias).
func commandField(t reflect.Type, word string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
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
