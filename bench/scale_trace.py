#!/usr/bin/env python3
"""Where the time of `lf-restore -n N` goes, for one or more builds side by side.

    bench/scale_trace.py [--heap 256] [-n 100 -n 300] [--rounds 2] --bin OLD/bin --bin NEW/bin

Creates one source running bench/agent.py with the first build, snapshots it once
(`lf-dump | lf-memfile`), then for each round, each N and each build in turn runs
`lf-restore -n N --trace` of that snapshot and deletes the forks (not timed). It prints per
run the batch's wall time, the CPU of lf-restore and its criu (service, workers and their
helpers: reaped children, so neither the restored forks nor other work on the host), the
CPU each restored tree has used by the end of the batch (p50: criu's restore code ran in
its root task before it became the workload; see tree_cpu_ms), the
restore_ms p50 of the first and last tenth of the batch, and the median per fork of every
traced step (lib/trace; ids folded). Every timing is a measurement, never a target: run it
alone (`flock /tmp/lazyfork-bench.lock bench/scale_trace.py ...`). Everything it creates is
named scale-<pid>-... and deleted at the end, also on failure.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from trace_repeat import IDS, LINE, run  # bench/ is this script's directory

HERE = Path(__file__).resolve().parent
AGENT = (HERE / "agent.py").read_text()
IMAGE = os.environ.get("LF_BENCH_IMAGE", "lazyfork/debian:bookworm")
PREFIX = f"scale-{os.getpid()}"


def steps(stderr):
    """{step (ids folded, as indented): [ms of each fork]}; the batch-level steps once."""
    out = {}
    for line in stderr.splitlines():
        m = LINE.match(line)
        if not m or m[3].startswith("("):
            continue
        out.setdefault(IDS.sub("ID", m[3]), []).append(float(m[2]))
    return out


def pct(xs, p):
    xs = sorted(x for x in xs if x is not None)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))] if xs else None


def tree_cpu_ms(pid):
    """CPU time (ms) the restored tree rooted at pid has used: every thread of every process
    in it (/proc/*/task/*/schedstat, exact ns). The root task ran criu's restore code
    (mount namespace, memory, the restorer) before it became the workload: that is
    part of a fork's cost which getrusage of lf-restore's children does not count (the
    tree is never reaped), together with what the workload ran since (small for the
    agent, which sleeps)."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/schedstat") as f:
                    total += int(f.read().split()[0])
                try:
                    with open(f"/proc/{p}/task/{t}/children") as f:
                        todo += [int(c) for c in f.read().split()]
                except OSError:
                    pass
        except OSError:
            continue
    return total / 1e6


def delete(bindir, env, ids):
    for i in range(0, len(ids), 200):
        run([bindir / "lazyfork", "delete", *ids[i:i + 200]], env, check=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", action="append", required=True, help="a build's bin directory (repeat)")
    ap.add_argument("-n", action="append", type=int, help="forks per batch (repeat; default 100)")
    ap.add_argument("--heap", type=int, default=256, help="MiB the agent holds")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=40, help="how many steps to print per run")
    a = ap.parse_args()
    ns = a.n or [100]
    bins = [Path(b).resolve() for b in a.bin]
    env = dict(os.environ, LAZYFORK_LOCAL="1")
    src = None
    try:
        rec = json.loads(run([bins[0] / "lazyfork", "create", IMAGE, "--name", f"{PREFIX}-src", "--json", "--",
                              "python3", "-c", AGENT, str(a.heap)], env).stdout)
        src = rec["id"]
        time.sleep(max(3, a.heap / 40))  # the heap is filled and the agent in its loop
        snap = run([bins[0] / "lf-memfile"], env, stdin=run([bins[0] / "lf-dump", src], env).stdout).stdout
        results = []
        for r in range(a.rounds):
            for n in ns:
                for i, b in enumerate(bins):
                    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    t0 = time.monotonic()
                    p = run([b / "lf-restore", "-n", n, "--trace"], env, stdin=snap, timeout=1800)
                    wall = time.monotonic() - t0
                    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu = (ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime) * 1000
                    forks = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
                    lat = [f["restore_ms"] for f in forks]
                    tree = [tree_cpu_ms(f["pid"]) for f in forks if f.get("pid")]
                    tenth = max(1, n // 10)
                    st = steps(p.stderr)
                    res = dict(round=r, n=n, build=i, wall_s=wall, cpu_ms_per_fork=cpu / n, p50=pct(lat, 50),
                               tree_cpu_ms_p50=pct(tree, 50),
                               first_tenth_p50=pct(lat[:tenth], 50), last_tenth_p50=pct(lat[-tenth:], 50),
                               steps={k: (statistics.median(v), sum(v) / n, len(v)) for k, v in st.items()})
                    results.append(res)
                    print(f"round {r} N={n} build {i} ({b}): wall {wall:.2f} s, CPU {cpu / n:.1f} ms/fork "
                          f"+ {res['tree_cpu_ms_p50'] or 0:.1f} in the restored tree (p50), "
                          f"restore p50 {res['p50']:.0f} ms (first tenth {res['first_tenth_p50']:.0f}, "
                          f"last {res['last_tenth_p50']:.0f})", flush=True)
                    top = sorted(res["steps"].items(), key=lambda kv: -kv[1][1])[:a.steps]
                    for k, (med, per, cnt) in top:
                        print(f"    {med:8.2f} ms median  {per:8.2f} ms/fork  x{cnt:<5d} {k}")
                    delete(b, env, [f["id"] for f in forks])
        print(json.dumps(results), file=sys.stderr)
    finally:
        if src:
            delete(bins[0], env, [src])


if __name__ == "__main__":
    main()
