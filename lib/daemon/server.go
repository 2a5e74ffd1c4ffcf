package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/trace"
)

// DefaultMaxBody bounds a request body (an exec's stdin travels in it).
const DefaultMaxBody = 8 << 20

// Timeouts a connection gets unless Config says otherwise.
const (
	DefaultReadHeaderTimeout = 10 * time.Second // request line and headers
	DefaultReadTimeout       = time.Minute      // headers and the whole body
	DefaultIdleTimeout       = 2 * time.Minute  // between requests on a kept-alive connection
	DefaultStreamWriteStall  = time.Minute      // one write of a stream (events, logs, fork progress)
)

// Config configures a daemon.
type Config struct {
	Socket  string       // unix socket path (client.DefaultSocket if empty)
	MaxBody int64        // request body limit (DefaultMaxBody if 0)
	Log     *slog.Logger // one line per request; nil: none
	// ShutdownTimeout bounds how long a stopping daemon waits for requests in flight.
	ShutdownTimeout time.Duration
	// Group names the group whose members may use the daemon besides root ("" means
	// DefaultGroup, "none" root only). A group that does not exist allows root only.
	// Every request's peer is checked (SO_PEERCRED), whatever the socket's mode.
	Group string
	// ReadHeaderTimeout, ReadTimeout and IdleTimeout bound a slow or idle client (0:
	// the defaults above). ReadTimeout covers the request's headers and body only: once
	// the body is in, a long operation or a stream (fork progress, events, logs, exec)
	// runs as long as it needs. There is no WriteTimeout for the same reason; instead
	// StreamWriteStall bounds each write of a stream to a client that stopped reading.
	ReadHeaderTimeout, ReadTimeout, IdleTimeout, StreamWriteStall time.Duration
}

// Server serves the API of one Service.
type Server struct {
	svc      *Service
	cfg      Config
	mux      *http.ServeMux
	stopOnce sync.Once
	stop     chan struct{} // POST /v1/shutdown
	streams  chan struct{} // closed when the daemon stops: ends event and log streams
	access   access        // who may use it
}

// NewServer builds the routes over svc.
func NewServer(svc *Service, cfg Config) *Server {
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 2 * time.Minute
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&cfg.ReadHeaderTimeout, DefaultReadHeaderTimeout}, {&cfg.ReadTimeout, DefaultReadTimeout},
		{&cfg.IdleTimeout, DefaultIdleTimeout}, {&cfg.StreamWriteStall, DefaultStreamWriteStall}} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	s := &Server{svc: svc, cfg: cfg, mux: http.NewServeMux(), stop: make(chan struct{}), streams: make(chan struct{})}
	group := cfg.Group
	if group == "" {
		group = DefaultGroup
	}
	if group != "none" {
		a, err := lookupAccess(group)
		if err != nil && cfg.Log != nil {
			cfg.Log.Warn("allowed group not resolved: root only", "group", group, "err", err)
		}
		s.access = a
	}
	ref := func(r *http.Request) string { return r.PathValue("ref") }
	routes := map[string]http.HandlerFunc{
		"GET /v1/ping":                   s.ping,
		"GET /v1/status":                 query(func(r *http.Request) (any, error) { return s.svc.Status(r.Context()) }),
		"GET /v1/events":                 s.events,
		"GET /v1/tree":                   query(func(r *http.Request) (any, error) { return s.svc.Tree(r.Context()) }),
		"GET /v1/containers":             query(func(r *http.Request) (any, error) { return s.svc.List(r.Context()) }),
		"POST /v1/containers":            s.create,
		"GET /v1/containers/{ref}":       query(func(r *http.Request) (any, error) { return s.svc.Get(r.Context(), ref(r)) }),
		"DELETE /v1/containers/{ref}":    s.delete,
		"POST /v1/containers/{ref}/fork": s.fork,
		"POST /v1/containers/{ref}/cluster-fork": withBody(s, http.StatusOK, true, func(r *http.Request, req client.ClusterForkRequest) (any, error) {
			return s.svc.ClusterFork(r.Context(), ref(r), req)
		}),
		"POST /v1/containers/{ref}/exec": s.exec,
		"POST /v1/containers/{ref}/stop": withBody(s, http.StatusOK, true, func(r *http.Request, req client.StopRequest) (any, error) {
			return s.svc.Stop(r.Context(), ref(r), req)
		}),
		"POST /v1/containers/{ref}/start":  s.action(func(r *http.Request) (any, error) { return s.svc.Start(r.Context(), ref(r)) }),
		"POST /v1/containers/{ref}/freeze": s.freeze,
		"POST /v1/containers/{ref}/thaw":   s.thaw,
		"GET /v1/containers/{ref}/stats":   query(func(r *http.Request) (any, error) { return s.svc.Stats(r.Context(), ref(r)) }),
		"GET /v1/containers/{ref}/logs":    s.logs,
		"POST /v1/gc":                      s.gc,
		"POST /v1/clean": s.action(func(r *http.Request) (any, error) {
			ids, err := s.svc.Clean(context.WithoutCancel(r.Context()))
			return client.CleanResult{Deleted: ids}, err
		}),
		"POST /v1/shutdown": s.shutdown,
	}
	for pattern, h := range s.treeRoutes() {
		routes[pattern] = h
	}
	for pattern, h := range routes {
		s.mux.HandleFunc(pattern, h)
	}
	return s
}

