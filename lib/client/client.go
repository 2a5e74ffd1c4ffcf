// Package client is the Go client of the LazyFork daemon's HTTP/JSON API on its unix
// socket (docs/api.md). It has the same operations as the `lazyfork` command:
//
//	cl := client.New("")                         // SocketFromEnv: $LAZYFORK_SOCKET or /run/lazyfork/lazyfork.sock
//	agent := cl.Container("agent")
//	forks, err := agent.Fork(ctx, 10)
//	defer forks.Delete(ctx)
//	res, err := forks[0].Exec(ctx, "hostname")  // res.Stdout
//
// Errors from the daemon are *Error values with a stable Code.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/lazyfork/lazyfork/lib/trace"
)

// DefaultSocket is where `lazyfork daemon run` listens unless told otherwise.
const DefaultSocket = "/run/lazyfork/lazyfork.sock"

// SocketEnv names the variable that points programs at another daemon's socket: the
// lazyfork command reads it through its --socket flag, SDK programs through SocketFromEnv.
const SocketEnv = "LAZYFORK_SOCKET"

// SocketFromEnv is the socket an SDK program talks to when it names none: $LAZYFORK_SOCKET,
// else DefaultSocket. It is the SDK's default as DOCKER_HOST is Docker's, and the one read
// of the environment for a setting in LazyFork's lib/: everything else gets its settings
// as explicit values from the mains' flags.
func SocketFromEnv() string {
	if s := os.Getenv(SocketEnv); s != "" {
		return s
	}
	return DefaultSocket
}

// Client talks to one daemon. It is safe for concurrent use.
type Client struct {
	Socket string
	http   *http.Client
}

// New returns a client for the daemon on socket; "" means SocketFromEnv().
func New(socket string) *Client {
	if socket == "" {
		socket = SocketFromEnv()
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConns:    8,
		IdleConnTimeout: 30 * time.Second,
	}
	return &Client{Socket: socket, http: &http.Client{Transport: tr}}
}

// Ping returns the daemon's identity, or an error with code daemon_unreachable.
func (c *Client) Ping(ctx context.Context) (*DaemonInfo, error) {
	var out DaemonInfo
	return &out, c.do(ctx, "GET", "/v1/ping", nil, &out)
}

// Create starts a new container.
func (c *Client) Create(ctx context.Context, req CreateRequest) (*Info, error) {
	var out Info
	return &out, c.do(ctx, "POST", "/v1/containers", req, &out)
}

// Get returns one container's live view.
func (c *Client) Get(ctx context.Context, ref string) (*Info, error) {
	var out Info
	return &out, c.do(ctx, "GET", ctrPath(ref, ""), nil, &out)
}

// List returns every container.
func (c *Client) List(ctx context.Context) ([]Info, error) {
	var out []Info
	return out, c.do(ctx, "GET", "/v1/containers", nil, &out)
}

// Tree returns the containers as a forest of forks.
func (c *Client) Tree(ctx context.Context) ([]TreeNode, error) {
	var out []TreeNode
	return out, c.do(ctx, "GET", "/v1/tree", nil, &out)
}

// Fork forks ref. onFork, if not nil, is called as each fork starts running (the
// request is then streamed).
func (c *Client) Fork(ctx context.Context, ref string, req ForkRequest, onFork func(Fork)) (*ForkResult, error) {
	if onFork == nil {
		var out ForkResult
		return &out, c.do(ctx, "POST", ctrPath(ref, "fork"), req, &out)
	}
	resp, err := c.send(ctx, "POST", ctrPath(ref, "fork")+"?stream=1", req, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if err := checkStatus(resp); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var p ForkProgress
		if err := dec.Decode(&p); err != nil {
			return nil, fmt.Errorf("fork %s: read progress: %w", ref, err)
		}
		switch {
		case p.Error != nil:
			return nil, p.Error
		case p.Result != nil:
			return p.Result, nil
		case p.Fork != nil:
			onFork(*p.Fork)
		}
	}
}

// Stop snapshots ref and ends its processes; it stays forkable.
func (c *Client) Stop(ctx context.Context, ref string, req StopRequest) (*Info, error) {
	var out Info
	return &out, c.do(ctx, "POST", ctrPath(ref, "stop"), req, &out)
}

// ClusterFork forks every member of ref's cluster as one cut, req.N times.
func (c *Client) ClusterFork(ctx context.Context, ref string, req ClusterForkRequest) (*ClusterFork, error) {
	var out ClusterFork
	return &out, c.do(ctx, "POST", ctrPath(ref, "cluster-fork"), req, &out)
}

// Start restarts a stopped container from its snapshot.
func (c *Client) Start(ctx context.Context, ref string) (*Info, error) {
	var out Info
	return &out, c.do(ctx, "POST", ctrPath(ref, "start"), nil, &out)
}

// Delete ends ref's processes and removes everything it holds.
func (c *Client) Delete(ctx context.Context, ref string) error {
	return c.do(ctx, "DELETE", ctrPath(ref, ""), nil, nil)
}

