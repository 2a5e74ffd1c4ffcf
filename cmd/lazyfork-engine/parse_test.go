package main

import (
	"context"
	"reflect"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/porcelain"
)

// TestOneCommandModelParsesAsTheWholeCLI: a command line parsed with the model of the one
// command it names (parse's fast path) selects the same command with the same globals and
// arguments as with the whole CLI; lines it cannot take (a flag value that looks like a
// command, help, no command) are left to the whole CLI.
func TestOneCommandModelParsesAsTheWholeCLI(t *testing.T) {
	opts := []kong.Option{kong.Name("lazyfork"), kong.Vars{"socket": client.DefaultSocket},
		kong.BindTo(context.Background(), (*context.Context)(nil))}
	for _, args := range [][]string{
		{"fork", "c1", "--name", "x", "--json"},
		{"--trace", "fork", "c1", "-n", "3"},
		{"exec", "c1", "--", "hostname"},
		{"exec", "-e", "A=b", "c1", "--", "sh", "-c", "fork"},
		{"--socket=/tmp/s", "--local", "exec", "c1", "--", "ls"},
		{"rm", "c1", "c2"},
		{"ps", "--json"},
		{"gc"},
		{"tree"},
		{"image", "ls"},
		{"daemon", "status"},
		{"--root", "fork", "exec", "c1", "--", "ls"}, // --root's value is "fork": the command is exec
		{"--socket", "exec", "fork", "c1"},
	} {
		var whole CLI
		p, err := kong.New(&whole, opts...)
		if err != nil {
			t.Fatal(err)
		}
		want, err := p.Parse(args)
		if err != nil {
			t.Fatalf("%q: the whole CLI: %v", args, err)
		}
		one, g := porcelain.OneCommand(reflect.TypeOf(CLI{}), args)
		if one == nil {
			t.Fatalf("%q: no one-command model", args)
		}
		p1, err := kong.New(one, opts...)
		if err != nil {
			t.Fatal(err)
		}
		got, err := p1.Parse(args)
		if err != nil {
			// Only where a flag's value is a command's name, and then the whole CLI parses.
			t.Logf("%q: one-command model refused (%v): the whole CLI parses it", args, err)
			continue
		}
		if got.Command() != want.Command() {
			t.Errorf("%q: command %q, the whole CLI's %q", args, got.Command(), want.Command())
		}
		if !reflect.DeepEqual(*g, whole.Globals) {
			t.Errorf("%q: globals %+v, the whole CLI's %+v", args, *g, whole.Globals)
		}
		cmd := reflect.ValueOf(one).Elem().Field(1).Interface()
		f, _ := reflect.TypeOf(whole).FieldByName(reflect.TypeOf(one).Elem().Field(1).Name)
		if w := reflect.ValueOf(whole).FieldByIndex(f.Index).Interface(); !reflect.DeepEqual(cmd, w) {
			t.Errorf("%q: command values %+v, the whole CLI's %+v", args, cmd, w)
		}
	}
	for _, args := range [][]string{{}, {"--help"}, {"fork", "-h"}, {"--trace"}, {"nosuch"}} {
		if one, _ := porcelain.OneCommand(reflect.TypeOf(CLI{}), args); one != nil {
			t.Errorf("%q: a one-command model, want the whole CLI", args)
		}
	}
}
