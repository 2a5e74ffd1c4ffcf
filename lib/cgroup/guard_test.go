package cgroup

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckOwned(t *testing.T) {
	setParent(t, "")
	good := []Paths{
		{"unified": "/lazyfork/abc"},
		{"unified": "/user.slice/session-1.scope/lazyfork/0123456789ab"},
		{"memory": "/process_api/x/lazyfork/c1", "pids": "/lazyfork/c1", "freezer": "/lazyfork/c1"},
	}
	for _, p := range good {
		if err := CheckOwned(p); err != nil {
			t.Errorf("CheckOwned(%v): %v", p, err)
		}
	}
	bad := []Paths{
		{"unified": "/system.slice"},
		{"unified": "/"},
		{"unified": "/system.slice/docker.service"},
		{"unified": "../../system.slice"},
		{"unified": "/lazyfork/../../system.slice"},
		{"unified": "/lazyfork/x/../../system.slice"},
		{"unified": "/lazyfork/"},
		{"unified": "/lazyfork"},
		{"unified": "lazyfork/x"},
		{"unified": "/lazyfork/.."},
		{"unified": "/lazyfork/x/child"},
		{"memory": "/lazyfork/c1", "pids": "/system.slice", "freezer": "/lazyfork/c1"},
		{},
	}
	for _, p := range bad {
		err := CheckOwned(p)
		if !errors.Is(err, ErrForeign) {
			t.Errorf("CheckOwned(%v) = %v, want ErrForeign", p, err)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("CheckOwned(%v): not one line: %q", p, err)
		}
	}
	if _, err := LoadOwned(Paths{"unified": "/system.slice"}); !errors.Is(err, ErrForeign) {
		t.Errorf("LoadOwned(/system.slice) = %v", err)
	}
	// The environment is the mains' to read: it alone widens nothing.
	t.Setenv(ParentEnv, "/delegated/grp")
	if err := CheckOwned(Paths{"unified": "/delegated/grp/c1"}); err == nil {
		t.Errorf("$%s read by the library", ParentEnv)
	}
	// The operator's configured parent counts, stage input cannot widen it.
	setParent(t, "/delegated/grp")
	if err := CheckOwned(Paths{"unified": "/delegated/grp/c1"}); err != nil {
		t.Errorf("group under the configured parent refused: %v", err)
	}
	if err := CheckOwned(Paths{"unified": "/delegated/c1"}); err == nil {
		t.Errorf("group beside the configured parent accepted")
	}
	for _, p := range []string{"/", "/system.slice"} {
		if err := CheckParent(p); err == nil {
			t.Errorf("CheckParent(%s) accepted", p)
		}
	}
	for _, p := range []string{"", "/delegated/grp", "/x/lazyfork"} {
		if err := CheckParent(p); err != nil {
			t.Errorf("CheckParent(%s): %v", p, err)
		}
	}
	setParent(t, "/")
	if err := CheckOwned(Paths{"unified": "/system.slice"}); err == nil {
		t.Errorf("operator's parent / made /system.slice ours")
	}
}
