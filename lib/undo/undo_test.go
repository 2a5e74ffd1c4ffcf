package undo

import (
	"errors"
	"testing"
)

func TestRunReversesAndJoins(t *testing.T) {
	var s Stack
	var order []int
	e1, e3 := errors.New("one"), errors.New("three")
	s.Push(func() error { order = append(order, 1); return e1 })
	s.Push(func() error { order = append(order, 2); return nil })
	s.Push(func() error { order = append(order, 3); return e3 })
	err := s.Run()
	if len(order) != 3 || order[0] != 3 || order[2] != 1 || !errors.Is(err, e1) || !errors.Is(err, e3) {
		t.Errorf("order %v, err %v", order, err)
	}
	if len(s) != 0 || s.Run() != nil {
		t.Error("the stack is not empty after Run")
	}
}
