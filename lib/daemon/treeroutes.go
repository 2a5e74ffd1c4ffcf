package daemon

import (
	"encoding/json"
	"net/http"

	"github.com/lazyfork/lazyfork/lib/client"
)

// treeRoutes are the snapshot-tree routes (docs/api.md, "Snapshot trees").
func (s *Server) treeRoutes() map[string]http.HandlerFunc {
	tree := func(r *http.Request) string { return r.PathValue("tree") }
	node := func(r *http.Request) string { return r.PathValue("node") }
	return map[string]http.HandlerFunc{
		"GET /v1/trees": query(func(r *http.Request) (any, error) { return s.svc.ListTrees(r.Context()) }),
		"POST /v1/trees": withBody(s, http.StatusCreated, false, func(r *http.Request, req client.TreeCreateRequest) (any, error) {
			return s.svc.CreateTree(r.Context(), req)
		}),
		"GET /v1/trees/{tree}":        query(func(r *http.Request) (any, error) { return s.svc.GetTree(r.Context(), tree(r)) }),
		"DELETE /v1/trees/{tree}":     s.action(func(r *http.Request) (any, error) { return s.svc.DropTree(r.Context(), tree(r)) }),
		"GET /v1/trees/{tree}/nodes":  query(func(r *http.Request) (any, error) { return s.svc.TreeNodes(r.Context(), tree(r)) }),
		"GET /v1/trees/{tree}/watch":  s.watchTree,
		"POST /v1/trees/{tree}/evict": s.action(func(r *http.Request) (any, error) { return s.svc.EvictTree(r.Context(), tree(r)) }),
		"POST /v1/trees/{tree}/budget": withBody(s, http.StatusOK, false, func(r *http.Request, req client.TreeBudgetRequest) (any, error) {
			return s.svc.SetTreeBudget(r.Context(), tree(r), req)
		}),
		"GET /v1/trees/{tree}/nodes/{node}": query(func(r *http.Request) (any, error) {
			return s.svc.TreeNode(r.Context(), tree(r), node(r))
		}),
		"DELETE /v1/trees/{tree}/nodes/{node}": s.action(func(r *http.Request) (any, error) {
			return s.svc.PruneNode(r.Context(), tree(r), node(r))
		}),
		"POST /v1/trees/{tree}/nodes/{node}/fork": withBody(s, http.StatusOK, true, func(r *http.Request, req client.TreeForkRequest) (any, error) {
			return s.svc.ForkNode(r.Context(), tree(r), node(r), req)
		}),
		"POST /v1/trees/{tree}/nodes/{node}/prepare": withBody(s, http.StatusOK, true, func(r *http.Request, req client.TreePrepareRequest) (any, error) {
			return s.svc.PrepareNode(r.Context(), tree(r), node(r), req)
		}),
		"POST /v1/trees/{tree}/nodes/{node}/rollback": withBody(s, http.StatusOK, true, func(r *http.Request, req client.TreeRollbackRequest) (any, error) {
			return s.svc.RollbackNode(r.Context(), tree(r), node(r), req)
		}),
		"POST /v1/trees/{tree}/nodes/{node}/suspend": s.action(func(r *http.Request) (any, error) {
			return s.svc.SuspendNode(r.Context(), tree(r), node(r))
		}),
		"POST /v1/trees/{tree}/nodes/{node}/resume": s.action(func(r *http.Request) (any, error) {
			return s.svc.ResumeNode(r.Context(), tree(r), node(r))
		}),
		"POST /v1/trees/{tree}/nodes/{node}/protect": s.action(func(r *http.Request) (any, error) {
			return s.svc.ProtectNode(r.Context(), tree(r), node(r), true)
		}),
		"POST /v1/trees/{tree}/nodes/{node}/unprotect": s.action(func(r *http.Request) (any, error) {
			return s.svc.ProtectNode(r.Context(), tree(r), node(r), false)
		}),
	}
}

// watchTree streams the tree as it is, then one event per mutation of it, as JSON lines,
// until the client hangs up, the tree's root is pruned ({"end": "removed"}), the
// watcher falls too far behind or the daemon stops.
func (s *Server) watchTree(w http.ResponseWriter, r *http.Request) {
	t, ch, cancel, err := s.svc.WatchTree(r.Context(), r.PathValue("tree"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer cancel()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	gw := s.guardStream(w)
	defer gw.done()
	enc := json.NewEncoder(gw)
	send := func(m client.TreeWatchMessage) bool {
		if enc.Encode(m) != nil {
			return false
		}
		gw.Flush()
		return true
	}
	if !send(client.TreeWatchMessage{Tree: t}) {
		return
	}
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				send(client.TreeWatchMessage{Error: client.Errorf(http.StatusServiceUnavailable, client.CodeFailed,
					"watch of tree %s: the client fell more than 256 events behind and was dropped: watch again", t.ID)})
				return
			}
			if e.Tree != t.ID {
				continue
			}
			if !send(client.TreeWatchMessage{Event: &e}) {
				return
			}
			if e.Kind == "prune" && e.Node == t.Root {
				send(client.TreeWatchMessage{End: "removed"})
				return
			}
		case <-r.Context().Done():
			return
		case <-s.streams:
			send(client.TreeWatchMessage{End: "shutdown"})
			return
		}
	}
}
