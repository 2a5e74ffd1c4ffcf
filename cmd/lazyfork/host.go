package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/lazyfork/lazyfork/lib/doctor"
)

type doctorCmd struct {
	JSON bool `help:"Print JSON."`
}

func (c *doctorCmd) Run(ctx context.Context, g *Globals) error {
	checks := doctor.Run(ctx, g.Run, g.CRIU)
	if c.JSON {
		if err := printJSON(checks); err != nil {
			return err
		}
	}
	failed := 0
	for _, ch := range checks {
		if !ch.OK {
			failed++
		}
		if c.JSON {
			continue
		}
		mark := "ok  "
		switch {
		case !ch.OK:
			mark = "FAIL"
		case ch.Advisory:
			mark = "note"
		}
		fmt.Printf("%s %-12s %s\n", mark, ch.Name, ch.Detail)
		if ch.Fix != "" {
			fmt.Printf("     %-12s fix: %s\n", "", ch.Fix)
		}
	}
	if failed > 0 {
		fmt.Fprintf(os.Stderr, "lazyfork doctor: %d requirement(s) missing\n", failed)
		return exitError{1}
	}
	return nil
}

type statusCmd struct {
	JSON bool `help:"Print JSON."`
}

func (c *statusCmd) Run(ctx context.Context, g *Globals) error {
	e, err := g.engine(ctx)
	if err != nil {
		return err
	}
	s, err := e.Status(ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(s)
	}
	for _, ch := range s.Host {
		ok := "ok"
		if !ch.OK {
			ok = "MISSING (" + ch.Fix + ")"
		}
		fmt.Printf("%-12s %s  %s\n", ch.Name, ch.Detail, ok)
	}
	fmt.Printf("\nstate: %s (persistent), %s (tmpfs)\n", s.Root, s.Run)
	fmt.Printf("containers: %d (%d running, %d frozen, %d stopped, %d exited), memory %s\n",
		s.Containers, s.Running, s.Frozen, s.Stopped, s.Exited, humanBytes(s.Memory))
	if d := s.Daemon; d != nil {
		fmt.Printf("daemon: pid %d on %s, up %s (version %s)\n", d.Pid, d.Socket, time.Since(d.Started).Round(time.Second), d.Version)
	} else {
		fmt.Println("daemon: not running (commands run in-process)")
	}
	return nil
}
