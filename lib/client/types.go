package client

import (
	"fmt"
	"time"

	"github.com/lazyfork/lazyfork/lib/exitcode"
	"github.com/lazyfork/lazyfork/lib/stage"
	"github.com/lazyfork/lazyfork/lib/store"
)

// Info is the live view of one container: a row of `lazyfork list` (lib/store builds no
// views; the runtime fills it, the daemon sends it).
type Info = store.Info

// TreeNode is a container with its forks, for GET /v1/tree.
type TreeNode struct {
	Info
	Children []TreeNode `json:"children"`
}

// Fork is one new fork: the line lf-restore prints.
type Fork = stage.Fork

// ClusterForkRequest is the body of POST /v1/containers/{ref}/cluster-fork.
type ClusterForkRequest struct {
	N     int  `json:"n,omitempty"` // forks of the whole cluster; default 1
	Force bool `json:"force,omitempty"`
}

// ClusterFork is its answer: per member, the cut's pause and its copy in each fork.
type ClusterFork = stage.ClusterFork

// CreateRequest is the body of POST /v1/containers.
type CreateRequest struct {
	Image   string   `json:"image"`
	Name    string   `json:"name,omitempty"`
	Command []string `json:"command,omitempty"`
	Env     []string `json:"env,omitempty"`
	// Hook is the path of a unix socket inside the container on which the workload
	// answers QUIESCE and RESEED (see docs/api.md). The container gets LAZYFORK_HOOK=Hook.
	Hook string `json:"hook,omitempty"`
	// User overrides the image's User ("uid[:gid]" or names from the image's files).
	User string `json:"user,omitempty"`
	// Memory (bytes) and PidsLimit cap the container and its forks; 0: no limit.
	Memory    int64 `json:"memory,omitempty"`
	PidsLimit int64 `json:"pids_limit,omitempty"`
	// Privileged opts out of confinement (docs/security.md).
	Privileged bool `json:"privileged,omitempty"`
	// Net: "none" (default: a network namespace of its own, loopback only), "bridge" (plus
	// an address on the LazyFork bridge; forks get their own) or "host".
	Net string `json:"net,omitempty"`
	// NAT masquerades a bridge-mode container's traffic to the host's other networks.
	NAT bool `json:"nat,omitempty"`
	// Join makes the container a member of the cluster of this (running, --net none or
	// bridge) container: it shares that network namespace and address (Net "" or the
	// cluster's mode, no NAT of its own).
	Join string `json:"join,omitempty"`
}

// HookOptions choose what happens when a runtime hook does not answer.
type HookOptions struct {
	// HookTimeout bounds each hook message, in seconds (0: the default, 5 s).
	HookTimeout float64 `json:"hook_timeout,omitempty"`
	// HookForce snapshots (and forks) anyway when the runtime does not answer in time,
	// instead of failing with hook_no_answer.
	HookForce bool `json:"hook_force,omitempty"`
}

// ForkRequest is the body of POST /v1/containers/{ref}/fork.
type ForkRequest struct {
	N     int      `json:"n,omitempty"` // how many forks; default 1, or len(Names)
	Names []string `json:"names,omitempty"`
	// Force forks even if the workload maps an allocator that relies on MADV_DONTNEED
	// zero-fill (jemalloc, mimalloc, tcmalloc).
	Force bool `json:"force,omitempty"`
	// Share moves the source onto the snapshot too, so parent and forks hold its memory
	// once (the source pauses for a few hundred ms and gets a new host pid).
	Share bool `json:"share,omitempty"`
	// Copy leaves the source on its own memory and gives forks a copy of its files; by
	// default a container's first fork moves it onto the snapshot (new host pids, same
	// container), so that every later fork dumps only what it changed.
	Copy bool `json:"copy,omitempty"`
	// HugePages: each dense 2 MiB stretch of the heap one huge page of the memory files,
	// ~0.4 MB less per working fork of a 256 MiB heap. nil: a swap's preallocation makes
	// them (before the freeze) while fresh ones come fast, a copy's rewrite does not (it
	// would slow it); true: both, however slowly; false: neither.
	HugePages *bool `json:"huge_pages,omitempty"`
	HookOptions
}

// ForkResult is the answer to a fork.
type ForkResult struct {
	Forks    []Fork `json:"forks"`
	Snapshot string `json:"snapshot"`
}

// ForkProgress is one line of a streamed fork (POST .../fork?stream=1): a fork as it
// starts, then the result or the error.
type ForkProgress struct {
	Fork   *Fork       `json:"fork,omitempty"`
	Result *ForkResult `json:"result,omitempty"`
	Error  *Error      `json:"error,omitempty"`
}

// StopRequest is the optional body of POST /v1/containers/{ref}/stop.
type StopRequest struct {
	HookOptions
}

// ExecRequest is the body of POST /v1/containers/{ref}/exec.
type ExecRequest struct {
	Argv        []string `json:"argv"`
	Stdin       string   `json:"stdin,omitempty"`
	StdinBase64 string   `json:"stdin_base64,omitempty"` // binary stdin; not with Stdin
	Env         []string `json:"env,omitempty"`          // KEY=VALUE, added to the container's
	Cwd         string   `json:"cwd,omitempty"`
	Timeout     float64  `json:"timeout,omitempty"` // seconds; 0: no limit
	// TTY runs the command on a terminal (streamed exec only).
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
}

// ExecResult is what a command run inside a container returned.
type ExecResult struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int    `json:"exit_code"`
}

