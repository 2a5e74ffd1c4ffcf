package porcelain

import (
	"context"
	"fmt"
	"time"
)

type statusCmd struct {
	JSON bool `help:"Print JSON."`
}

func (c *statusCmd) Run(ctx context.Context, g *Globals) error {
	e, err := g.Engine(ctx)
	if err != nil {
		return err
	}
	s, err := e.Status(ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return PrintJSON(s)
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
		s.Containers, s.Running, s.Frozen, s.Stopped, s.Exited, HumanBytes(s.Memory))
	if d := s.Daemon; d != nil {
		fmt.Printf("daemon: pid %d on %s, up %s (version %s)\n", d.Pid, d.Socket, time.Since(d.Started).Round(time.Second), d.Version)
	} else {
		fmt.Println("daemon: not running (commands run in-process)")
	}
	return nil
}
