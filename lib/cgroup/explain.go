package cgroup

import (
	"fmt"
	"io"
)

// Explain tells what operation op ("create", "stats", "procs", "freeze", "thaw", "kill",
// "remove") did to the group, with the group's real directories (lf-cgroup --explain).
func (c *Cgroup) Explain(w io.Writer, op string) {
	var dirs []string
	for _, k := range c.keys() {
		if d, err := c.dir(k); err == nil {
			dirs = append(dirs, k+": "+d)
		}
	}
	ver := "v1 (one directory per controller hierarchy)"
	state := "freezer.state"
	if c.V2 {
		ver, state = "v2 (one directory, every controller)", "cgroup.freeze"
	}
	if op != "create" {
		fmt.Fprintf(w, "read: group %s (checked to be one of LazyFork's before anything was touched), cgroup %s\n", c.Name, ver)
	}
	switch op {
	case "create":
		fmt.Fprintf(w, "made group %s, cgroup %s, refusing one that exists (it may hold processes or be frozen):\n", c.Name, ver)
	case "stats":
		fmt.Fprintf(w, "read its memory charge, task count and freezer state (nothing changed) in:\n")
	case "procs":
		fmt.Fprintf(w, "read cgroup.procs (nothing changed) in:\n")
	case "freeze":
		fmt.Fprintf(w, "froze every task: wrote %s in %s and waited (5 s at most) until the kernel reported the group frozen; CRIU dumps a frozen group as one consistent instant\n", state, c.FreezerDir())
	case "thaw":
		fmt.Fprintf(w, "thawed it: wrote %s in %s and waited until the kernel reported it running\n", state, c.FreezerDir())
	case "kill":
		fmt.Fprintf(w, "killed every process (cgroup.kill on v2; else froze the group so none can fork away, sent SIGKILL to each pid in cgroup.procs, thawed) and waited until it was empty\n")
	case "remove":
		fmt.Fprintf(w, "removed the group's directory (and any child groups) in each hierarchy; the kernel refuses while a process remains:\n")
	}
	if op == "create" || op == "stats" || op == "procs" || op == "remove" {
		for _, d := range dirs {
			fmt.Fprintf(w, "  %s\n", d)
		}
	}
}
