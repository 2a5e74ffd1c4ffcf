package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestCreateConfinementFlags: --user, --memory and --pids-limit reach the container and
// its cgroup, --privileged gives every capability and no filter, and bad values are
// one-line errors that leave nothing.
func TestCreateConfinementFlags(t *testing.T) {
	e := newEnv(t)
	id := e.must("lazyfork create lazyfork/debian:bookworm --user nobody --memory 64m --pids-limit 50 -- sleep 1000")
	var info struct{ Pid int }
	if err := json.Unmarshal([]byte(e.must("lazyfork list --json | python3 -c 'import json,sys; print(json.dumps([c for c in json.load(sys.stdin) if c[\"id\"]==\""+id+"\"][0]))'")), &info); err != nil {
		t.Fatal(err)
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", info.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Uid:\t65534\t", "CapEff:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"} {
		if !strings.Contains(string(st), want) {
			t.Errorf("--user nobody: status lacks %q", want)
		}
	}
	cg := e.must(fmt.Sprintf("cat /proc/%d/cgroup", info.Pid))
	checked := 0
	for ctrl, want := range map[string]string{"memory": "memory.limit_in_bytes:67108864", "pids": "pids.max:50"} {
		for _, l := range strings.Split(cg, "\n") {
			f := strings.SplitN(l, ":", 3)
			if len(f) != 3 {
				continue
			}
			file, val, _ := strings.Cut(want, ":")
			dir := "/sys/fs/cgroup/" + ctrl + f[2]
			switch {
			case f[1] == ctrl:
			case f[0] == "0" && f[1] == "" && strings.Contains(f[2], "/lazyfork/"): // a v2 group
				dir, file = "/sys/fs/cgroup"+f[2], strings.Replace(file, "memory.limit_in_bytes", "memory.max", 1)
			default:
				continue
			}
			checked++
			if got := e.must("cat " + dir + "/" + file); got != val {
				t.Errorf("%s = %s, want %s", file, got, val)
			}
		}
	}
	if checked != 2 {
		t.Errorf("found the memory and pids limits of %d groups in %q, want 2", checked, cg)
	}
	pid := e.must("lazyfork create lazyfork/debian:bookworm --privileged --json -- sleep 1000 | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"pid\"])'")
	if st := e.must("grep -E '^(NoNewPrivs|Seccomp):' /proc/" + pid + "/status | tr -s '\\t ' ' '"); st != "NoNewPrivs: 0\nSeccomp: 0" {
		t.Errorf("--privileged: %q, want no no_new_privs and no filter", st)
	}
	before := e.must("lazyfork list -q | sort")
	for _, bad := range []string{"--memory 12x", "--pids-limit -3", "--user nosuchuser"} {
		_, errOut, code := e.sh("lazyfork create lazyfork/debian:bookworm " + bad + " -- true")
		if code == 0 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, strings.Fields(bad)[1]) {
			t.Errorf("create %s: exit %d, stderr %q: want a one-line error naming the value", bad, code, errOut)
		}
	}
	if after := e.must("lazyfork list -q | sort"); after != before {
		t.Errorf("failed creates left containers: %q -> %q", before, after)
	}
}
