#!/usr/bin/env python3
"""The source's pause at its first fork, side by side for two or more builds (issue 14).

    python3 bench/first_pause.py --bin before=/work/main/bin --bin after=bin [--runs 5] [--heap 256]

For each run and each build (alternating which goes first, so drift hits both alike): a
fresh container running bench/agent.py with a heap of --heap MiB, one `lazyfork fork`
of it (local, no daemon), the longest gap its agent saw during the fork (the pause), and
the fork's timings (dump, CRIU's frozen part, rewrite, swap, preallocation), the fork's
memory charge and page tables after --settle s of the workload and the family's memory
files. Prints p50s
and writes first_pause.csv to --out. Run as root, under `flock /tmp/lazyfork-bench.lock`.
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402 - local module
from bench import log, pct, write_csv  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", action="append", required=True, help="NAME=DIR of lazyfork binaries (repeat)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--heap", type=int, default=256, help="MiB")
    ap.add_argument("--out", default="/tmp/lazyfork-bench-only")
    ap.add_argument("--settle", type=float, default=5.0, help="s the fork runs before its memory is read")
    ap.add_argument("--daemon", action="store_true",
                    help="fork through a `lazyfork daemon run` of the build (as the bench's repeat rows do)")
    a = ap.parse_args()
    builds = bench.parse_builds("first_pause", "--bin", a.bin, "lazyfork")
    out, b = bench.side_by_side_bench("first_pause", a.out)
    rows = []
    try:
        for r in range(a.runs):
            order = builds if r % 2 == 0 else builds[::-1]
            for name, d in order:
                bench.BIN = d
                src = b.create_source(a.heap, b.name("fp", name, r, "src"))
                env = b.start_daemon() if a.daemon else None
                time.sleep(0.5)
                t0 = time.time()
                try:
                    f = b.jsonl(b.lf("fork", src["id"], "--name", b.name("fp", name, r, "f"), "--json",
                                     timeout=600, env=env).stdout)[0]
                finally:
                    t1 = time.time()
                    for e in b.stop_daemon():
                        log(f"warning: {e}")
                gaps = b.source_pauses(src["id"])
                pause = max([g for e, g in gaps if t0 <= e <= t1 + 0.05] or [None], key=lambda x: x or 0)
                st = b.stats(f["id"])
                tim = st.get("timings_ms") or {}
                # The fork's charge once it has run the workload a.settle s (the bench's
                # "a fork's memory after 5 s"), its page tables, the family's memory files.
                time.sleep(max(0.0, t1 + a.settle - time.time()))
                mem = bench.cg_memory(int(f["pid"])) or {}
                row = dict(build=name, run=r, pause_ms=pause, fork_ms=(t1 - t0) * 1000, **tim,
                           fork_mem_mb=(mem.get("memory_bytes") or 0) / 1e6,
                           fork_pte_kb=(bench.vm_pte(int(f["pid"])) or 0) / 1024,
                           family_mb=(st.get("family_bytes") or 0) / 1e6)
                rows.append(row)
                log(f"{name} run {r}: pause {pause} ms; " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(tim.items())))
                b.delete([f["id"], src["id"]])
    finally:
        b.cleanup()
    write_csv(out / "first_pause.csv", rows)
    keys = ["pause_ms", "fork_ms", "prealloc_ms", "dump_ms", "frozen_ms", "memfile_ms", "swap_ms", "restore_ms",
            "fork_mem_mb", "fork_pte_kb", "family_mb"]
    print("build  " + "  ".join(f"{k:>12}" for k in keys) + "   (p50 over %d runs)" % a.runs)
    for name, _ in builds:
        rs = [x for x in rows if x["build"] == name]
        cells = []
        for k in keys:
            v = pct([x.get(k) for x in rs], 50)
            cells.append((f"{v:12.3f}" if k.endswith("_mb") else f"{v:12.0f}") if v is not None else f"{'-':>12}")
        print(f"{name:6} " + "  ".join(cells))
    print(json.dumps({"csv": str(out / "first_pause.csv")}))


if __name__ == "__main__":
    main()
