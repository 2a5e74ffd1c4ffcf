#!/usr/bin/env python3
"""Huge pages for a copy's memory files, side by side (issue 14: "a fork's memory after 5 s
of the workload, default options").

    python3 bench/huge_pages.py --mode before=/tmp/before/bin --mode after=bin \\
        --mode after-4k=bin:--huge-pages=false [--runs 3] [--ns 10,100] [--conditions fresh,idle]

A mode is NAME=DIR[:LF-MEMFILE ARGS] (args split on commas). For each run, condition and
mode (alternating the order, so drift hits every mode alike): a fresh container running
bench/agent.py with a --heap MiB heap, `lf-dump` of it, then `lf-memfile` (the copy path:
`lazyfork fork --copy`, the bench's memory and scale rows) under a condition of the
machine's free memory, then, for the fresh condition, N forks with `lf-restore -n N`
sampled as the bench samples them (cgroup charge after --settle s of the workload, page
tables, smaps). Conditions: fresh, 512 MiB of tmpfs freed just before the rewrite (as a
deleted snapshot frees it: a host whose free pages are not handed back); idle, the
rewrite --idle s after the dump (on a VM with a free-page-reporting balloon, the guest's
free 2 MiB blocks are handed back to the host by then and cost a host fault again).
Prints p50s and writes huge_pages.csv to --out. Run as root, under
`flock /tmp/lazyfork-bench.lock`.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402 - local module
from bench import SHM, log, meminfo, pct, write_csv  # noqa: E402

REPORTED = Path("/sys/module/page_reporting/parameters/reported_kib")


def vmstat(*keys):
    kv = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    return {k: int(kv.get(k, 0)) for k in keys}


def reported_kib():
    try:
        return int(REPORTED.read_text())
    except (OSError, ValueError):
        return None


def free_tmpfs(b, mib):
    """Write and unlink mib MiB on the memory files' tmpfs: freed pages the next
    allocation finds before the balloon has reported them."""
    p = SHM / f"lfbench-{b.pid}-free"
    with open(p, "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(mib):
            f.write(chunk)
    p.unlink()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", action="append", required=True, help="NAME=DIR[:ARG,ARG] (repeat)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--heap", type=int, default=256, help="MiB")
    ap.add_argument("--ns", default="10,100", help="forks restored per snapshot, comma-separated ('' for none)")
    ap.add_argument("--conditions", default="fresh,idle")
    ap.add_argument("--idle", type=float, default=8.0, help="s between the dump and the rewrite (idle condition)")
    ap.add_argument("--settle", type=float, default=5.0, help="s each fork runs before it is sampled")
    ap.add_argument("--out", default="/tmp/lazyfork-bench-only")
    a = ap.parse_args()
    modes = bench.parse_builds("huge_pages", "--mode", a.mode, "lf-memfile", with_args=True)
    conds = [c for c in a.conditions.split(",") if c]
    if bad := [c for c in conds if c not in ("fresh", "idle")]:
        sys.exit(f"huge_pages: --conditions: unknown {bad}; the conditions are fresh, idle")
    ns = [int(x) for x in a.ns.split(",") if x]
    out, b = bench.side_by_side_bench("huge_pages", a.out, a.settle)
    rows = []
    try:
        for r in range(a.runs):
            for cond in conds:
                order = modes if r % 2 == 0 else modes[::-1]
                for name, d, args in order:
                    bench.BIN = d
                    src = b.create_source(a.heap, b.name("hp", name, cond, r, "src"))
                    dumped = b.run([d / "lf-dump", src["id"]]).stdout
                    if cond == "fresh":
                        free_tmpfs(b, 512)
                    else:
                        time.sleep(a.idle)
                    rep0, vm0 = reported_kib(), vmstat("thp_collapse_alloc", "thp_file_mapped")
                    t = time.time()
                    s = json.loads(b.run([d / "lf-memfile", *args], input=dumped).stdout)
                    wall = (time.time() - t) * 1000
                    rep1, vm1 = reported_kib(), vmstat("thp_collapse_alloc", "thp_file_mapped")
                    m = s["memfile"]
                    base = dict(mode=name, condition=cond, run=r, memfile_ms=m["ms"], memfile_wall_ms=wall,
                                bytes_written_mb=m["bytes_written"] / 1e6, huge_pages=m.get("huge_pages"),
                                thp_collapse_alloc=vm1["thp_collapse_alloc"] - vm0["thp_collapse_alloc"],
                                reported_mib_during=None if rep0 is None else (rep1 - rep0) / 1024)
                    log(f"{name} {cond} run {r}: lf-memfile {m['ms']:.0f} ms, {m['bytes_written'] / 1e6:.1f} MB, "
                        f"{m.get('huge_pages')} huge pages")
                    if cond != "fresh" or not ns:
                        rows.append(dict(base, n=0))
                    for n in ns if cond == "fresh" else []:
                        forks, wall_r, _, smp = b.restore(s, n, [b.name("hp", name, r, n, i) for i in range(n)])
                        ms = b.measure(forks, smp)
                        post = meminfo()
                        src_mem = (b.info(src["id"]) or {}).get("memory_bytes", 0)
                        fam = ms[0].get("family_bytes") or 0
                        row = dict(base, n=n, restore_p50_ms=pct([f["restore_ms"] for f in ms], 50),
                                   fork_mem_mb=pct([f["memory_bytes"] for f in ms], 50) / 1e6,
                                   fork_mem_max_mb=pct([f["memory_bytes"] for f in ms], 100) / 1e6,
                                   kmem_mb=pct([f.get("kmem") for f in ms], 50) / 1e6,
                                   rss_mb=pct([f.get("rss") for f in ms], 50) / 1e6,
                                   pte_mb=pct([f.get("pte_bytes") for f in ms], 50) / 1e6,
                                   family_files_mb=fam / 1e6,
                                   family_ram_mb=(src_mem + sum(f.get("memory_bytes_list") or 0 for f in ms) + fam) / 1e6,
                                   mem_available_gib=post["MemAvailable"] / (1 << 30))
                        rows.append(row)
                        log(f"  N={n}: fork {row['fork_mem_mb']:.3f} MB p50 (kmem {row['kmem_mb']:.3f}, page tables "
                            f"{row['pte_mb']:.3f}), family files {row['family_files_mb']:.1f} MB, family RAM "
                            f"{row['family_ram_mb']:.1f} MB, restore p50 {row['restore_p50_ms']:.0f} ms")
                        b.delete([f["id"] for f in forks])
                    b.delete([src["id"]])
    finally:
        for e in b.cleanup():
            log(f"cleanup: {e}")
    write_csv(out / "huge_pages.csv", rows)
    keys = ["memfile_ms", "bytes_written_mb", "huge_pages", "reported_mib_during", "fork_mem_mb", "kmem_mb", "pte_mb",
            "family_files_mb", "family_ram_mb", "restore_p50_ms"]
    print(f"{'mode':12} {'cond':6} {'N':>4} " + " ".join(f"{k:>17}" for k in keys) + f"   (p50 over {a.runs} runs)")
    for name, _, _ in modes:
        for cond in conds:
            for n in sorted({x["n"] for x in rows if x["mode"] == name and x["condition"] == cond}):
                rs = [x for x in rows if x["mode"] == name and x["condition"] == cond and x["n"] == n]
                cells = []
                for k in keys:
                    v = pct([x.get(k) for x in rs], 50)
                    cells.append(f"{v:17.3f}" if isinstance(v, float) else f"{v if v is not None else '-':>17}")
                print(f"{name:12} {cond:6} {n:>4} " + " ".join(cells))
    print(json.dumps({"csv": str(out / "huge_pages.csv")}))


if __name__ == "__main__":
    main()
