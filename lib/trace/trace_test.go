package trace

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestNoRecorderIsNoOp(t *testing.T) {
	ctx := context.Background()
	c2, end := Start(ctx, "x")
	end()
	Step(c2, "y")()
	Add(ctx, "z", time.Now(), time.Millisecond)
	Merge(ctx, time.Now(), "d: ", []Span{{Name: "a"}})
	if From(c2) != nil {
		t.Fatal("a recorder appeared from nowhere")
	}
}

func TestNestingAndMerge(t *testing.T) {
	r := New()
	ctx := With(context.Background(), r)
	outer, endOuter := Start(ctx, "outer")
	time.Sleep(2 * time.Millisecond)
	Step(outer, "inner")()
	// The daemon's spans, as its recorder saw them, placed under "outer".
	Merge(outer, time.Now(), "daemon: ", Decode([]byte(`[{"name":"fork","start_ms":1,"ms":5},{"name":"dump","start_ms":1.5,"ms":2,"depth":1}]`)))
	endOuter()
	got := map[string]Span{}
	for _, s := range r.Spans() {
		got[s.Name] = s
	}
	if got["outer"].Depth != 0 || got["inner"].Depth != 1 || got["daemon: fork"].Depth != 1 || got["daemon: dump"].Depth != 2 {
		t.Fatalf("depths: %+v", got)
	}
	if got["outer"].Ms < 2 || got["inner"].StartMs < got["outer"].StartMs {
		t.Fatalf("times: %+v", got)
	}
	if d := got["daemon: dump"].StartMs - got["daemon: fork"].StartMs; d < 0.49 || d > 0.51 {
		t.Fatalf("merged spans keep their offsets: %v apart, want 0.5", d)
	}
	spans := r.Spans()
	if spans[0].Name != "outer" {
		t.Fatalf("the enclosing span comes first: %+v", spans)
	}
	var b bytes.Buffer
	r.Write(&b)
	if !strings.Contains(b.String(), "    daemon: dump") {
		t.Fatalf("nested spans are indented:\n%s", b.String())
	}
	if Decode([]byte("not json")) != nil {
		t.Fatal("bad input decodes to spans")
	}
}
