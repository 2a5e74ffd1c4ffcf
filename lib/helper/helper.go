// Package helper is the code of lazyfork-helper (cmd/lazyfork-helper), the small binary
// LazyFork starts to become a command inside a container (ExecArg). Every exec pays its
// start, so it imports little: a helper built from the whole lazyfork binary took ~9 ms of
// CPU to reach main (runtime set-up and the package inits of 26.8 MB), this one ~2 ms.
// Test binaries dispatch it too (lib/testutil), so the same code runs under `go test`.
package helper

import (
	"os"
	"runtime"
)

// Maybe runs the helper this process was started as (os.Args[1] names it) and never
// returns then; otherwise it returns at once. Call it first thing in main (and TestMain).
func Maybe() {
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[1] {
	case ExecArg:
		// Namespaces, root and capabilities are per thread: all of it, and the execve, on
		// this one.
		runtime.LockOSThread()
		execMain()
	}
}

// Is reports whether arg names one of the helpers.
func Is(arg string) bool { return arg == ExecArg }
