package porcelain

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// Engine is what the container commands run on: the daemon when one answers on the
// socket and serves the same state directories, otherwise the very same operations in
// process (LocalEngine: lib/daemon.Service over lib/container and lib/fork).
type Engine interface {
	Create(ctx context.Context, req client.CreateRequest, progress io.Writer) (*client.Info, error)
	Fork(ctx context.Context, ref string, req client.ForkRequest, onFork func(client.Fork)) (*client.ForkResult, error)
	ClusterFork(ctx context.Context, ref string, req client.ClusterForkRequest) (*client.ClusterFork, error)
	Stop(ctx context.Context, ref string, req client.StopRequest) (*client.Info, error)
	Start(ctx context.Context, ref string) (*client.Info, error)
	Delete(ctx context.Context, ref string) error
	Freeze(ctx context.Context, ref string) error
	Thaw(ctx context.Context, ref string) error
	Exec(ctx context.Context, ref string, req client.ExecRequest) (*client.ExecResult, error)
	ExecStream(ctx context.Context, ref string, req client.ExecRequest, stdio client.Stdio) (int, error)
	Logs(ctx context.Context, ref string, follow bool, w io.Writer) error
	Get(ctx context.Context, ref string) (*client.Info, error)
	List(ctx context.Context) ([]client.Info, error)
	Tree(ctx context.Context) ([]client.TreeNode, error)
	Stats(ctx context.Context, ref string) (*client.Stats, error)
	Status(ctx context.Context) (*client.Status, error)
	GC(ctx context.Context) error
	Clean(ctx context.Context) ([]string, error)
}

// viaDaemon is the daemon behind the Engine interface.
type viaDaemon struct{ *client.Client }

// Create cannot show pull progress remotely; the daemon pulls.
func (r viaDaemon) Create(ctx context.Context, req client.CreateRequest, _ io.Writer) (*client.Info, error) {
	return r.Client.Create(ctx, req)
}

var _ Engine = viaDaemon{}

// LocalEngine opens the engine that runs a command in this process when no daemon serves its
// state: lib/daemon's Service over the runtime in cmd/lazyfork-engine; in cmd/lazyfork, which
// does not link the runtime, a handover of the whole command line to lazyfork-engine.
var LocalEngine func(ctx context.Context, g *Globals) (Engine, error)

// Engine returns the daemon if one answers for this state, else the local engine.
func (g *Globals) Engine(ctx context.Context) (Engine, error) {
	if cl := g.Daemon(ctx); cl != nil {
		return viaDaemon{cl}, nil
	}
	return LocalEngine(ctx, g)
}

// daemon returns a client if a daemon answers on the socket and serves the same root
// and tmpfs directories as this command would use (a test's private state never goes
// to the machine's daemon).
func (g *Globals) Daemon(ctx context.Context) *client.Client {
	if g.Local {
		return nil
	}
	if _, err := os.Stat(g.Socket); err != nil {
		return nil
	}
	cl := client.New(g.Socket)
	ctx, end := trace.Start(ctx, "find the daemon")
	defer end()
	// What its lock file says, when that is sure: no round trip.
	if root, run, ok := client.Running(g.Socket); ok {
		if !sameDir(root, g.Root) || !sameDir(run, g.Run) {
			return nil
		}
		return cl
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	info, err := cl.Ping(pctx)
	if err != nil || info == nil || !sameDir(info.Root, g.Root) || !sameDir(info.Run, g.Run) {
		return nil
	}
	return cl
}

func sameDir(a, b string) bool {
	if a == b {
		return true
	}
	ra, err1 := filepath.EvalSymlinks(a)
	rb, err2 := filepath.EvalSymlinks(b)
	return err1 == nil && err2 == nil && ra == rb
}
