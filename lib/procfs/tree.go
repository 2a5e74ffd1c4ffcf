package procfs

import (
	"os"
	"strconv"
	"strings"
)

// Descendants lists pid and every process below it, parents before their children, from
// each thread's /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN, which CRIU needs too).
// A process that exits meanwhile is simply missing; at most limit processes are listed.
func Descendants(pid, limit int) []int {
	out := []int{pid}
	for i := 0; i < len(out) && len(out) < limit; i++ {
		dir := "/proc/" + strconv.Itoa(out[i]) + "/task/"
		tasks, _ := os.ReadDir(dir)
		for _, t := range tasks {
			b, _ := os.ReadFile(dir + t.Name() + "/children")
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil && len(out) < limit {
					out = append(out, c)
				}
			}
		}
	}
	return out
}
