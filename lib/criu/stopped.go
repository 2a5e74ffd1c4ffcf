package criu

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/lazyfork/lazyfork/lib/procfs"
)

// StoppedTask returns the first task of the freezer group in dir that is stopped (SIGSTOP,
// SIGTSTP: state T) or stopped by a tracer (t), with its command name; 0 if there is none.
//
// Why it matters: CRIU seizes a frozen group's tasks with ptrace, and on a frozen cgroup-v1
// group ptrace_attach of a task in group stop never completes (the task cannot reach its
// trap while frozen): the dump sat in state D until its deadline. Such trees are dumped
// with CRIU's own ptrace freezing instead, which handles stopped tasks.
func StoppedTask(dir string) (int, string) {
	var tids []byte
	for _, name := range []string{"tasks", "cgroup.threads"} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err == nil {
			tids = b
			break
		}
	}
	for _, f := range strings.Fields(string(tids)) {
		tid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		st, err := procfs.ReadStat(tid)
		if err != nil {
			continue // gone
		}
		if st.State == 'T' || st.State == 't' {
			return tid, st.Comm
		}
	}
	return 0, ""
}
