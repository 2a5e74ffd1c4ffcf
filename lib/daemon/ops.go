package daemon

import "net/http"

// The routes that only call the service are tables of operations (treeRoutes, the
// container routes in New): these make each handler, so the body check and the reply are
// written once.

// op is one operation: the request's path values and context in, its answer out.
type op func(r *http.Request) (any, error)

// query answers a read (GET: no body to check).
func query(f op) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := f(r)
		reply(w, http.StatusOK, v, err)
	}
}

// action answers an operation without parameters: the body must be empty or {}.
func (s *Server) action(f op) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.noBody(w, r) {
			return
		}
		v, err := f(r)
		reply(w, http.StatusOK, v, err)
	}
}

// withBody answers an operation whose parameters are a JSON body of type Req (empty
// allowed when optional), with status on success.
func withBody[Req any](s *Server, status int, optional bool, f func(r *http.Request, req Req) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if !s.body(w, r, &req, optional) {
			return
		}
		v, err := f(r, req)
		reply(w, status, v, err)
	}
}
