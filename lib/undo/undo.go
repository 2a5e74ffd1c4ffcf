// Package undo is the one stack of clean-up steps an operation builds as it makes things
// (mounts, cgroups, files, records) and runs in reverse when it fails half-way.
package undo

import "errors"

// Stack holds the steps, last pushed first run.
type Stack []func() error

// Push adds a step.
func (s *Stack) Push(f func() error) { *s = append(*s, f) }

// Run runs every step in reverse order, joins their errors and empties the stack.
func (s *Stack) Run() error {
	var errs []error
	for i := len(*s) - 1; i >= 0; i-- {
		if err := (*s)[i](); err != nil {
			errs = append(errs, err)
		}
	}
	*s = nil
	return errors.Join(errs...)
}