// Handler is the API with JSON answers for unknown routes and methods, and request logs.
// Every request is first checked against its connection's peer credentials, and its
// body is read whole (bounded in size and, by ReadTimeout, in time) before the route runs.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		begin := time.Now()
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		if !s.allowPeer(rec, r) || !s.readBody(rec, r) {
			return
		}
		if r.Header.Get(trace.Header) == "1" {
			// A traced request: its spans go back in the answer's header (an exec
			// stream sends them in a frame, see execStream).
			rec.trace = trace.New()
			r = r.WithContext(trace.With(r.Context(), rec.trace))
		}
		if _, pattern := s.mux.Handler(r); pattern != "" {
			s.mux.ServeHTTP(rec, r)
		} else {
			s.noRoute(rec, r)
		}
		if s.cfg.Log != nil && r.URL.Path != "/v1/ping" { // every CLI command pings
			s.cfg.Log.Info("request", "method", r.Method, "path", r.URL.Path, "status", rec.status, "ms", time.Since(begin).Milliseconds())
		}
	})
}

// allowPeer answers 403 (and logs who) unless the peer is root or in the allowed group.
func (s *Server) allowPeer(w http.ResponseWriter, r *http.Request) bool {
	p, err := peerFrom(r.Context())
	if err == nil && s.access.allows(p) {
		return true
	}
	if err != nil {
		writeError(w, client.Errorf(http.StatusForbidden, client.CodeForbidden, "cannot identify the client (%v): refused", err))
		if s.cfg.Log != nil {
			s.cfg.Log.Warn("refused client", "err", err, "method", r.Method, "path", r.URL.Path)
		}
		return false
	}
	writeError(w, client.Errorf(http.StatusForbidden, client.CodeForbidden,
		"uid %d (gid %d) may not use the LazyFork daemon: it allows %s; ask an administrator to add you to that group, or use sudo", p.Uid, p.Gid, s.access.describe()))
	if s.cfg.Log != nil {
		s.cfg.Log.Warn("refused client", "uid", p.Uid, "gid", p.Gid, "groups", p.Groups, "pid", p.Pid, "method", r.Method, "path", r.URL.Path, "allowed", s.access.describe())
	}
	return false
}

// readBody reads the whole request body (up to MaxBody+1 bytes, so decodeBody still sees
// one that is too large) while the server's ReadTimeout runs, then lifts the read
// deadline: an operation or a stream may then take as long as it needs, and a client that
// hangs up is still noticed.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) bool {
	rc := http.NewResponseController(w)
	if r.Body != nil && r.Body != http.NoBody {
		b, err := io.ReadAll(io.LimitReader(r.Body, s.cfg.MaxBody+1))
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				writeError(w, client.Errorf(http.StatusRequestTimeout, client.CodeTimeout, "request body not received within %v", s.cfg.ReadTimeout))
			} else {
				writeError(w, client.Errorf(http.StatusBadRequest, client.CodeBadRequest, "read request body: %v", err))
			}
			return false
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
	}
	_ = rc.SetReadDeadline(time.Time{})
	return true
}

