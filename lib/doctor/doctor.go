// Package doctor checks every host requirement of LazyFork and names the fix for each
// one that is missing.
package doctor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/client"
	"github.com/lazyfork/lazyfork/lib/criu"
	"github.com/lazyfork/lazyfork/lib/ksm"
	"github.com/lazyfork/lazyfork/lib/overlay"
)

// Check is one requirement's verdict, as `lazyfork doctor --json` and the daemon's status
// give it (the API's type). Advisory checks inform and never fail doctor.
type Check = client.Check

// Run performs every check. runDir is the tmpfs state directory; criuBinary the operator's
// CRIU (--criu / $LAZYFORK_CRIU, read by the main; "" = criu.FindBinary's default).
func Run(ctx context.Context, runDir, criuBinary string) []Check {
	return []Check{
		root(), criuVersion(ctx, criuBinary), criuCheck(ctx, criuBinary), criuSockets(ctx, criuBinary, runDir), overlayfs(), namespaces(), cgroups(),
		tmpfs(runDir), userfaultfd(), tool("nsenter", "apt-get install util-linux"),
		tool("debootstrap", "apt-get install debootstrap (builds the offline default image)"),
		ksmState(),
	}
}

// ksmState is advisory: KSM is an opt-in per tree, and ksmd is the operator's to start.
func ksmState() Check {
	c := Check{Name: "ksm", OK: true, Advisory: true}
	s, err := ksm.Read()
	if err != nil {
		c.Detail = err.Error()
		return c
	}
	c.Detail, c.Fix = s.Summary()
	return c
}

func root() Check {
	c := Check{Name: "root", OK: os.Geteuid() == 0, Detail: fmt.Sprintf("euid %d", os.Geteuid())}
	if !c.OK {
		c.Fix = "run lazyfork as root (sudo)"
	}
	return c
}

const criuFix = "run `make setup` (installs a CRIU new enough for this kernel), or set LAZYFORK_CRIU to one"

// criuNeeded is the oldest CRIU that works on this kernel: from Linux 6.16 the kernel
// refuses SO_PASSCRED on inet sockets and CRIU 4.1 then cannot dump any (fixed in 4.2).
func criuNeeded() (major, minor int) {
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		var kmaj, kmin int
		if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &kmaj, &kmin); err == nil && (kmaj > 6 || kmaj == 6 && kmin >= 16) {
			return 4, 2
		}
	}
	return 4, 1
}

func criuVersion(ctx context.Context, binary string) Check {
	bin, err := criu.FindBinary(binary)
	if err != nil {
		return Check{Name: "criu", Detail: err.Error(), Fix: criuFix}
	}
	maj, min, pat, err := criu.Version(ctx, bin.Path)
	if err != nil {
		return Check{Name: "criu", Detail: fmt.Sprintf("%s (%s): %v", bin.Path, bin.Source, err), Fix: criuFix}
	}
	v := fmt.Sprintf("%d.%d.%d at %s (%s)", maj, min, pat, bin.Path, bin.Source)
	nmaj, nmin := criuNeeded()
	if maj < nmaj || (maj == nmaj && min < nmin) {
		return Check{Name: "criu", Detail: fmt.Sprintf("%s is older than %d.%d, which this kernel needs", v, nmaj, nmin), Fix: criuFix}
	}
	return Check{Name: "criu", OK: true, Detail: v}
}

func criuCheck(ctx context.Context, binary string) Check {
	if err := criu.Check(ctx, binary); err != nil {
		return Check{Name: "criu check", Detail: firstLine(err.Error()), Fix: "see `criu check`; a kernel with CONFIG_CHECKPOINT_RESTORE is needed"}
	}
	return Check{Name: "criu check", OK: true, Detail: "looks good (run with CRIU_FAULT=130 and deadlines, so it cannot hang where hardware breakpoints fail)"}
}

// criuSockets dumps a process holding TCP and UDP sockets: without that, no program that
// opened a socket can be forked.
func criuSockets(ctx context.Context, binary, runDir string) Check {
	scratch := os.TempDir()
	if fi, err := os.Stat(runDir); err == nil && fi.IsDir() {
		scratch = runDir
	}
	if err := criu.ProbeSocketDump(ctx, binary, scratch); err != nil {
		return Check{Name: "criu sockets", Detail: firstLine(err.Error()), Fix: criuFix + " (CRIU >= 4.2 on kernels >= 6.16)"}
	}
	return Check{Name: "criu sockets", OK: true, Detail: "dumped a process holding TCP and UDP sockets"}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
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
	detail := fmt.Sprintf("%s host; containers use v2 (%s) under %s", f.Mode, f.V2Mount, f.DefaultParent["unified"])
	if f.Backend == "v1" {
		detail = fmt.Sprintf("%s host; containers use v1 memory, pids, freezer under %s", f.Mode, f.DefaultParent["memory"])
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