// Freeze pauses every process of ref.
func (c *Client) Freeze(ctx context.Context, ref string) error {
	return c.do(ctx, "POST", ctrPath(ref, "freeze"), nil, nil)
}

// Thaw resumes a frozen container.
func (c *Client) Thaw(ctx context.Context, ref string) error {
	return c.do(ctx, "POST", ctrPath(ref, "thaw"), nil, nil)
}

// Exec runs a command inside ref and returns its output and exit code.
func (c *Client) Exec(ctx context.Context, ref string, req ExecRequest) (*ExecResult, error) {
	var out ExecResult
	return &out, c.do(ctx, "POST", ctrPath(ref, "exec"), req, &out)
}

// Stats returns ref's memory, snapshot and timing figures.
func (c *Client) Stats(ctx context.Context, ref string) (*Stats, error) {
	var out Stats
	return &out, c.do(ctx, "GET", ctrPath(ref, "stats"), nil, &out)
}

// Status returns host facts, container totals and the daemon's identity.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var out Status
	return &out, c.do(ctx, "GET", "/v1/status", nil, &out)
}

// GC removes memory files, layers and snapshots nothing references any more.
func (c *Client) GC(ctx context.Context) error {
	return c.do(ctx, "POST", "/v1/gc", nil, nil)
}

// Clean deletes every stopped or exited container and returns their ids.
func (c *Client) Clean(ctx context.Context) ([]string, error) {
	var out CleanResult
	return out.Deleted, c.do(ctx, "POST", "/v1/clean", nil, &out)
}

// Shutdown asks the daemon to exit; containers keep running.
func (c *Client) Shutdown(ctx context.Context) error {
	return c.do(ctx, "POST", "/v1/shutdown", nil, nil)
}

// Logs writes ref's output log to w; with follow it keeps streaming until ctx ends or
// the container is deleted.
func (c *Client) Logs(ctx context.Context, ref string, follow bool, w io.Writer) error {
	p := ctrPath(ref, "logs")
	if follow {
		p += "?follow=1"
	}
	resp, err := c.send(ctx, "GET", p, nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := checkStatus(resp); err != nil {
		return err
	}
	_, err = io.Copy(w, resp.Body)
	if err != nil && ctx.Err() != nil {
		return nil // detached
	}
	return err
}

// Events calls fn for every lifecycle event until ctx ends or fn returns an error.
func (c *Client) Events(ctx context.Context, fn func(Event) error) error {
	return stream(ctx, c, "/v1/events", "events", func(e Event) (bool, error) { return false, fn(e) })
}

// stream GETs path, a stream of JSON lines, and calls fn with each line decoded as T
// until fn says stop (then it returns nil) or fails, ctx ends, or the stream breaks
// (io.ErrUnexpectedEOF). what names the stream in a decoding error.
func stream[T any](ctx context.Context, c *Client, path, what string, fn func(T) (stop bool, err error)) error {
	resp, err := c.send(ctx, "GET", path, nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := checkStatus(resp); err != nil {
		return err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20) // a tree watch's first line carries the whole tree
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			return fmt.Errorf("%s: read: %w", what, err)
		}
		if stop, err := fn(v); stop || err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return io.ErrUnexpectedEOF
}

func ctrPath(ref, verb string) string {
	p := "/v1/containers/" + url.PathEscape(ref)
	if verb != "" {
		p += "/" + verb
	}
	return p
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	ctx, end := trace.Start(ctx, method+" "+path)
	defer end()
	resp, err := c.send(ctx, method, path, in, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := checkStatus(resp); err != nil {
		return err
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

func (c *Client) send(ctx context.Context, method, path string, in any, upgrade string) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://lazyfork"+path, body)
	if err != nil {
		return nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if upgrade != "" {
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", upgrade)
	}
	traced := trace.From(ctx) != nil
	if traced {
		req.Header.Set(trace.Header, "1") // the daemon sends its spans back
	}
	begin := time.Now()
	resp, err := c.http.Do(req)
	if err == nil && traced {
		if h := resp.Header.Get(trace.Header); h != "" {
			trace.Merge(ctx, begin, "daemon: ", trace.Decode([]byte(h)))
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ne *net.OpError
		if errors.As(err, &ne) && ne.Op == "dial" {
			return nil, &Error{Code: CodeDaemonUnreached, Message: fmt.Sprintf("no LazyFork daemon answers on %s (start one with `lazyfork daemon start`): %v", c.Socket, ne.Err)}
		}
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	return resp, nil
}

// checkStatus turns a non-2xx answer into an *Error.
func checkStatus(resp *http.Response) error {
	if resp.StatusCode < 300 {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	e := &Error{Status: resp.StatusCode}
	if json.Unmarshal(b, e) != nil || e.Code == "" {
		e.Code = CodeFailed
		e.Message = fmt.Sprintf("daemon answered %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return e
}

// IsCode reports whether err is a daemon error with the given code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}