// stallGuard bounds each write of a stream: a client that stops reading (its socket
// buffer full) loses the stream after StreamWriteStall instead of holding it forever.
type stallGuard struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	stall time.Duration
}

func (s *Server) guardStream(w http.ResponseWriter) *stallGuard {
	return &stallGuard{w: w, rc: http.NewResponseController(w), stall: s.cfg.StreamWriteStall}
}

func (g *stallGuard) Write(p []byte) (int, error) {
	_ = g.rc.SetWriteDeadline(time.Now().Add(g.stall))
	return g.w.Write(p)
}

// done lifts the write deadline, so a kept-alive connection's next answer has none.
func (g *stallGuard) done() { _ = g.rc.SetWriteDeadline(time.Time{}) }

func (g *stallGuard) Flush() {
	_ = g.rc.SetWriteDeadline(time.Now().Add(g.stall))
	_ = g.rc.Flush()
}

func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	var allowed []string
	for _, m := range []string{"GET", "POST", "DELETE"} {
		r2 := r.Clone(r.Context())
		r2.Method = m
		if _, p := s.mux.Handler(r2); p != "" {
			allowed = append(allowed, m)
		}
	}
	if len(allowed) > 0 {
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeError(w, client.Errorf(http.StatusMethodNotAllowed, client.CodeMethod, "method %s is not allowed on %s (use %s)", r.Method, r.URL.Path, strings.Join(allowed, " or ")))
		return
	}
	writeError(w, client.Errorf(http.StatusNotFound, client.CodeUnknownRoute, "no route %s %s (the API is described in docs/api.md)", r.Method, r.URL.Path))
}

// recorder remembers the status for the request log and passes Flush and Hijack on.
type recorder struct {
	http.ResponseWriter
	status int
	trace  *trace.Recorder // a traced request's spans, sent in the header
	wrote  bool
}

func (r *recorder) WriteHeader(code int) {
	r.header()
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	r.header()
	return r.ResponseWriter.Write(p)
}

// header adds the trace before the header goes out (a streamed answer's holds what was
// done before it started).
func (r *recorder) header() {
	if !r.wrote && r.trace != nil {
		r.Header().Set(trace.Header, string(r.trace.JSON()))
	}
	r.wrote = true
}
func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (s *Server) body(w http.ResponseWriter, r *http.Request, v any, optional bool) bool {
	if err := decodeBody(w, r, s.cfg.MaxBody, v, optional); err != nil {
		writeError(w, err)
		return false
	}
	return true
}

// noBody accepts an empty body or {} on routes that take no parameters.
func (s *Server) noBody(w http.ResponseWriter, r *http.Request) bool {
	var v struct{}
	return s.body(w, r, &v, true)
}

func (s *Server) ping(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.svc.Daemon)
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req client.CreateRequest
	if !s.body(w, r, &req, false) {
		return
	}
	// Runs to the end; a client that went away meanwhile gets its container deleted.
	in, err := s.svc.Create(context.WithoutCancel(r.Context()), req, nil)
	if err == nil && r.Context().Err() != nil {
		_ = s.svc.Delete(context.Background(), in.ID)
		return
	}
	reply(w, http.StatusCreated, in, err)
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	if !s.noBody(w, r) {
		return
	}
	if err := s.svc.Delete(r.Context(), r.PathValue("ref")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req client.ForkRequest
	if !s.body(w, r, &req, true) {
		return
	}
	ref := r.PathValue("ref")
	if v := r.URL.Query().Get("stream"); v != "1" && v != "true" {
		res, err := s.svc.Fork(r.Context(), ref, req, nil)
		reply(w, http.StatusOK, res, err)
		return
	}
	// Streamed: one JSON line per fork as it starts, then the result or the error.
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	var mu sync.Mutex
	gw := s.guardStream(w)
	defer gw.done()
	enc := json.NewEncoder(gw)
	emit := func(p client.ForkProgress) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(p)
		gw.Flush()
	}
	res, err := s.svc.Fork(r.Context(), ref, req, func(f client.Fork) { emit(client.ForkProgress{Fork: &f}) })
	if err != nil {
		emit(client.ForkProgress{Error: APIError(err)})
		return
	}
	emit(client.ForkProgress{Result: res})
}

