// Package trace records how long the steps of one operation took (spans): the
// porcelain's --trace prints them, and a daemon asked to trace a request sends its own
// back with the answer (docs/api.md, "Tracing"). Without a recorder in the context every
// call is a no-op, so the lib steps call it unconditionally.
package trace

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"
)

// Header asks the daemon to trace a request ("1") and carries its spans back as JSON.
const Header = "Lazyfork-Trace"

// maxSpans bounds what one recorder keeps (a batch of 1,000 forks makes ~20,000).
const maxSpans = 100000

// Span is one timed step. Start is from the recorder's start (the command's, or the
// request's arrival at the daemon); Depth is how many spans enclose it.
type Span struct {
	Name    string  `json:"name"`
	StartMs float64 `json:"start_ms"`
	Ms      float64 `json:"ms"`
	Depth   int     `json:"depth,omitempty"`
}

// Recorder collects the spans of one operation; safe for concurrent use.
type Recorder struct {
	mu    sync.Mutex
	t0    time.Time
	spans []Span
}

// New returns a recorder whose clock starts now.
func New() *Recorder { return &Recorder{t0: time.Now()} }

type recKey struct{}
type depthKey struct{}

// With returns ctx carrying r (nil: no tracing).
func With(ctx context.Context, r *Recorder) context.Context {
	if r == nil {
		return ctx
	}
	return context.WithValue(ctx, recKey{}, r)
}

// From is ctx's recorder, nil when the operation is not traced.
func From(ctx context.Context) *Recorder {
	r, _ := ctx.Value(recKey{}).(*Recorder)
	return r
}

func depth(ctx context.Context) int {
	d, _ := ctx.Value(depthKey{}).(int)
	return d
}

// Start opens a span: the steps run with the returned ctx nest under it; end closes it.
func Start(ctx context.Context, name string) (_ context.Context, end func()) {
	r := From(ctx)
	if r == nil {
		return ctx, func() {}
	}
	d, begin := depth(ctx), time.Now()
	return context.WithValue(ctx, depthKey{}, d+1), func() { r.add(name, begin, time.Since(begin), d) }
}

// Step times one step that opens no nested spans: defer trace.Step(ctx, "x")().
func Step(ctx context.Context, name string) (end func()) {
	_, end = Start(ctx, name)
	return end
}

// Add records a step timed elsewhere (CRIU's own statistics) that began at begin.
func Add(ctx context.Context, name string, begin time.Time, d time.Duration) {
	if r := From(ctx); r != nil {
		r.add(name, begin, d, depth(ctx))
	}
}

func (r *Recorder) add(name string, begin time.Time, d time.Duration, depth int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.spans) < maxSpans {
		r.spans = append(r.spans, Span{Name: name, StartMs: ms(begin.Sub(r.t0)), Ms: ms(d), Depth: depth})
	}
}

// Merge adds spans recorded elsewhere (the daemon's) whose clock started at begin, as
// children of ctx's current span, their names prefixed.
func Merge(ctx context.Context, begin time.Time, prefix string, spans []Span) {
	r := From(ctx)
	if r == nil {
		return
	}
	off, d := ms(begin.Sub(r.t0)), depth(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range spans {
		if len(r.spans) >= maxSpans {
			break
		}
		s.StartMs += off
		s.Depth += d
		s.Name = prefix + s.Name
		r.spans = append(r.spans, s)
	}
}

// Spans returns the spans so far, by start time (enclosing spans before their children).
func (r *Recorder) Spans() []Span {
	r.mu.Lock()
	out := append([]Span(nil), r.spans...)
	r.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].StartMs != out[j].StartMs {
			return out[i].StartMs < out[j].StartMs
		}
		return out[i].Depth < out[j].Depth
	})
	return out
}

// JSON is the spans as the daemon sends them (Header, the exec stream's trace frame).
func (r *Recorder) JSON() []byte {
	b, _ := json.Marshal(r.Spans())
	return b
}

// Decode reads spans sent by a daemon; bad input gives none.
func Decode(b []byte) []Span {
	var s []Span
	if json.Unmarshal(b, &s) != nil {
		return nil
	}
	return s
}

// Write prints the spans for people: start and length in ms, nested steps indented.
func (r *Recorder) Write(w io.Writer) {
	fmt.Fprintf(w, "%9s %9s  %s\n", "start ms", "ms", "step")
	for _, s := range r.Spans() {
		fmt.Fprintf(w, "%9.1f %9.1f  %s%s\n", s.StartMs, s.Ms, strings.Repeat("  ", s.Depth), s.Name)
	}
	fmt.Fprintf(w, "%9.1f %9s  (since the recorder started)\n", ms(time.Since(r.t0)), "")
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
