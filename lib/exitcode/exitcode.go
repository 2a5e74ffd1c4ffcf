// Package exitcode is the exit status every stage binary and the porcelain give an error
// (docs/stages.md, "Exit status"). lib packages mark their errors with the kinds here;
// only main turns them into a status (Of). It imports nothing of the project, so the
// smallest stage links it at no cost.
package exitcode

import "errors"

// Exit statuses.
const (
	OK           = 0
	Failed       = 1 // the operation failed (CRIU, mounts, a refused document, ...)
	Usage        = 2 // bad flags or arguments
	NotFound     = 3 // no such container, snapshot or image
	InvalidState = 4 // the container's state does not allow the operation
	Busy         = 5 // another operation held the container past the wait
)

// Coder is an error that knows its exit status.
type Coder interface{ ExitCode() int }

// Of is err's exit status: OK for nil, the status of the first Coder in its chain,
// else Failed.
func Of(err error) int {
	if err == nil {
		return OK
	}
	var c Coder
	if errors.As(err, &c) {
		return c.ExitCode()
	}
	return Failed
}

// Kind is a sentinel error with an exit status, compared by value (errors.Is).
type Kind struct {
	Msg  string
	Code int
}

func (k Kind) Error() string { return k.Msg }

// ExitCode is the status of errors of this kind.
func (k Kind) ExitCode() int { return k.Code }

// NewNotFound makes a sentinel for something missing.
func NewNotFound(msg string) error { return Kind{Msg: msg, Code: NotFound} }

// With gives err the exit status code (nil stays nil).
func With(err error, code int) error {
	if err == nil {
		return nil
	}
	return coded{err, code}
}

type coded struct {
	error
	code int
}

func (c coded) ExitCode() int { return c.code }
func (c coded) Unwrap() error { return c.error }
