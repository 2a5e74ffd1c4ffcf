package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/daemon"
)

type daemonCmd struct {
	Run    daemonRunCmd    `cmd:"" help:"Serve the API on the socket in the foreground (as root)."`
	Start  daemonStartCmd  `cmd:"" help:"Start the daemon in the background and wait until it answers."`
	Status daemonStatusCmd `cmd:"" help:"Say whether a daemon answers on the socket (exit 1 if none)."`
	Stop   daemonStopCmd   `cmd:"" help:"Stop the daemon; containers keep running."`
	Clean  daemonCleanCmd  `cmd:"" help:"Delete every stopped or exited container."`
}

// groupFlag names who may use the daemon besides root (every request's peer credentials
// are checked; see docs/api.md, "Who may connect").
type groupFlag struct {
	Group string `default:"lazyfork" env:"LAZYFORK_GROUP" help:"Group whose members may use the daemon besides root, if it exists (membership amounts to root: containers run as root); 'none' for root only."`
}

type daemonRunCmd struct {
	groupFlag
}

func (c *daemonRunCmd) Run(ctx context.Context, g *Globals) error {
	rt, err := open(g)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	return daemon.Run(ctx, rt, daemon.Config{Socket: g.Socket, Log: log, Group: c.Group})
}

type daemonStartCmd struct {
	groupFlag
	Wait time.Duration `default:"30s" help:"How long to wait for the daemon to answer."`
}

func (c *daemonStartCmd) Run(ctx context.Context, g *Globals) error {
	cl := client.New(g.Socket)
	if info, err := ping(ctx, cl); err == nil {
		fmt.Printf("daemon already running (pid %d) on %s\n", info.Pid, info.Socket)
		return nil
	}
	if os.Geteuid() != 0 {
		return errors.New("the daemon must run as root: try sudo")
	}
	if err := os.MkdirAll(g.Root, 0o700); err != nil {
		return err
	}
	logPath := filepath.Join(g.Root, "daemon.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, "daemon", "run")
	cmd.Env = append(os.Environ(), "LAZYFORK_ROOT="+g.Root, "LAZYFORK_RUN="+g.Run,
		"LAZYFORK_SOCKET="+g.Socket, "LAZYFORK_CGROUP_PARENT="+g.CgroupParent, "LAZYFORK_BRIDGE="+g.Bridge,
		"LAZYFORK_SUBNET="+g.Subnet, "LAZYFORK_CRIU="+g.CRIU, "LAZYFORK_MAX_LAYER_BYTES="+g.MaxLayerBytes,
		"LAZYFORK_GROUP="+c.Group)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // outlives this terminal
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start daemon: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(c.Wait)
	for {
		if info, err := ping(ctx, cl); err == nil {
			fmt.Printf("daemon running (pid %d) on %s; log: %s\n", info.Pid, info.Socket, logPath)
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("daemon exited at start (%v): %s", err, tail(logPath))
		case <-deadline:
			_ = cmd.Process.Kill()
			return fmt.Errorf("daemon did not answer on %s within %v: %s", g.Socket, c.Wait, tail(logPath))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func ping(ctx context.Context, cl *client.Client) (*client.DaemonInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return cl.Ping(ctx)
}

// tail is the end of the daemon's log, for an error message.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, "\n")
}

type daemonStatusCmd struct {
	JSON bool `help:"Print JSON."`
}

func (c *daemonStatusCmd) Run(ctx context.Context, g *Globals) error {
	info, err := ping(ctx, client.New(g.Socket))
	if err != nil {
		if c.JSON {
			_ = printJSON(map[string]any{"running": false, "socket": g.Socket})
		} else {
			fmt.Printf("daemon not running on %s (%v)\n", g.Socket, err)
		}
		return exitError{Code: 1}
	}
	if c.JSON {
		return printJSON(map[string]any{"running": true, "daemon": info})
	}
	fmt.Printf("daemon running (pid %d) on %s, up %s, version %s\nstate: %s (persistent), %s (tmpfs)\n",
		info.Pid, info.Socket, time.Since(info.Started).Round(time.Second), info.Version, info.Root, info.Run)
	return nil
}

type daemonStopCmd struct{}

func (daemonStopCmd) Run(ctx context.Context, g *Globals) error {
	cl := client.New(g.Socket)
	info, err := ping(ctx, cl)
	if err != nil {
		fmt.Printf("daemon not running on %s\n", g.Socket)
		return nil
	}
	if err := cl.Shutdown(ctx); err != nil {
		return err
	}
	// It finishes the requests in flight first (a fork may take a while).
	for {
		if _, err := os.Stat(g.Socket); errors.Is(err, os.ErrNotExist) {
			fmt.Printf("daemon (pid %d) stopped; containers keep running\n", info.Pid)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

type daemonCleanCmd struct{}

func (daemonCleanCmd) Run(ctx context.Context, g *Globals) error {
	e, err := g.Engine(ctx)
	if err != nil {
		return err
	}
	ids, err := e.Clean(ctx)
	for _, id := range ids {
		fmt.Println(id)
	}
	return err
}
