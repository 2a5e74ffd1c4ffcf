package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/lazyfork/lazyfork/lib/budget"
	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/exitcode"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/guard"
	"github.com/lazyfork/lazyfork/lib/hook"
	"github.com/lazyfork/lazyfork/lib/image"
	"github.com/lazyfork/lazyfork/lib/resolve"
	"github.com/lazyfork/lazyfork/lib/snaptree"
	"github.com/lazyfork/lazyfork/lib/store"
)

// errorKinds are the errors the API answers with a code of their own, first match wins.
var errorKinds = []struct {
	errs   []error
	code   string
	status int
}{
	{[]error{guard.ErrBusy}, client.CodeBusy, http.StatusConflict},
	{[]error{store.ErrNotFound}, client.CodeNotFound, http.StatusNotFound},
	{[]error{resolve.ErrAmbiguous}, client.CodeAmbiguous, http.StatusConflict},
	{[]error{store.ErrNameInUse}, client.CodeNameInUse, http.StatusConflict},
	{[]error{store.ErrBadName}, client.CodeInvalidName, http.StatusBadRequest},
	{[]error{image.ErrNotFound}, client.CodeImageNotFound, http.StatusNotFound},
	{[]error{fork.ErrAllocator}, client.CodeAllocator, http.StatusUnprocessableEntity},
	{[]error{hook.ErrNoAnswer}, client.CodeHookNoAnswer, http.StatusGatewayTimeout},
	{[]error{hook.ErrRefused}, client.CodeHookRefused, http.StatusConflict},
	{[]error{budget.ErrOverBudget}, client.CodeOverBudget, http.StatusConflict},
	{[]error{snaptree.ErrNoTree, snaptree.ErrNotMember}, client.CodeNotFound, http.StatusNotFound},
	{[]error{snaptree.ErrDropped, budget.ErrState}, client.CodeInvalidState, http.StatusConflict},
	{[]error{budget.ErrInvalid}, client.CodeBadRequest, http.StatusBadRequest},
	{[]error{context.Canceled}, client.CodeCanceled, 499},
}

// APIError gives any error of an operation its HTTP status and stable code.
func APIError(err error) *client.Error {
	var ce *client.Error
	if errors.As(err, &ce) {
		if ce.Status == 0 {
			ce.Status = http.StatusInternalServerError
		}
		return ce
	}
	msg := err.Error()
	var se *guard.StateError
	if errors.As(err, &se) {
		return &client.Error{Status: http.StatusConflict, Code: client.CodeInvalidState, Message: msg}
	}
	for _, k := range errorKinds {
		for _, target := range k.errs {
			if errors.Is(err, target) {
				return &client.Error{Status: k.status, Code: k.code, Message: msg}
			}
		}
	}
	// Any other error a lib package typed with an exit status (lib/exitcode) gets the
	// status and code the client maps back to that same exit status
	// (client.Error.ExitCode), so a command exits alike with or without a daemon.
	code, status := client.CodeFailed, http.StatusInternalServerError
	var c exitcode.Coder
	if errors.As(err, &c) {
		switch c.ExitCode() {
		case exitcode.NotFound:
			code, status = client.CodeNotFound, http.StatusNotFound
		case exitcode.InvalidState:
			code, status = client.CodeInvalidState, http.StatusConflict
		case exitcode.Busy:
			code, status = client.CodeBusy, http.StatusConflict
		case exitcode.Usage:
			code, status = client.CodeBadRequest, http.StatusBadRequest
		}
	}
	return &client.Error{Status: status, Code: code, Message: msg}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	e := APIError(err)
	writeJSON(w, e.Status, e)
}

// decodeBody reads a JSON object into v. An empty body leaves v as it is when optional.
// Unknown fields, wrong types, trailing data and bodies over max are errors that name
// the problem.
func decodeBody(w http.ResponseWriter, r *http.Request, max int64, v any, optional bool) error {
	r.Body = http.MaxBytesReader(w, r.Body, max)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var (
		syn  *json.SyntaxError
		typ  *json.UnmarshalTypeError
		big  *http.MaxBytesError
		what = "request body"
	)
	switch {
	case err == nil:
	case errors.As(err, &big):
		return client.Errorf(http.StatusRequestEntityTooLarge, client.CodeTooLarge, "%s is larger than %d bytes", what, max)
	case errors.Is(err, io.EOF):
		if optional {
			return nil
		}
		return client.Errorf(http.StatusBadRequest, client.CodeBadJSON, "%s is empty: send a JSON object", what)
	case errors.As(err, &syn), errors.Is(err, io.ErrUnexpectedEOF):
		return client.Errorf(http.StatusBadRequest, client.CodeBadJSON, "%s is not valid JSON: %v", what, err)
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			return client.Errorf(http.StatusBadRequest, client.CodeBadRequest, "%s must be a JSON object, not %s", what, typ.Value)
		}
		return client.Errorf(http.StatusBadRequest, client.CodeBadRequest, "field %q must be %s, not %s", field, jsonKind(typ.Type.Kind().String()), typ.Value)
	default:
		return client.Errorf(http.StatusBadRequest, client.CodeBadRequest, "%s: %v", what, err)
	}
	if dec.More() {
		return client.Errorf(http.StatusBadRequest, client.CodeBadJSON, "%s has data after the JSON object", what)
	}
	if _, err := dec.Token(); err != io.EOF {
		var big *http.MaxBytesError
		if errors.As(err, &big) {
			return client.Errorf(http.StatusRequestEntityTooLarge, client.CodeTooLarge, "%s is larger than %d bytes", what, max)
		}
		return client.Errorf(http.StatusBadRequest, client.CodeBadJSON, "%s has data after the JSON object", what)
	}
	return nil
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "slice", "array":
		return "an array"
	case "bool":
		return "true or false"
	case "struct", "map":
		return "an object"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer"
	case "float32", "float64":
		return "a number"
	}
	return fmt.Sprintf("a %s", goKind)
}
