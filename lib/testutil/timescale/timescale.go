// Package timescale stretches the deadlines of tests on slow machines: make test-v2 runs
// the suite in an emulated VM (TCG) 5-20x slower than the host. Deadlines only bound a
// wait; no test asserts how long something took.
package timescale

import (
	"os"
	"strconv"
	"time"
)

// Env is the factor (a number >= 1, default 1) every scaled deadline is multiplied by.
const Env = "LF_TEST_TIME_SCALE"

// Scale returns d times $LF_TEST_TIME_SCALE; an unset, unparsable or smaller-than-1 value
// counts as 1.
func Scale(d time.Duration) time.Duration {
	f, err := strconv.ParseFloat(os.Getenv(Env), 64)
	if err != nil || f <= 1 {
		return d
	}
	return time.Duration(float64(d) * f)
}
