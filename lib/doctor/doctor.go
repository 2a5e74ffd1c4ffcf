// Package doctor checks every host requirement of LazyFork and names the fix for each
// one that is missing.
package doctor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/overlay"
)

// Check is one requirement's verdict.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

// Run performs every check. runDir is the tmpfs state directory.
func Run(ctx context.Context, runDir string) []Check {
	return []Check{
		root(), criuVersion(ctx), criuCheck(ctx), overlayfs(), namespaces(), cgroups(),
		tmpfs(runDir), userfaultfd(), tool("nsenter", "apt-get install util-linux"),
		tool("debootstrap", "apt-get install debootstrap (builds the offline default image)"),
	}
}

func root() Check {
	c := Check{Name: "root", OK: os.Geteuid() == 0, Detail: fmt.Sprintf("euid %d", os.Geteuid())}
	if !c.OK {
		c.Fix = "run lazyfork as root (sudo)"
	}
	return c
}

var versionRe = regexp.MustCompile(`Version:\s*(\d+)\.(\d+)(?:\.(\d+))?`)

// CriuVersion returns the installed criu's version as major, minor, patch.
func CriuVersion(ctx context.Context) (int, int, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "criu", "--version").Output()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("criu --version: %w", err)
	}
	m := versionRe.FindStringSubmatch(string(out))
	if m == nil {
		return 0, 0, 0, fmt.Errorf("criu --version: unexpected output %q", out)
	}
	maj, _ := strconv.Atoi(m[1])
	min, _ := strconv.Atoi(m[2])
	pat, _ := strconv.Atoi(m[3])
	return maj, min, pat, nil
}

const criuFix = "run `make setup` (installs CRIU >= 4.1; on Debian bookworm from the trixie suite)"

func criuVersion(ctx context.Context) Check {
	maj, min, pat, err := CriuVersion(ctx)
	if err != nil {
		return Check{Name: "criu", Detail: "not found", Fix: criuFix}
	}
	v := fmt.Sprintf("%d.%d.%d", maj, min, pat)
	if maj < 4 || (maj == 4 && min < 1) {
		return Check{Name: "criu", Detail: v + " is older than 4.1", Fix: criuFix}
	}
	return Check{Name: "criu", OK: true, Detail: v}
}

func criuCheck(ctx context.Context) Check {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "criu", "check")
	// Without it criu hangs on hosts where hardware breakpoints do not work (VMs).
	cmd.Env = append(os.Environ(), "CRIU_FAULT=130")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil {
		last := text
		if i := strings.LastIndexByte(text, '\n'); i >= 0 {
			last = text[i+1:]
		}
		return Check{Name: "criu check", Detail: last, Fix: "see `criu check` output; a kernel with CONFIG_CHECKPOINT_RESTORE is needed"}
	}
	return Check{Name: "criu check", OK: true, Detail: text + " (run with CRIU_FAULT=130 and deadlines, so it cannot hang where hardware breakpoints fail)"}
}

func overlayfs() Check {
	if err := overlay.Supported(); err != nil {
		return Check{Name: "overlayfs", Detail: err.Error(), Fix: "modprobe overlay"}
	}
	return Check{Name: "overlayfs", OK: true, Detail: "available"}
}

func namespaces() Check {
	var missing []string
	for _, ns := range []string{"pid", "mnt", "uts", "ipc"} {
		if _, err := os.Stat("/proc/self/ns/" + ns); err != nil {
			missing = append(missing, ns)
		}
	}
	if len(missing) > 0 {
		return Check{Name: "namespaces", Detail: "missing: " + strings.Join(missing, ", "), Fix: "a kernel with CONFIG_PID_NS, CONFIG_UTS_NS, CONFIG_IPC_NS"}
	}
	return Check{Name: "namespaces", OK: true, Detail: "pid, mnt, uts, ipc"}
}

func cgroups() Check {
	const fix = "mount cgroup v2 with the memory and pids controllers, or v1 memory, pids and freezer"
	f, err := cgroup.HostFacts()
	if err != nil {
		return Check{Name: "cgroups", Detail: err.Error(), Fix: fix}
	}
	if f.Problem != "" {
		return Check{Name: "cgroups", Detail: f.Problem, Fix: fix}
	}
	detail := fmt.Sprintf("%s host; containers use v2 (%s)", f.Mode, f.V2Mount)
	if f.Backend == "v1" {
		detail = fmt.Sprintf("%s host; containers use v1 memory, pids, freezer", f.Mode)
	}
	return Check{Name: "cgroups", OK: true, Detail: detail}
}

func tmpfs(dir string) Check {
	probe := dir
	for probe != "/" {
		if _, err := os.Stat(probe); err == nil {
			break
		}
		probe = parent(probe)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(probe, &st); err != nil {
		return Check{Name: "tmpfs", Detail: err.Error(), Fix: "set LAZYFORK_RUN to a directory on tmpfs"}
	}
	if st.Type != unix.TMPFS_MAGIC {
		return Check{Name: "tmpfs", Detail: dir + " is not on tmpfs", Fix: "set LAZYFORK_RUN to a directory on tmpfs (e.g. /dev/shm/lazyfork)"}
	}
	free := int64(st.Bavail) * st.Bsize
	return Check{Name: "tmpfs", OK: true, Detail: fmt.Sprintf("%s on tmpfs, %d MB free", dir, free>>20)}
}

func parent(p string) string {
	i := strings.LastIndexByte(strings.TrimRight(p, "/"), '/')
	if i <= 0 {
		return "/"
	}
	return p[:i]
}

func userfaultfd() Check {
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0)
	if errno != 0 {
		return Check{Name: "userfaultfd", Detail: errno.Error(), Fix: "a kernel with CONFIG_USERFAULTFD (needed only for the lazy-pages baseline)"}
	}
	unix.Close(int(fd))
	return Check{Name: "userfaultfd", OK: true, Detail: "available"}
}

func tool(name, fix string) Check {
	p, err := exec.LookPath(name)
	if err != nil {
		return Check{Name: name, Detail: "not found", Fix: fix}
	}
	return Check{Name: name, OK: true, Detail: p}
}
