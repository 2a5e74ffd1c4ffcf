#!/usr/bin/env python3
"""Where `lf-restore -n N` waits: off-CPU time by process role and kernel stack.

    bench/offcpu.py [--heap 256] [-n 100] --bin bin [--bin OLD/bin] [--top 12]

Creates one source running bench/agent.py (first build), snapshots it once, then for each
build runs `lf-restore -n N` under `perf record -a -g -e sched:sched_switch` (plus the
fork/exec tracepoints, to know which task is which) and deletes the forks afterwards. From
every switch-out to the same task's next switch-in it adds the time to the task's role and
to the kernel stack it left the CPU with: blocked (state S or D: it waited for something)
or runnable (preempted: it waited for a CPU). Roles, from the process tree the tracepoints
show: lf-restore (its threads), the criu service, criu's workers (one per restore), the
tasks criu restores (comm criu until they become the workload) and the restored workload,
criu's helpers below a worker that never become the workload (cgroupd), and any other
child of lf-restore. Waits that hold no restore up are shown apart as idle: lf-restore's
idle Go threads (futex, epoll) and reaping goroutines, the service's accept, a worker made
ahead waiting for its request, the workload's own sleeps.
Sums are per fork (divided by N), summed over every task of the role: tasks of a role run
side by side, so a role's blocked time can exceed the batch's wall time.
Run it alone (`flock /tmp/lazyfork-bench.lock python3 bench/offcpu.py ...`); everything it
creates is named offcpu-<pid>-... and deleted at the end, also on failure.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from trace_repeat import AGENT, IMAGE, run  # bench/ is this script's directory

PREFIX = f"offcpu-{os.getpid()}"

HEAD = re.compile(r"^(.+?)\s+(-?\d+)/(\d+)\s+([0-9.]+):\s+(?:\d+\s+)?([\w:-]+)(?:/[^:]*/)?:\s(.*)$")
FRAME = re.compile(r"^\s+([0-9a-f]+) (\S+)")
KV = re.compile(r"(\w+)=(\S+)")
# Frames that say only "it slept": the first other frame says why.
SLEEP = {"__schedule", "schedule", "schedule_timeout", "schedule_preempt_disabled", "io_schedule",
         "schedule_hrtimeout_range_clock", "schedule_hrtimeout_range", "__wait_for_common",
         "wait_for_completion", "wait_for_completion_state", "wait_for_completion_killable",
         "wait_for_completion_interruptible", "preempt_schedule_common", "__cond_resched",
         "preempt_schedule", "preempt_schedule_thunk", "__mutex_lock.constprop.0", "__mutex_lock",
         "rwsem_down_write_slowpath", "rwsem_down_read_slowpath", "percpu_rwsem_wait",
         "__percpu_down_read", "percpu_down_write", "__synchronize_srcu", "schedule_timeout_uninterruptible",
         "do_nanosleep", "hrtimer_nanosleep", "futex_wait_queue", "__futex_wait", "futex_wait",
         "do_futex", "__x64_sys_futex", "irqentry_exit_to_user_mode", "exit_to_user_mode_loop",
         "syscall_exit_to_user_mode", "do_syscall_64", "entry_SYSCALL_64_after_hwframe",
         "mutex_lock", "down_write", "down_read", "msleep", "usleep_range_state"}
IDLE_SYSCALLS = {"__x64_sys_futex", "__x64_sys_epoll_pwait", "__x64_sys_epoll_wait", "__x64_sys_nanosleep"}
# (a Go thread's futex wait in lf-restore counts as idle: the goroutines it runs show their
# waits in their own system calls)


def parse(path, perf):
    """Yields (comm, pid, tid, t, event, fields, kernel frames) from `perf script`."""
    p = subprocess.Popen([perf, "script", "-i", path, "-F", "comm,pid,tid,time,event,trace,ip,sym"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1 << 20)
    cur = None
    for line in p.stdout:
        if not line.strip():
            if cur:
                yield cur
            cur = None
            continue
        m = HEAD.match(line)
        if m and not line.startswith((" ", "\t")):
            if cur:
                yield cur
            comm, pid, tid, t, ev, rest = m.groups()
            cur = (comm.strip(), int(pid), int(tid), float(t), ev, rest, [])
            continue
        f = FRAME.match(line)
        if f and cur is not None:
            if f[1].startswith("ffffffff"):
                cur[6].append(re.sub(r"\+0x[0-9a-f]+$", "", f[2]))
            elif "lazyfork/lib/" in f[2] and not any(x.startswith("@") for x in cur[6]):
                cur[6].append("@" + f[2].split("lazyfork/lib/")[1])  # where in LazyFork (Go keeps frame pointers)
            if f and not f[1].startswith("ffffffff") and not any(x.startswith("~") for x in cur[6]):
                cur[6].append("~" + re.sub(r"\+0x[0-9a-f]+$", "", f[2]))  # the first user frame
    if cur:
        yield cur
    p.wait()


def why(frames):
    """(what it waited in, the syscall or kernel entry it came from) for a switch-out stack."""
    user = [f for f in frames if f.startswith("@")]
    frames = [f for f in frames if not f.startswith(("@", "~"))]
    inner, sc = why_kernel(frames)
    return inner, sc + (" " + user[0] if user else "")


def why_kernel(frames):
    inner = next((f for f in frames if f not in SLEEP), frames[0] if frames else "?")
    if "synchronize_rcu" in frames or "synchronize_rcu_normal" in frames or "wait_rcu_gp" in frames:
        i = max(i for i, f in enumerate(frames) if f.startswith(("synchronize_rcu", "wait_rcu_gp")))
        callers = [f for f in frames[i + 1:i + 4] if f not in SLEEP]
        inner = "synchronize_rcu <- " + " <- ".join(callers)
    elif "synchronize_srcu" in frames or "__synchronize_srcu" in frames:
        i = max(i for i, f in enumerate(frames) if "synchronize_srcu" in f)
        inner = "synchronize_srcu <- " + " <- ".join(f for f in frames[i + 1:i + 3] if f not in SLEEP)
    elif any(f in ("__mutex_lock", "__mutex_lock.constprop.0", "mutex_lock") for f in frames):
        i = max(i for i, f in enumerate(frames) if "mutex_lock" in f)
        inner = "mutex <- " + " <- ".join(f for f in frames[i + 1:i + 3])
    elif any("rwsem" in f or "percpu_rwsem" in f or "percpu_down" in f for f in frames):
        i = max(i for i, f in enumerate(frames) if "rwsem" in f or "percpu_down" in f)
        inner = "rwsem <- " + " <- ".join(f for f in frames[i + 1:i + 3])
    sc = next((f for f in reversed(frames) if f.startswith(("__x64_sys_", "__do_sys_", "__se_sys_"))), None)
    if sc is None:
        sc = "(user: preempted)" if "irqentry_exit_to_user_mode" in frames or "asm_sysvec_apic_timer_interrupt" in frames else (frames[-1] if frames else "?")
    return inner, sc


def analyse(path, perf, root):
    parent = {}  # tid -> the tid that cloned it
    tgid = {}
    comm_of = {}
    out = {}  # tid -> (t, state, frames)
    on = {}  # tid -> t of switch-in
    blocked = defaultdict(float)  # (role, kind, why, syscall) -> ms
    count = defaultdict(int)
    example = {}  # key -> a tid it happened to (to look it up in `perf script`)
    samples = defaultdict(int)  # (role, where) -> CPU samples
    oncpu = defaultdict(float)  # tid -> ms
    other_cpu = defaultdict(float)  # comm class -> ms
    per_tid = defaultdict(list)  # tid -> [(kind, ms, key, comm, t)], classified at the end (roles need the whole tree)
    first_fork = {}  # process -> when it first forked (a worker's restore has begun)
    comms = defaultdict(set)  # process -> every comm it had
    t0 = t1 = None
    for comm, pid, tid, t, ev, rest, frames in parse(path, perf):
        t0 = t if t0 is None else t0
        t1 = t
        tgid.setdefault(tid, pid)
        comm_of.setdefault(pid, comm)
        comms[pid].add(comm)
        if ev == "sched:sched_process_fork":
            kv = dict(KV.findall(rest))
            parent[int(kv["child_pid"])] = int(kv["pid"]) if "pid" in kv else tid
            first_fork.setdefault(pid, t)
            continue
        if ev == "sched:sched_process_exec":
            comm_of[pid] = os.path.basename(dict(KV.findall(rest)).get("filename", comm))
            continue
        if ev.startswith("cpu-clock"):
            # A CPU sample: the system call it ran in (or a page fault, or user space);
            # classified with the roles at the end.
            kern = [f for f in frames if not f.startswith(("@", "~"))]
            user = [f[1:] for f in frames if f.startswith("~")]
            sc = next((f for f in reversed(kern) if f.startswith(("__x64_sys_", "__do_sys_"))), None)
            if sc:
                where = sc.replace("__x64_sys_", "").replace("__do_sys_", "")
            elif "asm_exc_page_fault" in kern or "exc_page_fault" in kern:
                where = "page fault"
            elif kern and kern[-1] in ("ret_from_fork_asm", "ret_from_fork"):
                where = "new task (ret_from_fork)"
            elif kern:
                where = "kernel: " + kern[-1]
            else:
                where = "user: " + (user[0] if user else "?")
            per_tid[tid].append(("sample", 1.0, where, comm, t))
            continue
        if ev != "sched:sched_switch":
            continue
        kv = dict(KV.findall(rest.replace(" ==> ", " ")))
        prev, nxt, state = int(kv["prev_pid"]), int(kv["next_pid"]), kv["prev_state"]
        if prev and prev in on:
            per_tid[prev].append(("cpu", (t - on.pop(prev)) * 1000, None, comm, t))
        if prev:
            out[prev] = (t, state, frames, comm)
        if nxt:
            on[nxt] = t
            if nxt in out:
                to, st, fr, cm = out.pop(nxt)
                kind = "runnable" if st.startswith("R") else "blocked"
                per_tid[nxt].append((kind, (t - to) * 1000, why(fr) if kind == "blocked" else ("waiting for a CPU", ""), cm, t))
    # The process tree below lf-restore.
    def proc_parent(p):
        q = parent.get(p)
        return tgid.get(q, q) if q is not None else None

    kids = defaultdict(set)
    for p in set(tgid.values()):
        pp = proc_parent(p)
        if pp is not None and pp != p:
            kids[pp].add(p)
    below = {}

    def walk(p, depth):
        for k in kids.get(p, ()):
            if k not in below:
                below[k] = depth
                walk(k, depth + 1)

    if root:
        below[root] = 0
        walk(root, 1)
    service = max((p for p in below if below[p] >= 1 and comm_of.get(p) == "criu"),
                  key=lambda p: len(kids.get(p, ())), default=None)
    workers = kids.get(service, set()) if service else set()

    def role(tid, comm):
        p = tgid.get(tid, tid)
        if p == root:
            return "lf-restore"
        if p == service:
            return "criu service"
        if p in workers:
            return "criu worker"
        if p not in below:
            return None
        # below a worker: a task criu restores (comm criu), then the workload itself
        q = p
        while q is not None and q in below and q not in workers:
            q = proc_parent(q)
        if q in workers:
            if comms[p] <= {"criu"}:
                return "criu helper"  # never became the workload: cgroupd and the like
            return "restoring task (criu)" if comm == "criu" else "restored workload"
        return f"other child ({comm_of.get(p, comm)})"

    for tid, evs in per_tid.items():
        for kind, ms, key, comm, t in evs:
            r = role(tid, comm)
            if r is None:
                if kind == "cpu":
                    other_cpu[re.sub(r"[/:].*", "", comm)] += ms
                continue
            if kind == "cpu":
                oncpu[r] += ms
                continue
            if kind == "sample":
                samples[(r, key)] += 1
                continue
            w, sc = key
            # Waits that hold nothing up: lf-restore's idle Go threads and the goroutines that
            # reap restored trees, the service waiting for a connection, a worker (made
            # ahead) waiting for its request, before it forks anything, and the restored
            # workload's own sleeps (the agent sleeps between its writes).
            if kind == "blocked" and (r == "lf-restore" and (sc.split()[0] in IDLE_SYSCALLS or sc.startswith("__do_sys_waitid"))
                                      or r == "criu service" and sc.startswith("__x64_sys_accept")
                                      or r == "criu worker" and t <= first_fork.get(tgid.get(tid, tid), 0)
                                      or r == "restored workload" and sc.startswith("__x64_sys_clock_nanosleep")):
                kind = "idle"
            blocked[(r, kind, w, sc)] += ms
            count[(r, kind, w, sc)] += 1
            example.setdefault((r, kind, w, sc), tid)
    return dict(blocked=blocked, count=count, example=example, samples=samples, oncpu=oncpu, other_cpu=other_cpu,
                window_ms=((t1 or 0) - (t0 or 0)) * 1000, workers=len(workers))


def report(a, n, top):
    roles = sorted({k[0] for k in a["blocked"]} | set(a["oncpu"]))
    print(f"  window {a['window_ms']:.0f} ms, {a['workers']} criu workers; per fork (ms), summed over each role's tasks:")
    print(f"  {'role':24s} {'on CPU':>8s} {'blocked':>8s} {'runnable':>9s} {'idle':>8s}")
    for r in roles:
        s = {k: sum(v for kk, v in a["blocked"].items() if kk[0] == r and kk[1] == k) / n for k in ("blocked", "runnable", "idle")}
        print(f"  {r:24s} {a['oncpu'].get(r, 0) / n:8.2f} {s['blocked']:8.2f} {s['runnable']:9.2f} {s['idle']:8.2f}")
    oth = sorted(a["other_cpu"].items(), key=lambda kv: -kv[1])[:6]
    print("  others on CPU meanwhile (ms per fork): " + ", ".join(f"{c} {v / n:.2f}" for c, v in oth))
    for r in roles:
        tot = sum(v for k, v in a["samples"].items() if k[0] == r)
        rows = sorted(((v, k[1]) for k, v in a["samples"].items() if k[0] == r), reverse=True)[:top]
        if tot:
            print(f"  {r}: on CPU, where ({tot} samples; share of the role's samples)")
            for v, w in rows:
                print(f"    {100 * v / tot:5.1f}%  {w}")
    for r in roles:
        rows = sorted(((v, k) for k, v in a["blocked"].items() if k[0] == r and k[1] == "blocked"), reverse=True)[:top]
        if not rows:
            continue
        print(f"  {r}: blocked, by kernel path (ms per fork, times per fork)")
        for v, k in rows:
            print(f"    {v / n:7.2f} {a['count'][k] / n:6.1f}x  {k[2]}   [{k[3]}]  (e.g. tid {a['example'][k]})")


def timeline(path, perf, root, k):
    """Prints what the k-th restore's criu worker and the tasks it forked did, in time order
    (ms from its first fork): forks, runs of 0.5 ms or more, and every wait of 0.3 ms or
    more with its kernel path: one fork's critical path, read by eye."""
    evs = list(parse(path, perf))
    kids, tgid = defaultdict(list), {}
    for comm, pid, tid, t, ev, rest, frames in evs:
        tgid.setdefault(tid, pid)
        if ev == "sched:sched_process_fork":
            kids[pid].append(int(dict(KV.findall(rest))["child_pid"]))

    def below(p):
        out, todo = [], [p]
        while todo:
            for c in kids.get(todo.pop(), []):
                if tgid.get(c, c) == c and c not in out:
                    out.append(c)
                    todo.append(c)
        return out

    procs = [p for p in below(root)]
    if not procs:
        print("  no process below lf-restore in the trace")
        return
    service = max(procs, key=lambda p: len(kids.get(p, ())))
    workers = kids.get(service, [])
    if k >= len(workers):
        print(f"  only {len(workers)} workers")
        return
    fam = {workers[k], *below(workers[k])}
    print(f"  restore {k}: criu worker {workers[k]}, its tasks {sorted(fam - {workers[k]})}")
    out, on, t0 = {}, {}, None
    for comm, pid, tid, t, ev, rest, frames in evs:
        if ev == "sched:sched_process_fork":
            kv = dict(KV.findall(rest))
            if int(kv["pid"]) in fam:
                t0 = t0 or t
                print(f"  {(t - t0) * 1000:8.2f} {kv['pid']:>7} forks {kv['child_pid']}")
            continue
        if ev != "sched:sched_switch":
            continue
        kv = dict(KV.findall(rest.replace(" ==> ", " ")))
        prev, nxt, st = int(kv["prev_pid"]), int(kv["next_pid"]), kv["prev_state"]
        if prev in fam:
            if prev in on and t0:
                d = (t - on.pop(prev)) * 1000
                if d >= 0.5:
                    print(f"  {(t - t0) * 1000 - d:8.2f} {prev:>7} {comm:10s} ran {d:7.2f} ms")
            out[prev] = (t, st, frames, comm)
        if nxt in fam:
            on[nxt] = t
            if nxt in out and t0:
                to, st0, fr, cm = out.pop(nxt)
                d = (t - to) * 1000
                if d >= 0.3:
                    w = why(fr) if not st0.startswith("R") else ("waiting for a CPU", "")
                    print(f"  {(to - t0) * 1000:8.2f} {nxt:>7} {cm:10s} {st0:2s} {d:7.2f} ms  {w[0]}  [{w[1]}]")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", action="append", required=True, help="a build's bin directory (repeat)")
    ap.add_argument("-n", type=int, default=100)
    ap.add_argument("--heap", type=int, default=256)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--perf", default=shutil.which("perf") or "/usr/bin/perf")
    ap.add_argument("--keep", help="keep each perf.data in this directory")
    ap.add_argument("--freq", type=int, default=0, help="also sample the CPU this often (Hz) and show where each role runs")
    ap.add_argument("--timeline", type=int, metavar="K", help="also print the K-th restore's timeline (criu worker and its tasks)")
    a = ap.parse_args()
    bins = [Path(b).resolve() for b in a.bin]
    env = dict(os.environ, LAZYFORK_LOCAL="1")
    src = None
    tmp = tempfile.mkdtemp(prefix=PREFIX)
    try:
        rec = json.loads(run([bins[0] / "lazyfork", "create", IMAGE, "--name", f"{PREFIX}-src", "--json", "--",
                              "python3", "-c", AGENT, str(a.heap)], env).stdout)
        src = rec["id"]
        time.sleep(max(3, a.heap / 40))
        snap = run([bins[0] / "lf-memfile"], env, stdin=run([bins[0] / "lf-dump", src], env).stdout).stdout
        for i, b in enumerate(bins):
            data = os.path.join(a.keep or tmp, f"offcpu-{i}.data")
            perf = subprocess.Popen([a.perf, "record", "-q", "-m", "8M", "-a", "-g", "-e", "sched:sched_switch",
                                     *(["-e", f"cpu-clock/freq={a.freq}/"] if a.freq else []),
                                     "-e", "sched:sched_process_fork", "-e", "sched:sched_process_exec", "-o", data],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(1)  # perf has opened its events
            t = time.monotonic()
            p = subprocess.Popen([str(b / "lf-restore"), "-n", str(a.n)], env=env, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            stdout, stderr = p.communicate(snap, timeout=1800)
            wall = time.monotonic() - t
            perf.send_signal(signal.SIGINT)
            perf.wait(timeout=120)
            if p.returncode != 0:
                raise RuntimeError(f"lf-restore: exit {p.returncode}: {stderr.strip()[-2000:]}")
            forks = [json.loads(l) for l in stdout.splitlines() if l.strip().startswith("{")]
            lat = sorted(f["restore_ms"] for f in forks)
            print(f"build {i} ({b}), lf-restore pid {p.pid}: N={a.n} wall {wall:.2f} s (under perf), restore p50 {lat[len(lat) // 2]:.0f} ms", flush=True)
            try:
                report(analyse(data, a.perf, p.pid), a.n, a.top)
                if a.timeline is not None:
                    timeline(data, a.perf, p.pid, a.timeline)
            finally:
                for j in range(0, len(forks), 200):
                    run([b / "lazyfork", "delete", *[f["id"] for f in forks[j:j + 200]]], env, check=False)
    finally:
        if src:
            run([bins[0] / "lazyfork", "delete", src], env, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
