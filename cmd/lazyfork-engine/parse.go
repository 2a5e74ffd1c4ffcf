package main

import (
	"context"
	"reflect"

	"github.com/alecthomas/kong"

	"github.com/lazyfork/lazyfork/lib/porcelain"
)

// parse parses args with kong: first with a model of the one command they name (and the
// globals; porcelain.OneCommand); when that fails, or asks for help, with the whole CLI,
// which reports the error or prints the help as ever.
func parse(ctx context.Context, args []string) (*kong.Context, *Globals) {
	opts := porcelain.Options(ctx)
	if one, g := porcelain.OneCommand(reflect.TypeOf(CLI{}), args); one != nil {
		if p, err := kong.New(one, opts...); err == nil {
			if kctx, err := p.Parse(args); err == nil {
				return kctx, g
			}
		}
	}
	var cli CLI
	return kong.Parse(&cli, opts...), &cli.Globals
}
