// Package procfs reads the few /proc files LazyFork needs, in one place.
package procfs

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// Stat is what LazyFork uses of /proc/PID/stat (proc(5)).
type Stat struct {
	Comm      string
	State     byte // R, S, D, T, t, Z, X, ...
	PPid      int
	UTime     uint64 // clock ticks
	STime     uint64
	StartTime uint64 // clock ticks since boot: with the pid, names the process across pid reuse
}

// ReadStat reads /proc/PID/stat (a thread id works too).
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Stat{}, err
	}
	st, err := ParseStat(b)
	if err != nil {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
	}
	return st, nil
}

// ParseStat parses the contents of a stat file. The command name may hold spaces and
// parentheses: the fields after it start after the last ')'.
func ParseStat(b []byte) (Stat, error) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return Stat{}, fmt.Errorf("no command name in %q", b)
	}
	f := bytes.Fields(b[end+1:])
	// f[0] is field 3 (state); starttime is field 22.
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("%d fields after the command name, want at least 20", len(f))
	}
	st := Stat{Comm: string(b[open+1 : end]), State: f[0][0]}
	var err error
	if st.PPid, err = strconv.Atoi(string(f[1])); err != nil {
		return Stat{}, fmt.Errorf("ppid: %w", err)
	}
	for _, v := range []struct {
		dst *uint64
		i   int
	}{{&st.UTime, 11}, {&st.STime, 12}, {&st.StartTime, 19}} {
		if *v.dst, err = strconv.ParseUint(string(f[v.i]), 10, 64); err != nil {
			return Stat{}, fmt.Errorf("field %d: %w", v.i+3, err)
		}
	}
	return st, nil
}
