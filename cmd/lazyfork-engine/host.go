package main

import (
	"context"
	"fmt"
	"os"

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
		return exitError{Code: 1}
	}
	return nil
}
