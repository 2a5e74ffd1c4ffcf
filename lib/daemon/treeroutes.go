package daemon

import (
	"encoding/json"
	"net/http"

	"github.com/lazyfork/lazyfork/lib/client"
)

// treeRoutes are the snapshot-tree routes (docs/api.md, "Snapshot trees").
func (s *Server) treeRoutes() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		"GET /v1/trees":                                s.listTrees,
		"POST /v1/trees":                               s.createTree,
		"GET /v1/trees/{tree}":                         s.getTree,
		"DELETE /v1/trees/{tree}":                      s.dropTree,
		"GET /v1/trees/{tree}/nodes":                   s.treeNodes,
		"GET /v1/trees/{tree}/watch":                   s.watchTree,
		"POST /v1/trees/{tree}/evict":                  s.evictTree,
		"POST /v1/trees/{tree}/budget":                 s.setTreeBudget,
		"GET /v1/trees/{tree}/nodes/{node}":            s.treeNode,
		"DELETE /v1/trees/{tree}/nodes/{node}":         s.pruneNode,
		"POST /v1/trees/{tree}/nodes/{node}/fork":      s.forkNode,
		"POST /v1/trees/{tree}/nodes/{node}/prepare":   s.prepareNode,
		"POST /v1/trees/{tree}/nodes/{node}/rollback":  s.rollbackNode,
		"POST /v1/trees/{tree}/nodes/{node}/suspend":   s.suspendNode,
		"POST /v1/trees/{tree}/nodes/{node}/resume":    s.resumeNode,
		"POST /v1/trees/{tree}/nodes/{node}/protect":   s.protectNode,
		"POST /v1/trees/{tree}/nodes/{node}/unprotect": s.unprotectNode,
	}
}

func (s *Server) listTrees(w http.ResponseWriter, r *http.Request) {
	all, err := s.svc.ListTrees(r.Context())
	reply(w, http.StatusOK, all, err)
}

func (s *Server) createTree(w http.ResponseWriter, r *http.Request) {
	var req client.TreeCreateRequest
	if !s.body(w, r, &req, false) {
		return
	}
	t, err := s.svc.CreateTree(r.Context(), req)
	reply(w, http.StatusCreated, t, err)
}

func (s *Server) getTree(w http.ResponseWriter, r *http.Request) {
	t, err := s.svc.GetTree(r.Context(), r.PathValue("tree"))
	reply(w, http.StatusOK, t, err)
}

func (s *Server) dropTree(w http.ResponseWriter, r *http.Request) {
	if !s.noBody(w, r) {
		return
	}
	res, err := s.svc.DropTree(r.Context(), r.PathValue("tree"))
	reply(w, http.StatusOK, res, err)
}

func (s *Server) treeNodes(w http.ResponseWriter, r *http.Request) {
	nodes, err := s.svc.TreeNodes(r.Context(), r.PathValue("tree"))
	reply(w, http.StatusOK, nodes, err)
}

func (s *Server) treeNode(w http.ResponseWriter, r *http.Request) {
	n, err := s.svc.TreeNode(r.Context(), r.PathValue("tree"), r.PathValue("node"))
	reply(w, http.StatusOK, n, err)
}

func (s *Server) evictTree(w http.ResponseWriter, r *http.Request) {
	if !s.noBody(w, r) {
		return
	}
	res, err := s.svc.EvictTree(r.Context(), r.PathValue("tree"))
	reply(w, http.StatusOK, res, err)
}

func (s *Server) setTreeBudget(w http.ResponseWriter, r *http.Request) {
	var req client.TreeBudgetRequest
	if !s.body(w, r, &req, false) {
		return
	}
	res, err := s.svc.SetTreeBudget(r.Context(), r.PathValue("tree"), req)
	reply(w, http.StatusOK, res, err)
}

func (s *Server) forkNode(w http.ResponseWriter, r *http.Request) {
	var req client.TreeForkRequest
	if !s.body(w, r, &req, true) {
		return
	}
	res, err := s.svc.ForkNode(r.Context(), r.PathValue("tree"), r.PathValue("node"), req)
	reply(w, http.StatusOK, res, err)
}

func (s *Server) prepareNode(w http.ResponseWriter, r *http.Request) {
	var req client.TreePrepareRequest
	if !s.body(w, r, &req, true) {
		return
	}
	res, err := s.svc.PrepareNode(r.Context(), r.PathValue("tree"), r.PathValue("node"), req)
	reply(w, http.StatusOK, res, err)
}

func (s *Server) rollbackNode(w http.ResponseWriter, r *http.Request) {
	var req client.TreeRollbackRequest
	if !s.body(w, r, &req, true) {
		return
	}
	res, err := s.svc.RollbackNode(r.Context(), r.PathValue("tree"), r.PathValue("node"), req)
	reply(w, http.StatusOK, res, err)
}

func (s *Server) suspendNode(w http.ResponseWriter, r *http.Request) {
	if !s.noBody(w, r) {
		return
	}
	res, err := s.svc.SuspendNode(r.Context(), r.PathValue("tree"), r.PathValue("node"))
	reply(w, http.StatusOK, res, err)
}

func (s *Server) resumeNode(w http.ResponseWriter, r *http.Request) {
	if !s.noBody(w, r) {
		return
	}
	res, err := s.svc.ResumeNode(r.Context(), r.PathValue("tree"), r.PathValue("node"))
	reply(w, http.StatusOK, res, err)
}

func (s *Server) protectNode(w http.ResponseWriter, r *http.Request) {
	if !s.noBody(w, r) {
		return
	}
	res, err := s.svc.ProtectNode(r.Context(), r.PathValue("tree"), r.PathValue("node"), true)
	reply(w, http.StatusOK, res, err)
}

func (s *Server) unprotectNode(w http.ResponseWriter, r *http.Request) {
	if !s.noBody(w, r) {
		return
	}
	res, err := s.svc.ProtectNode(r.Context(), r.PathValue("tree"), r.PathValue("node"), false)
	reply(w, http.StatusOK, res, err)
}

func (s *Server) pruneNode(w http.ResponseWriter, r *http.Request) {
	if !s.noBody(w, r) {
		return
	}
	res, err := s.svc.PruneNode(r.Context(), r.PathValue("tree"), r.PathValue("node"))
	reply(w, http.StatusOK, res, err)
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
