package budget

import (
	"testing"

	"pgregory.net/rapid"
)

type rapidSource struct{ t *rapid.T }

func (s rapidSource) intn(label string, lo, hi int) int {
	return rapid.IntRange(lo, hi).Draw(s.t, label)
}

// TestProperties drives random trees through every operation the way a caller must and
// checks the invariants after each step (see machine_test.go): a protected node is
// never in a plan; after an applied operation the usage is within budget, or the
// operation failed and changed nothing; eviction never deletes; every resume is within
// the chain-depth bound; plans are deterministic and never mutate.
func TestProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := newMachine(rapidSource{rt}, rt.Fatalf)
		m.run(rapid.IntRange(1, 60).Draw(rt, "steps"))
	})
}

// byteSource reads the fuzzer's bytes as choices; once they run out every choice is lo.
type byteSource struct{ b []byte }

func (s *byteSource) intn(_ string, lo, hi int) int {
	if len(s.b) == 0 || hi <= lo {
		return lo
	}
	v := int(s.b[0])
	if hi-lo > 255 && len(s.b) > 1 {
		v = v<<8 | int(s.b[1])
		s.b = s.b[1:]
	}
	s.b = s.b[1:]
	return lo + v%(hi-lo+1)
}

// FuzzOperations checks the same invariants on operation sequences the fuzzer writes.
// Plain `go test` runs the seeds.
func FuzzOperations(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{2, 0, 100, 0, 1, 50, 5, 10, 0, 0, 0, 3, 9, 0, 0, 7, 0, 0, 0, 8, 1, 0, 3, 0})
	f.Add([]byte{8, 0, 10, 0, 20, 1, 5, 5, 0, 0, 0, 0, 3, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 1})
	f.Add([]byte{1, 1, 1, 1, 0, 4, 1, 1, 1, 1, 2, 2, 2, 2, 10, 9, 9, 9, 9, 7, 7, 7, 11, 11, 3, 4, 6, 6, 6})
	f.Add([]byte("the quick brown fox jumps over the lazy dog, twice: the quick brown fox"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m := newMachine(&byteSource{b: data}, t.Fatalf)
		m.run(len(data)/3 + 1)
	})
}
