package porcelain

import (
	"context"
	"fmt"
	"os"

	"github.com/lazyfork/lazyfork/lib/client"
)

type clusterCmd struct {
	Fork clusterForkCmd `cmd:"" help:"Fork every member of a container's cluster as one coordinated cut: all frozen at once, dumped, thawed together; each fork gets one namespace with every member inside, their connections to each other continuing."`
}

type clusterForkCmd struct {
	Container string `arg:"" help:"Any member of the cluster (name, id or unique id prefix)."`
	N         int    `short:"n" default:"1" help:"How many forks of the whole cluster."`
	Force     bool   `help:"Fork even if a member maps an allocator that relies on MADV_DONTNEED zero-fill."`
	JSON      bool   `help:"Print the result as JSON."`
}

func (c *clusterForkCmd) Run(ctx context.Context, g *Globals) error {
	e, err := g.Engine(ctx)
	if err != nil {
		return err
	}
	res, err := e.ClusterFork(ctx, c.Container, client.ClusterForkRequest{N: c.N, Force: c.Force})
	if err != nil {
		return err
	}
	if c.JSON {
		return PrintJSON(res)
	}
	for _, m := range res.Members {
		fmt.Fprintf(os.Stderr, "member %s %s: paused %.0f ms by the cut (criu froze it %.0f ms)\n", m.ID, Dash(m.Name), m.PauseMs, m.FrozenMs)
	}
	for i, l := range res.Leaders {
		fmt.Print(l)
		for _, m := range res.Members[1:] {
			fmt.Print(" ", m.Forks[i].ID)
		}
		fmt.Println()
	}
	return nil
}
