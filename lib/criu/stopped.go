package criu

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
		stat, err := os.ReadFile("/proc/" + f + "/stat")
		if err != nil {
			continue // gone
		}
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) {
			continue
		}
		if s := stat[i+2]; s == 'T' || s == 't' {
			comm := ""
			if j := bytes.IndexByte(stat, '('); j >= 0 && j < i {
				comm = string(stat[j+1 : i])
			}
			return tid, comm
		}
	}
	return 0, ""
}