func (s *Server) freeze(w http.ResponseWriter, r *http.Request) {
	s.simple(w, r, s.svc.Freeze)
}

func (s *Server) thaw(w http.ResponseWriter, r *http.Request) {
	s.simple(w, r, s.svc.Thaw)
}

// simple runs an operation on {ref} and answers with the container's view.
func (s *Server) simple(w http.ResponseWriter, r *http.Request, op func(context.Context, string) error) {
	if !s.noBody(w, r) {
		return
	}
	ref := r.PathValue("ref")
	if err := op(context.WithoutCancel(r.Context()), ref); err != nil {
		writeError(w, err)
		return
	}
	in, err := s.svc.Get(r.Context(), ref)
	reply(w, http.StatusOK, in, err)
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	var req client.ExecRequest
	if !s.body(w, r, &req, false) {
		return
	}
	if strings.EqualFold(r.Header.Get("Upgrade"), client.UpgradeHeader) {
		s.execStream(w, r, req)
		return
	}
	res, err := s.svc.Exec(r.Context(), r.PathValue("ref"), req)
	reply(w, http.StatusOK, res, err)
}

func (s *Server) logs(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("ref")
	if _, err := s.svc.RT.Containers.Resolve(ref); err != nil {
		writeError(w, err)
		return
	}
	follow := r.URL.Query().Get("follow")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() {
		select {
		case <-s.streams:
			cancel()
		case <-ctx.Done():
		}
	}()
	gw := s.guardStream(w)
	defer gw.done()
	_ = s.svc.Logs(ctx, ref, follow == "1" || follow == "true", gw)
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	ch, cancel := s.svc.Events.Subscribe()
	defer cancel()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	gw := s.guardStream(w)
	defer gw.done()
	flush := gw.Flush
	flush()
	enc := json.NewEncoder(gw)
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				return // too slow: dropped
			}
			if enc.Encode(e) != nil {
				return
			}
			flush()
		case <-r.Context().Done():
			return
		case <-s.streams:
			return
		}
	}
}

func (s *Server) gc(w http.ResponseWriter, r *http.Request) {
	if !s.noBody(w, r) {
		return
	}
	if err := s.svc.GC(r.Context()); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) shutdown(w http.ResponseWriter, r *http.Request) {
	if !s.noBody(w, r) {
		return
	}
	writeJSON(w, http.StatusAccepted, struct{}{})
	s.stopOnce.Do(func() { close(s.stop) })
}

func reply(w http.ResponseWriter, status int, v any, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, status, v)
}

// Serve answers requests on l until ctx ends or a client asks for shutdown, then waits
// (bounded) for requests in flight. Containers are never touched by stopping.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	hs := &http.Server{Handler: s.Handler(), ConnContext: withPeer,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout, ReadTimeout: s.cfg.ReadTimeout, IdleTimeout: s.cfg.IdleTimeout}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	case <-s.stop:
	}
	close(s.streams)
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		return fmt.Errorf("stop daemon: %w", err)
	}
	return nil
}

// Listen creates the daemon's socket: mode 0600 in a directory it creates 0700, guarded
// by an flock on SOCKET.lock so that a second daemon refuses to start and a stale socket
// from a killed one is replaced. close removes the socket.
func Listen(socket string) (l net.Listener, closeFn func(), err error) {
	l, closeFn, _, err = listen(socket)
	return l, closeFn, err
}

