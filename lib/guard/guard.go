// Package guard is what every entry point (stage binaries, porcelain, daemon) checks
// before it changes a container: the container's lock, so that `lf-dump c1` and
// `lazyfork stop c1` run one after the other, and the state machine, so that an
// operation on a container in the wrong state fails with one typed error, whoever asked.
package guard

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/lazyfork/lazyfork/lib/exitcode"
	"github.com/lazyfork/lazyfork/lib/store"
)

// Op is an operation on a container.
type Op string

// The operations the state machine knows.
const (
	OpDump   Op = "dump"
	OpFork   Op = "fork"
	OpStop   Op = "stop"
	OpStart  Op = "start"
	OpFreeze Op = "freeze"
	OpThaw   Op = "thaw"
	OpExec   Op = "exec"
	OpDelete Op = "delete"
)

// Transitions is the state machine: for each operation, the states it applies to and the
// state the container is in afterwards. A state absent from an operation's row is an
// invalid transition (*StateError).
var Transitions = map[Op]map[string]string{
	OpDump:   {store.StateRunning: store.StateRunning},
	OpFork:   {store.StateRunning: store.StateRunning, store.StateStopped: store.StateStopped},
	OpStop:   {store.StateRunning: store.StateStopped},
	OpStart:  {store.StateStopped: store.StateRunning},
	OpFreeze: {store.StateRunning: store.StateFrozen},
	OpThaw:   {store.StateFrozen: store.StateRunning},
	OpExec:   {store.StateRunning: store.StateRunning},
	OpDelete: {
		store.StateRunning: "", store.StateFrozen: "", store.StateStopped: "",
		store.StateExited: "", store.StateCreating: "",
	},
}

// ErrInvalidState is what every *StateError matches with errors.Is.
var ErrInvalidState = errors.New("invalid state")

// StateError is an operation refused because of the container's state.
type StateError struct {
	Op        Op
	State     string // the container's live state when the operation was refused
	Container string // name, or id
}

func (e *StateError) Error() string {
	n := e.Container
	msg := fmt.Sprintf("%s %s: it is %s", e.Op, n, e.State)
	switch {
	case e.State == store.StateFrozen:
		return msg + fmt.Sprintf("; run `lazyfork thaw %s` first", n)
	case e.State == store.StateStopped && (e.Op == OpDump || e.Op == OpStop):
		return msg + fmt.Sprintf("; its snapshot is already restorable (`lazyfork fork %s` or `lazyfork start %s`)", n, n)
	case e.State == store.StateStopped:
		return msg + fmt.Sprintf("; run `lazyfork start %s` first", n)
	case e.State == store.StateExited:
		return msg + fmt.Sprintf(" (its command ended): see `lazyfork attach %s`, or delete it", n)
	case e.State == store.StateCreating:
		return msg + "; wait until it is created"
	}
	return msg + "; it must be " + strings.Join(Allowed(e.Op), " or ")
}

// ExitCode is the status a command exits with on this error.
func (e *StateError) ExitCode() int { return exitcode.InvalidState }

// Is makes errors.Is(err, ErrInvalidState) true for every *StateError.
func (e *StateError) Is(target error) bool { return target == ErrInvalidState }

// Allowed lists the states op applies to, sorted.
func Allowed(op Op) []string {
	var out []string
	for st := range Transitions[op] {
		out = append(out, st)
	}
	slices.Sort(out)
	return out
}

// Check returns a *StateError unless op applies to a container in state (its live state,
// runtime.State). An operation not in the table is a programming error and refused too.
func Check(op Op, c *store.Container, state string) error {
	if _, ok := Transitions[op][state]; ok {
		return nil
	}
	return &StateError{Op: op, State: state, Container: c.Display()}
}
