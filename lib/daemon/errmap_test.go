package daemon_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/lazyfork/lazyfork/lib/budget"
	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/daemon"
	"github.com/lazyfork/lazyfork/lib/exitcode"
	"github.com/lazyfork/lazyfork/lib/guard"
	"github.com/lazyfork/lazyfork/lib/resolve"
	"github.com/lazyfork/lazyfork/lib/snaptree"
)

// Typed lib errors get their HTTP status in one place (daemon.APIError), and the client
// maps the answer back to the exit status the same error gives in-process.
func TestTypedErrorsMapAlike(t *testing.T) {
	bt, err := budget.New(budget.Budget{MaxLive: 1, MaxRAMBytes: 100, MaxDiskBytes: 100, MaxChainDepth: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := bt.ApplyAdd("", budget.Node{ID: "r", RAMBytes: 10}); err != nil {
		t.Fatal(err)
	}
	if err := bt.SetProtected("r", true); err != nil {
		t.Fatal(err)
	}
	_, errState := bt.PlanResume("r", 1)      // r is live
	_, errUnknown := bt.PlanResume("nope", 1) // no such node
	_, errInvalid := bt.PlanAdd("r", 0, 1, 1) // no nodes
	errBudget := budget.Budget{}.Validate()
	_, errChange := bt.PlanBudget(budget.Budget{MaxLive: 1, MaxRAMBytes: 5, MaxDiskBytes: 100})
	_, _, errAmbiguousTree := resolve.Find([]string{"ab01", "ab02"}, "ab", "tree", 2, func(id string) (string, string) { return id, "" })
	for _, c := range []struct {
		err    error
		status int
		code   string
		exit   int
	}{
		{fmt.Errorf("tree t1: %w", snaptree.ErrNoTree), http.StatusNotFound, client.CodeNotFound, exitcode.NotFound},
		{fmt.Errorf("tree t1: x: %w", snaptree.ErrNotMember), http.StatusNotFound, client.CodeNotFound, exitcode.NotFound},
		{fmt.Errorf("tree t1: %w", snaptree.ErrDropped), http.StatusConflict, client.CodeInvalidState, exitcode.InvalidState},
		{errState, http.StatusConflict, client.CodeInvalidState, exitcode.InvalidState},
		{errUnknown, http.StatusNotFound, client.CodeNotFound, exitcode.NotFound},
		{errInvalid, http.StatusBadRequest, client.CodeBadRequest, exitcode.Usage},
		{fmt.Errorf("tree budget: %w", errBudget), http.StatusBadRequest, client.CodeBadRequest, exitcode.Usage},
		{errChange, http.StatusConflict, client.CodeOverBudget, exitcode.Failed},
		{fmt.Errorf("lock: %w", guard.ErrBusy), http.StatusConflict, client.CodeBusy, exitcode.Busy},
		// An ambiguous prefix of a tree's id is the usage error a container's is.
		{errAmbiguousTree, http.StatusConflict, client.CodeAmbiguous, exitcode.Usage},
		// Any error a lib package gives an exit status (lib/snaptree's invalid states and
		// bad requests are these).
		{exitcode.With(errors.New("prepare n1: it is suspended; resume it first"), exitcode.InvalidState), http.StatusConflict, client.CodeInvalidState, exitcode.InvalidState},
		{exitcode.With(errors.New("fork: -n must be at least 1"), exitcode.Usage), http.StatusBadRequest, client.CodeBadRequest, exitcode.Usage},
		{errors.New("criu failed"), http.StatusInternalServerError, client.CodeFailed, exitcode.Failed},
	} {
		if c.err == nil {
			t.Fatalf("case %+v: no error to map", c)
		}
		e := daemon.APIError(c.err)
		if e.Status != c.status || e.Code != c.code || e.Message != c.err.Error() {
			t.Errorf("%v: %d %s %q, want %d %s", c.err, e.Status, e.Code, e.Message, c.status, c.code)
		}
		if got, local := e.ExitCode(), exitcode.Of(c.err); got != c.exit || local != c.exit {
			t.Errorf("%v: exit %d through the daemon, %d in-process, want %d", c.err, got, local, c.exit)
		}
	}
}