func socketDir(socket string) string { return filepath.Dir(socket) }

// listen is Listen that also says whether it made the socket's directory.
func listen(socket string) (l net.Listener, closeFn func(), madeDir bool, err error) {
	if _, err := os.Lstat(socketDir(socket)); errors.Is(err, os.ErrNotExist) {
		madeDir = true
	}
	if err := os.MkdirAll(socketDir(socket), 0o700); err != nil {
		return nil, nil, false, fmt.Errorf("listen on %s: %w", socket, err)
	}
	lockPath := socket + ".lock"
	lf, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, nil, false, fmt.Errorf("listen on %s: %w", socket, err)
	}
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(lockPath)
		lf.Close()
		pid, _, _ := strings.Cut(string(b), "\n")
		return nil, nil, false, fmt.Errorf("a LazyFork daemon already runs on %s (pid %s): `lazyfork daemon stop` it first", socket, strings.TrimSpace(pid))
	}
	defer func() {
		if err != nil {
			lf.Close()
		}
	}()
	_ = lf.Truncate(0)
	_, _ = lf.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	if fi, err := os.Lstat(socket); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, nil, false, fmt.Errorf("listen on %s: it exists and is not a socket", socket)
		}
		if err := os.Remove(socket); err != nil { // stale: its daemon is gone (we hold the lock)
			return nil, nil, false, fmt.Errorf("remove stale socket %s: %w", socket, err)
		}
	}
	// Created 0600 from the start: no moment where another user could connect.
	old := syscall.Umask(0o177)
	l, err = net.Listen("unix", socket)
	syscall.Umask(old)
	if err != nil {
		return nil, nil, false, fmt.Errorf("listen on %s: %w", socket, err)
	}
	if err := os.Chmod(socket, 0o600); err != nil {
		l.Close()
		return nil, nil, false, fmt.Errorf("listen on %s: %w", socket, err)
	}
	// Listening: from now on client.Running may send commands here without asking first.
	info, _ := json.Marshal(client.LockInfo{Pid: os.Getpid(), Start: selfStart(), Root: paths.Root(), Run: paths.Run()})
	_, _ = lf.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"+string(info)+"\n"), 0)
	return l, func() {
		_ = lf.Truncate(0) // no longer serving: Running says so at once
		l.Close()
		_ = os.Remove(socket)
		lf.Close()
	}, madeDir, nil
}

func selfStart() uint64 {
	st, _ := container.StartTime(os.Getpid())
	return st
}

// Run is `lazyfork daemon run`: it cleans what a killed predecessor left half-done,
// then serves rt on cfg.Socket until ctx ends or a client asks it to stop.
func Run(ctx context.Context, rt *container.Runtime, cfg Config) error {
	if cfg.Socket == "" {
		cfg.Socket = client.DefaultSocket
	}
	l, closeFn, madeDir, err := listen(cfg.Socket)
	if err != nil {
		return err
	}
	defer closeFn()
	srv := NewServer(nil, cfg)
	if err := srv.access.openSocketTo(cfg.Socket, madeDir); err != nil {
		return err
	}
	// Nothing else to rebuild: every request reads the store and the live processes.
	if err := fork.GC(rt); err != nil && cfg.Log != nil {
		cfg.Log.Warn("gc at start", "err", err)
	}
	svc := NewService(rt)
	defer svc.Close()
	svc.Daemon = &client.DaemonInfo{Version: Version, Pid: os.Getpid(), Socket: cfg.Socket,
		Started: time.Now().UTC(), Root: paths.Root(), Run: paths.Run()}
	if cfg.Log != nil {
		cfg.Log.Info("listening", "socket", cfg.Socket, "pid", os.Getpid(), "root", paths.Root(), "run", paths.Run(), "allowed", srv.access.describe())
	}
	srv.svc = svc
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if err := svc.watchTreeDocs(wctx); err != nil && cfg.Log != nil {
		// Watchers then miss only what other processes change.
		cfg.Log.Warn("watch trees", "err", err)
	}
	err = srv.Serve(ctx, l)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
