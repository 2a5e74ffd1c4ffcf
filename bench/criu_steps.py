#!/usr/bin/env python3
"""Where CRIU's own time goes: its -v4 logs (timestamps per line) broken into named steps.

    LAZYFORK_KEEP_CRIU_LOGS=/tmp/logs python3 bench/trace_repeat.py -k 16 --bin bin ...
    python3 bench/criu_steps.py /tmp/logs            # every daemon's logs, by daemon pid
    python3 bench/criu_steps.py --skip 1 /tmp/logs   # leave out each daemon's first dump
                                                     # and restore (the swap)

lib/criu copies each call's log and stats there when LAZYFORK_KEEP_CRIU_LOGS names a
directory (<daemon pid>-<ms>-<n>-dump-dump.log, ...-restore-restore.log). A step is the time
from one marker line to the next (the markers below, looked for in order); a step whose
marker is missing is left out of that log. Medians, minimum and maximum per step, in ms, and
the log's whole span (from criu opening its log to its last line; the request as LazyFork
times it adds criu's start and exit). Timings are measurements of one host at one load.
"""
import argparse
import collections
import re
import statistics
from pathlib import Path

DUMP = [
    ("init (kdat, cpu, options)", r"Dumping processes \(pid"),
    ("pre-dump notify, cgroup props, inventory", r"freezing cgroup|Seizing"),
    ("freeze (cgroup freezer)", r"freezing processes:|SEIZE"),
    ("seize (ptrace)", r"Collected \d+ in"),
    ("collect namespaces", r"net: Lock network"),
    ("mounts: mountinfo, tree", r"net: Collecting netns"),
    ("sockets: sock_diag dumps", r"Collecting pidns"),
    ("pid ns, seccomp, task stat", r"Collecting mappings"),
    ("smaps, mapped files, fds, signals", r"Parasite syscall_ip"),
    ("parasite: inject, registers", r"Dumping pages \(type"),
    ("pages: pagemap scan, transfer", r"Dumping core \(pid"),
    ("core, cgroup and devices values", r"Waiting for \d+ to trap"),
    ("parasite cure", r"Dumping mm \(pid"),
    ("mm, cwd/root, mountpoints, pstree", r"Dumping \d+\(\d+\)'s namespaces"),
    ("namespaces (forks: uts, ipc sysctls)", r"Namespaces dump complete"),
    ("cgroup image, inventory", r"Running post-dump scripts"),
    ("post-dump notify (LazyFork's handler)", r"net: Unlock network"),
    ("unlock network", r"Unfreezing tasks"),
    ("thaw, unseize, stats", None),
]
RESTORE = [
    ("init (kdat, options)", r"Reading image tree"),
    ("images, collect, cgroup rewrite", r"Running pre-restore scripts"),
    ("pre-restore notify, cgroupd", r"mnt: Reading mountpoint images"),
    ("mount images, tree", r"Forking task with"),
    ("clone3 of the root task", r"PID: real"),
    ("setup-namespaces notify", r"Restoring namespaces"),
    ("uts (sysctl fork)", r"Restoring IPC namespace"),
    ("ipc", r"mnt: Restoring mount namespace"),
    ("mounts, pivot_root, old root unmounted", r"Running post-setup-namespaces scripts"),
    ("post-setup-namespaces notify", r"Preparing info about shared resources"),
    ("files, vmas, fds", r"Restore via sigreturn"),
    ("restorer arguments", r"Switched to the restorer"),
    ("restorer: mmap, pages, vdso", r"\d: Restored$"),
    ("criu waits for the restorer", r"Running post-restore scripts"),
    ("post-restore notify (LazyFork's handler)", r"mnt: Switching to new ns to clean ghosts"),
    ("ghosts (setns into the mount ns)", r"net: Unlock network"),
    ("seccomp, ptrace detach", r"Running pre-resume scripts"),
    ("pre-resume notify, resume", r"Restore finished successfully"),
    ("stats, post-resume notify", None),
]
LINE = re.compile(r"\((\d+)\.(\d+)\)\s*(.*)")


def steps(path, marks):
    """[(step, ms) ...] and the log's span in ms."""
    lines = []
    for raw in path.read_text(errors="replace").splitlines():
        m = LINE.match(raw)
        if m:
            lines.append((int(m[1]) + int(m[2]) / 1e6, m[3]))
    if not lines:
        return [], 0.0
    out, prev, i = [], 0.0, 0
    for name, rx in marks:
        if rx is None:
            t = lines[-1][0]
        else:
            r, t = re.compile(rx), None
            for j in range(i, len(lines)):
                if r.search(lines[j][1]):
                    t, i = lines[j][0], j
                    break
            if t is None:
                continue
        out.append((name, (t - prev) * 1000))
        prev = t
    return out, lines[-1][0] * 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--skip", type=int, default=0, help="leave out each daemon's first N dumps and restores")
    a = ap.parse_args()
    by = collections.defaultdict(lambda: collections.defaultdict(list))
    for f in sorted(a.dir.iterdir(), key=lambda p: p.name.split("-")[:3]):
        kind = "dump" if f.name.endswith("-dump-dump.log") else "restore" if f.name.endswith("-restore-restore.log") else None
        if kind:
            by[f.name.split("-")[0]][kind].append(f)
    for pid, kinds in by.items():
        for kind, marks in (("dump", DUMP), ("restore", RESTORE)):
            rows = [steps(f, marks) for f in kinds[kind][a.skip:]]
            if not rows:
                continue
            spans = [s for _, s in rows]
            print(f"daemon {pid}, {kind}: {len(rows)} logs, span p50 {statistics.median(spans):.1f} ms (min {min(spans):.1f})")
            for name, _ in marks:
                v = [ms for r, _ in rows for n, ms in r if n == name]
                if v:
                    print(f"  {statistics.median(v):7.2f} p50 {min(v):7.2f} min {max(v):8.2f} max  {name}")


if __name__ == "__main__":
    main()
