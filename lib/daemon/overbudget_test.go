package daemon_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/lazyfork/lazyfork/lib/budget"
	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/daemon"
)

// A budget refusal, however wrapped, is 409 over_budget with lib/budget's one line.
func TestOverBudgetCode(t *testing.T) {
	ob := &budget.OverBudgetError{Op: "fork", Node: "n1", Budget: "max_live", Need: 2, Have: 16, Limit: 16}
	e := daemon.APIError(fmt.Errorf("tree t1: %w", ob))
	if e.Status != http.StatusConflict || e.Code != client.CodeOverBudget || e.Message != "tree t1: "+ob.Error() {
		t.Fatalf("%+v", e)
	}
}
