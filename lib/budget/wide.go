package budget

import (
	"math"
	"math/bits"
)

// wide is an unsigned 128-bit sum of non-negative byte counts: a tree of any size sums
// exactly, so no comparison with a budget can be fooled by overflow.
type wide struct{ hi, lo uint64 }

func (w wide) addWide(v wide) wide {
	lo, c := bits.Add64(w.lo, v.lo, 0)
	hi, _ := bits.Add64(w.hi, v.hi, c)
	return wide{hi, lo}
}

// add adds v >= 0 (callers validated it).
func (w wide) add(v int64) wide { return w.addWide(wide{lo: uint64(v)}) }

// sub subtracts v >= 0, flooring at 0.
func (w wide) sub(v int64) wide {
	if w.hi == 0 && w.lo < uint64(v) {
		return wide{}
	}
	lo, b := bits.Sub64(w.lo, uint64(v), 0)
	hi, _ := bits.Sub64(w.hi, 0, b)
	return wide{hi, lo}
}

func (w wide) gt(v int64) bool { return w.hi > 0 || w.lo > uint64(v) }
func (w wide) lt(v int64) bool { return w.hi == 0 && w.lo < uint64(v) }
func (w wide) zero() bool      { return w.hi == 0 && w.lo == 0 }

// int64 saturates at MaxInt64.
func (w wide) int64() int64 {
	if w.hi > 0 || w.lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(w.lo)
}
