package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/paths"
	"github.com/lazyfork/lazyfork/lib/runtime"
)

// DefaultMaxBody bounds a request body (an exec's stdin travels in it).
const DefaultMaxBody = 8 << 20

// Config configures a daemon.
type Config struct {
	Socket  string       // unix socket path (client.DefaultSocket if empty)
	MaxBody int64        // request body limit (DefaultMaxBody if 0)
	Log     *slog.Logger // one line per request; nil: none
	// ShutdownTimeout bounds how long a stopping daemon waits for requests in flight.
	ShutdownTimeout time.Duration
}

// Server serves the API of one Service.
type Server struct {
	svc      *Service
	cfg      Config
	mux      *http.ServeMux
	stopOnce sync.Once
	stop     chan struct{} // POST /v1/shutdown
	streams  chan struct{} // closed when the daemon stops: ends event and log streams
}

// NewServer builds the routes over svc.
func NewServer(svc *Service, cfg Config) *Server {
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 2 * time.Minute
	}
	s := &Server{svc: svc, cfg: cfg, mux: http.NewServeMux(), stop: make(chan struct{}), streams: make(chan struct{})}
	routes := map[string]http.HandlerFunc{
		"GET /v1/ping":                     s.ping,
		"GET /v1/status":                   s.status,
		"GET /v1/events":                   s.events,
		"GET /v1/tree":                     s.tree,
		"GET /v1/containers":               s.list,
		"POST /v1/containers":              s.create,
		"GET /v1/containers/{ref}":         s.get,
		"DELETE /v1/containers/{ref}":      s.delete,
		"POST /v1/containers/{ref}/fork":   s.fork,
		"POST /v1/containers/{ref}/exec":   s.exec,
		"POST /v1/containers/{ref}/stop":   s.stopContainer,
		"POST /v1/containers/{ref}/start":  s.start,
		"POST /v1/containers/{ref}/freeze": s.freeze,
		"POST /v1/containers/{ref}/thaw":   s.thaw,
		"GET /v1/containers/{ref}/stats":   s.stats,
		"GET /v1/containers/{ref}/logs":    s.logs,
		"POST /v1/gc":                      s.gc,
		"POST /v1/clean":                   s.clean,
		"POST /v1/shutdown":                s.shutdown,
	}
	for pattern, h := range routes {
		s.mux.HandleFunc(pattern, h)
	}
	return s
}

// Handler is the API with JSON answers for unknown routes and methods, and request logs.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		begin := time.Now()
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
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
}

func (r *recorder) WriteHeader(code int) { r.status = code; r.ResponseWriter.WriteHeader(code) }
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

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	st, err := s.svc.Status(r.Context())
	reply(w, http.StatusOK, st, err)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	rows, err := s.svc.List(r.Context())
	reply(w, http.StatusOK, rows, err)
}

func (s *Server) tree(w http.ResponseWriter, r *http.Request) {
	t, err := s.svc.Tree(r.Context())
	reply(w, http.StatusOK, t, err)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	in, err := s.svc.Get(r.Context(), r.PathValue("ref"))
	reply(w, http.StatusOK, in, err)
}

func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	st, err := s.svc.Stats(r.Context(), r.PathValue("ref"))
	reply(w, http.StatusOK, st, err)
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
	enc := json.NewEncoder(w)
	emit := func(p client.ForkProgress) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(p)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	res, err := s.svc.Fork(r.Context(), ref, req, func(f client.Fork) { emit(client.ForkProgress{Fork: &f}) })
	if err != nil {
		emit(client.ForkProgress{Error: APIError(err)})
		return
	}
	emit(client.ForkProgress{Result: res})
}

func (s *Server) stopContainer(w http.ResponseWriter, r *http.Request) {
	var req client.StopRequest
	if !s.body(w, r, &req, true) {
		return
	}
	in, err := s.svc.Stop(r.Context(), r.PathValue("ref"), req)
	reply(w, http.StatusOK, in, err)
}

func (s *Server) start(w http.ResponseWriter, r *http.Request) {
	if !s.noBody(w, r) {
		return
	}
	in, err := s.svc.Start(r.Context(), r.PathValue("ref"))
	reply(w, http.StatusOK, in, err)
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
	if _, err := s.svc.RT.Tree.Resolve(ref); err != nil {
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
	_ = s.svc.Logs(ctx, ref, follow == "1" || follow == "true", w)
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	ch, cancel := s.svc.Events.Subscribe()
	defer cancel()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	flush()
	enc := json.NewEncoder(w)
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

func (s *Server) clean(w http.ResponseWriter, r *http.Request) {
	if !s.noBody(w, r) {
		return
	}
	ids, err := s.svc.Clean(context.WithoutCancel(r.Context()))
	reply(w, http.StatusOK, client.CleanResult{Deleted: ids}, err)
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
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
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
	if err := os.MkdirAll(filepath.Dir(socket), 0o700); err != nil {
		return nil, nil, fmt.Errorf("listen on %s: %w", socket, err)
	}
	lockPath := socket + ".lock"
	lf, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on %s: %w", socket, err)
	}
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(lockPath)
		lf.Close()
		return nil, nil, fmt.Errorf("a LazyFork daemon already runs on %s (pid %s): `lazyfork daemon stop` it first", socket, strings.TrimSpace(string(b)))
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
			return nil, nil, fmt.Errorf("listen on %s: it exists and is not a socket", socket)
		}
		if err := os.Remove(socket); err != nil { // stale: its daemon is gone (we hold the lock)
			return nil, nil, fmt.Errorf("remove stale socket %s: %w", socket, err)
		}
	}
	// Created 0600 from the start: no moment where another user could connect.
	old := syscall.Umask(0o177)
	l, err = net.Listen("unix", socket)
	syscall.Umask(old)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on %s: %w", socket, err)
	}
	if err := os.Chmod(socket, 0o600); err != nil {
		l.Close()
		return nil, nil, fmt.Errorf("listen on %s: %w", socket, err)
	}
	return l, func() {
		l.Close()
		_ = os.Remove(socket)
		lf.Close()
	}, nil
}

// Run is `lazyfork daemon run`: it cleans what a killed predecessor left half-done,
// then serves rt on cfg.Socket until ctx ends or a client asks it to stop.
func Run(ctx context.Context, rt *runtime.Runtime, cfg Config) error {
	if cfg.Socket == "" {
		cfg.Socket = client.DefaultSocket
	}
	l, closeFn, err := Listen(cfg.Socket)
	if err != nil {
		return err
	}
	defer closeFn()
	// Nothing else to rebuild: every request reads the tree and the live processes.
	if err := fork.GC(rt); err != nil && cfg.Log != nil {
		cfg.Log.Warn("gc at start", "err", err)
	}
	svc := NewService(rt)
	defer svc.Close()
	svc.Daemon = &client.DaemonInfo{Version: Version, Pid: os.Getpid(), Socket: cfg.Socket,
		Started: time.Now().UTC(), Root: paths.Root(), Run: paths.Run()}
	if cfg.Log != nil {
		cfg.Log.Info("listening", "socket", cfg.Socket, "pid", os.Getpid(), "root", paths.Root(), "run", paths.Run())
	}
	err = NewServer(svc, cfg).Serve(ctx, l)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