// Stats is GET /v1/containers/{ref}/stats: memory, snapshot and timings.
type Stats struct {
	Info
	Rss         uint64             `json:"rss_bytes"`
	Cache       uint64             `json:"cache_bytes"`
	Kmem        uint64             `json:"kmem_bytes"`
	MappedFile  uint64             `json:"mapped_file_bytes"`
	Family      string             `json:"family,omitempty"`
	FamilyBytes int64              `json:"family_bytes"`
	Snapshot    *stage.Snapshot    `json:"snapshot,omitempty"`
	Timings     map[string]float64 `json:"timings_ms,omitempty"`
}

// Check is one host requirement's verdict.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
	// Advisory checks inform and never fail (ok stays true): ksm.
	Advisory bool `json:"advisory,omitempty"`
}

// Status is GET /v1/status: host facts, container totals and the daemon.
type Status struct {
	Host       []Check     `json:"host"`
	Containers int         `json:"containers"`
	Running    int         `json:"running"`
	Frozen     int         `json:"frozen"`
	Stopped    int         `json:"stopped"`
	Exited     int         `json:"exited"`
	Memory     int64       `json:"memory_bytes"`
	Root       string      `json:"root"`
	Run        string      `json:"run"`
	Daemon     *DaemonInfo `json:"daemon,omitempty"`
}

// DaemonInfo is GET /v1/ping.
type DaemonInfo struct {
	Version string    `json:"version"`
	Pid     int       `json:"pid"`
	Socket  string    `json:"socket"`
	Started time.Time `json:"started"`
	Root    string    `json:"root"`
	Run     string    `json:"run"`
}

// CleanResult lists the containers `daemon clean` deleted.
type CleanResult struct {
	Deleted []string `json:"deleted"`
}

// Event types on GET /v1/events.
const (
	EventCreate = "create"
	EventFork   = "fork"
	EventStop   = "stop"
	EventStart  = "start"
	EventDelete = "delete"
	EventFreeze = "freeze"
	EventThaw   = "thaw"
)

// Event is one lifecycle event: one JSON line on GET /v1/events.
type Event struct {
	Type     string    `json:"type"`
	ID       string    `json:"id"`
	Name     string    `json:"name,omitempty"`
	Parent   string    `json:"parent,omitempty"`   // fork: the source
	Snapshot string    `json:"snapshot,omitempty"` // fork, stop
	Time     time.Time `json:"time"`
}

// Error codes: stable strings clients can switch on (docs/api.md lists them).
const (
	CodeBadJSON         = "bad_json"              // 400: the body is not valid JSON
	CodeBadRequest      = "bad_request"           // 400: wrong type, unknown or missing field, bad value
	CodeInvalidName     = "invalid_name"          // 400
	CodeForbidden       = "forbidden"             // 403: the client's user may not use the daemon
	CodeNotFound        = "not_found"             // 404: no such container
	CodeImageNotFound   = "image_not_found"       // 404
	CodeUnknownRoute    = "unknown_route"         // 404
	CodeMethod          = "method_not_allowed"    // 405
	CodeAmbiguous       = "ambiguous"             // 409: an id prefix matches several containers (or trees)
	CodeTimeout         = "request_timeout"       // 408: the request body did not arrive in time
	CodeNameInUse       = "name_in_use"           // 409
	CodeInvalidState    = "invalid_state"         // 409: e.g. exec in a frozen or stopped container
	CodeHookRefused     = "hook_refused"          // 409: the runtime answered ERR to QUIESCE/RESEED
	CodeOverBudget      = "over_budget"           // 409: a tree operation cannot fit its budget even after eviction
	CodeBusy            = "busy"                  // 409: another operation held the container past the wait
	CodeTooLarge        = "too_large"             // 413
	CodeAllocator       = "unsupported_allocator" // 422: retry with force
	CodeCanceled        = "canceled"              // 499: the client went away
	CodeFailed          = "failed"                // 500: the operation failed (CRIU, mounts, ...)
	CodeShuttingDown    = "shutting_down"         // 503
	CodeHookNoAnswer    = "hook_no_answer"        // 504: retry with hook_force, or fix the runtime
	CodeExecTimeout     = "exec_timeout"          // 504: the command ran past its timeout
	CodeDaemonUnreached = "daemon_unreachable"    // client side: no daemon answers on the socket
)

// Error is the body of every non-2xx answer, and the error the Go client returns.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// ExitCode is the status the porcelain exits with on this error, the same a stage binary
// gives the error behind the code (lib/exitcode).
func (e *Error) ExitCode() int {
	switch e.Code {
	case CodeNotFound, CodeImageNotFound:
		return exitcode.NotFound
	case CodeInvalidState:
		return exitcode.InvalidState
	case CodeBusy:
		return exitcode.Busy
	case CodeBadRequest, CodeBadJSON, CodeInvalidName, CodeAmbiguous:
		return exitcode.Usage
	}
	return exitcode.Failed
}

// Errorf makes an *Error.
func Errorf(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// Stream frame types of a streamed exec (POST .../exec with Upgrade: lazyfork-exec).
// Each frame is one type byte, a big-endian uint32 length and the payload.
const (
	FrameStdin    byte = 0 // client → daemon: bytes for the command's stdin
	FrameStdout   byte = 1 // daemon → client
	FrameStderr   byte = 2 // daemon → client
	FrameExit     byte = 3 // daemon → client: big-endian int32 exit code; last frame
	FrameError    byte = 4 // daemon → client: a JSON Error; last frame
	FrameCloseIn  byte = 5 // client → daemon: stdin is at EOF
	FrameResize   byte = 6 // client → daemon: big-endian uint16 rows, uint16 cols
	FrameTrace    byte = 7 // daemon → client: JSON spans of a traced exec (lib/trace), before the last frame
	UpgradeHeader      = "lazyfork-exec"
)
