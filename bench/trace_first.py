#!/usr/bin/env python3
"""Where a running container's first fork + exec spends its time, step by step, builds side by side.

    bench/trace_first.py [--heap 256] [-k 4] --bin OLD/bin --bin NEW/bin [--raw DIR]

Starts one `lazyfork daemon run` per build (trace_repeat.py's Build). Each round, for each
build in turn (the order alternates), it creates a fresh source running bench/agent.py,
waits for its heap, runs `lazyfork --trace fork SRC --name X --json` (the swap) and
`lazyfork --trace exec X -- hostname`, reads the source's pause from its agent and deletes
both. Prints per build the median of both commands, the pause and (--steps) every traced
step. A measurement, never a target: run it alone (`flock /tmp/lazyfork-bench.lock ...`).
"""
import argparse
import json
import sys
import time

from trace_repeat import AGENT, IMAGE, PREFIX, Build, fork_exec, pauses, print_medians, spans  # bench/ is this script's directory


def wait_heap(b, src, heap):
    deadline = time.monotonic() + 120
    while True:
        info = next((r for r in json.loads(b.lf("list", "--json").stdout or "[]") if r["id"] == src), {})
        if info.get("memory_bytes", 0) >= heap * (1 << 20) * 0.97:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"source heap of {heap} MiB not resident after 120 s")
        time.sleep(0.3)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", action="append", required=True, help="a build's bin directory (repeat to compare)")
    ap.add_argument("--heap", type=int, default=256, help="the agent's heap, MiB")
    ap.add_argument("-k", type=int, default=4, help="rounds (one first fork + exec per build each)")
    ap.add_argument("--steps", action="store_true", help="also print every traced step's median")
    ap.add_argument("--raw", metavar="DIR", help="write each command's trace there")
    ap.add_argument("--fork-arg", action="append", default=[], help="an extra argument of every fork (repeat)")
    a = ap.parse_args()
    builds = [Build(i, d) for i, d in enumerate(a.bin)]
    made = []
    try:
        for b in builds:
            b.start()
        for r in range(a.k):
            for b in (builds if r % 2 == 0 else builds[::-1]):
                tag = b.sock.stem[-1]
                rec = json.loads(b.lf("create", IMAGE, "--name", f"{PREFIX}-{r}-{tag}-src", "--json", "--", "python3",
                                      "-c", AGENT, str(a.heap)).stdout)
                src = rec["id"]
                made.append((b, src))
                wait_heap(b, src, a.heap)
                time.sleep(1.2)
                pf, pe, fid, t_fork, t_exec, w0, w1 = fork_exec(b, src, f"{PREFIX}-{r}-{tag}", a.fork_arg, made, a.raw,
                                                                 f"{r}-{tag}")
                gaps = pauses(b, src)
                row = {"fork command": t_fork, "exec command": t_exec, "fork + exec": t_fork + t_exec,
                       "source paused": max([g for e, g in gaps if w0 <= e <= w1 + 0.05] or [0.0])}
                row.update({"fork: " + k: v for k, v in spans(pf.stderr).items()})
                row.update({"exec: " + k: v for k, v in spans(pe.stderr).items()})
                b.rows.append(row)
                print(f"{b.label} round {r}: fork+exec {row['fork + exec']:.0f} ms, paused {row['source paused']:.0f} ms",
                      file=sys.stderr)
                for x in (fid, src):
                    b.lf("delete", x, check=False)
                    made.remove((b, x))
        print(f"# {a.k} first forks + exec of a {a.heap} MiB agent per build, medians in ms", file=sys.stderr)
        keys = ["fork + exec", "fork command", "exec command", "source paused"]
        print_medians(builds, keys, a.steps, lambda label: label[-24:])
    finally:
        for b, x in reversed(made):
            b.lf("delete", x, check=False)
        for b in builds:
            b.stop()


if __name__ == "__main__":
    main()
