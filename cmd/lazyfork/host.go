package main

import (
	"context"
	"fmt"
	"os"

	"github.com/lazyfork/lazyfork/lib/doctor"
	"github.com/lazyfork/lazyfork/lib/tree"
)

type doctorCmd struct {
	JSON bool `help:"Print JSON."`
}

func (c *doctorCmd) Run(ctx context.Context, g *Globals) error {
	checks := doctor.Run(ctx, g.Run)
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
		if !ch.OK {
			mark = "FAIL"
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

type status struct {
	Host       []doctor.Check `json:"host"`
	Containers int            `json:"containers"`
	Running    int            `json:"running"`
	Frozen     int            `json:"frozen"`
	Stopped    int            `json:"stopped"`
	Exited     int            `json:"exited"`
	Memory     int64          `json:"memory_bytes"`
	Root       string         `json:"root"`
	Run        string         `json:"run"`
}

func (c *statusCmd) Run(ctx context.Context, g *Globals) error {
	rt, err := g.open()
	if err != nil {
		return err
	}
	rows, err := rt.List()
	if err != nil {
		return err
	}
	s := status{Host: doctor.Run(ctx, g.Run), Containers: len(rows), Root: g.Root, Run: g.Run}
	for _, r := range rows {
		s.Memory += r.MemoryBytes
		switch r.State {
		case tree.StateRunning:
			s.Running++
		case tree.StateFrozen:
			s.Frozen++
		case tree.StateStopped:
			s.Stopped++
		default:
			s.Exited++
		}
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
	return nil
}
