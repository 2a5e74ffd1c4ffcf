#!/usr/bin/env python3
"""What a fork's memory charge is made of, after --settle s of the workload (issue 14:
"a fork's memory after 5 s ... <= 0.8 MB"; the table in docs/how-it-works.md, section 11).

    python3 bench/fork_breakdown.py [--mode NAME=DIR[:LF-MEMFILE ARGS | :swap]]... [--n 4]
        [--runs 1] [--idle] [--trace]

For each mode (a build's bin directory and lf-memfile options; default: this checkout's bin):
a container running bench/agent.py, `lf-dump`, `lf-memfile`, `lf-restore -n N` (or, for
`swap`, `lazyfork fork SRC -n N`, the default for a running container), and for every fork
right after the restore returned and again --settle s later (all forks at once):
  - its cgroup's charge as the bench counts it (v1: total_rss + total_cache + kmem; v2:
    memory.current, and memory.stat's anon, file, kernel_stack, pagetables, slab, sock,
    percpu); with --trace, the kernel's memcg statistics summed over the run from the
    memcg tracepoints (an ftrace instance of its own), which give v1's parts too;
  - page tables (VmPTE) and where they go: every 2 MiB of address space with a page present
    (/proc/PID/pagemap) needs one 4 KiB page table unless a huge page maps it whole (smaps
    FilePmdMapped / AnonHugePages), counted per mapping: the heap's memory file, the other
    memory files, libraries, anonymous memory;
  - Rss / Anonymous per mapping kind (smaps);
  - the machine's slab growth per fork (/proc/slabinfo before and after, over N): most of
    it is not charged to the fork's group.
Prints a table per mode (p50 over the forks) and writes fork_breakdown.json to --out.
Run as root, under `flock /tmp/lazyfork-bench.lock`.
"""
import argparse
import json
import os
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402 - local module
from bench import log, pct  # noqa: E402

PMD = 2 << 20
TRACING = Path("/sys/kernel/tracing")
# Items of the memcg tracepoints (enum node_stat_item, then enum memcg_stat_item) that are
# kernel memory, numbered as /proc/vmstat lists the node items from nr_inactive_anon on
# (the kernel's enum order); the memcg items follow NR_VM_NODE_STAT_ITEMS.
NODE_KEYS = {"nr_slab_reclaimable": ("slab (reclaimable), B", 1), "nr_slab_unreclaimable": ("slab (unreclaimable), B", 1),
             "nr_kernel_stack": ("kernel stacks, KiB", 1024), "nr_page_table_pages": ("page tables, pages", 4096),
             "nr_anon_pages": ("anon, pages", 4096), "nr_file_pages": ("file, pages", 4096)}


def trace_items():
    names = [l.split()[0] for l in Path("/proc/vmstat").read_text().splitlines()]
    node = names[names.index("nr_inactive_anon"):names.index("nr_dirty_threshold")]
    items = {node.index(k): v for k, v in NODE_KEYS.items() if k in node}
    n = len(node)
    items.update({n + 1: ("sock, pages", 4096), n + 2: ("percpu, B", 1), n + 3: ("vmalloc, pages", 4096),
                  n + 4: ("kmem total, pages", 4096)})
    return items


class Trace:
    """An ftrace instance of our own recording the memcg stat tracepoints."""

    def __init__(self):
        self.d = TRACING / "instances" / f"lfbench-breakdown-{os.getpid()}"
        self.d.mkdir()
        (self.d / "buffer_size_kb").write_text("65536")
        for e in ("mod_memcg_state", "mod_memcg_lruvec_state"):
            (self.d / "events" / "memcg" / e / "enable").write_text("1")
        (self.d / "tracing_on").write_text("1")

    def stop(self):
        (self.d / "tracing_on").write_text("0")
        sums = {}
        with open(self.d / "trace") as f:
            for line in f:
                i = line.find("memcg_id=")
                if i < 0:
                    continue
                kv = dict(x.split("=") for x in line[i:].split())
                k = (int(kv["memcg_id"]), int(kv["item"]))
                sums[k] = sums.get(k, 0) + int(kv["val"])
        return sums

    def close(self):
        for e in ("mod_memcg_state", "mod_memcg_lruvec_state"):
            (self.d / "events" / "memcg" / e / "enable").write_text("0")
        self.d.rmdir()
PAGE = 4096
V1 = Path("/sys/fs/cgroup/memory")


def cgroup_dir(pid):
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if "memory" in ctrls.split(",") and V1.is_dir():
            return "v1", V1 / path.lstrip("/")
        if ctrls == "" and not V1.is_dir():
            return "v2", Path("/sys/fs/cgroup") / path.lstrip("/")
    return None, None


def global_slabs():
    """/proc/slabinfo: bytes of active objects per cache, the whole machine."""
    out = {}
    for line in Path("/proc/slabinfo").read_text().splitlines()[2:]:
        f = line.split()
        out[f[0]] = int(f[1]) * int(f[3])
    return out


def cg_parts(pid):
    kind, d = cgroup_dir(pid)
    if d is None:
        return {}
    kv = dict(l.split() for l in (d / "memory.stat").read_text().splitlines())
    if kind == "v1":
        kmem = int((d / "memory.kmem.usage_in_bytes").read_text())
        rss, cache = int(kv["total_rss"]), int(kv["total_cache"])
        return dict(charge=rss + cache + kmem, rss=rss, cache=cache, kmem=kmem, procs=[int(x) for x in (d / "cgroup.procs").read_text().split()])
    return dict(charge=int((d / "memory.current").read_text()),
                **{k: int(kv.get(k, 0)) for k in ("anon", "file", "kernel", "kernel_stack", "pagetables", "sec_pagetables",
                                                   "percpu", "sock", "slab", "slab_reclaimable", "slab_unreclaimable",
                                                   "vmalloc", "shmem")},
                procs=[int(x) for x in (d / "cgroup.procs").read_text().split()])


def vmas(pid):
    """[(start, end, name, fields)] from smaps."""
    out, cur = [], None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            s, e = (int(x, 16) for x in head[0].split("-"))
            cur = (s, e, head[5] if len(head) > 5 else "", {})
            out.append(cur)
        elif head[0].endswith(":") and len(head) >= 2 and head[1].isdigit():
            cur[3][head[0][:-1]] = int(head[1]) * 1024
    return out


def kind_of(name, heap_file):
    if name == heap_file:
        return "heap memory file"
    if "/lazyfork" in name and ("memfile" in name or "/dev/shm" in name or name.startswith("/dev/shm")):
        return "other memory files"
    if name.startswith("/") and not name.startswith("/dev/shm"):
        return "files (binary, libraries)"
    if name == "[stack]":
        return "stack"
    if name in ("[vdso]", "[vvar]", "[vsyscall]", "[vvar_vclock]"):
        return "vdso"
    return "anonymous" if not name.startswith("/") else "other memory files"


def page_tables(pid, vs):
    """2 MiB stretches with a present page and no huge mapping, by the kind of the mapping
    that holds most of them (a page table serves every mapping in its 2 MiB)."""
    heap_file = max(vs, key=lambda v: v[3].get("Rss", 0))[2]
    regions = {}
    with open(f"/proc/{pid}/pagemap", "rb") as pm:
        for s, e, name, f in vs:
            if name == "[vsyscall]":
                continue
            k = kind_of(name, heap_file)
            a = s
            while a < e:
                b = min(e, (a // PMD + 1) * PMD)
                pm.seek(a // PAGE * 8)
                data = pm.read((b - a) // PAGE * 8)
                present = any(struct.unpack_from("<Q", data, i)[0] >> 63 for i in range(0, len(data), 8))
                if present:
                    regions.setdefault(a // PMD, {}).setdefault(k, 0)
                    regions[a // PMD][k] += 1
                a = b
    by = {}
    for r, ks in regions.items():
        k = max(ks, key=ks.get)
        by[k] = by.get(k, 0) + 1
    pmd_mapped = sum((f.get("FilePmdMapped", 0) + f.get("AnonHugePages", 0) + f.get("ShmemPmdMapped", 0)) // PMD
                     for _, _, _, f in vs)
    return by, pmd_mapped, heap_file


def status(pid, *keys):
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in keys:
            out[k] = int(v.split()[0]) * 1024
    return out


def take(pid):
    cg = cg_parts(pid)
    per = []
    for p in cg.get("procs") or [pid]:
        try:
            vs = vmas(p)
            by, pmd_mapped, heap_file = page_tables(p, vs)
            st = status(p, "VmPTE", "VmRSS", "RssAnon", "RssFile", "RssShmem", "VmStk")
            rss_by, anon_by = {}, {}
            for _, _, name, f in vs:
                k = kind_of(name, heap_file)
                rss_by[k] = rss_by.get(k, 0) + f.get("Rss", 0)
                anon_by[k] = anon_by.get(k, 0) + f.get("Anonymous", 0)
            per.append(dict(pid=p, comm=Path(f"/proc/{p}/comm").read_text().strip(), status=st, pt_regions=by,
                            pmd_mapped=pmd_mapped, rss_by=rss_by, anon_by=anon_by, vmas=len(vs)))
        except (OSError, ProcessLookupError):
            continue
    return dict(cg=cg, procs=per)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", action="append",
                    help="NAME=DIR[:ARG,ARG] (repeat): lf-memfile ARGS, or 'swap' for `lazyfork fork SRC -n N` "
                         "(the default for a running container); default this checkout's bin")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--heap", type=int, default=256, help="MiB")
    ap.add_argument("--n", type=int, default=4, help="forks per snapshot")
    ap.add_argument("--settle", type=float, default=5.0, help="s each fork runs before it is read")
    ap.add_argument("--out", default="/tmp/lazyfork-bench-only")
    ap.add_argument("--idle", action="store_true", help="the agent only holds its heap (reads nothing)")
    ap.add_argument("--trace", action="store_true", help="sum the memcg stat tracepoints over each fork's life")
    a = ap.parse_args()
    here = Path(__file__).resolve().parent.parent / "bin"
    modes = bench.parse_builds("fork_breakdown", "--mode", a.mode or [f"default={here}"], "lf-memfile", with_args=True)
    out, b = bench.side_by_side_bench("fork_breakdown", a.out, a.settle)
    res = []
    try:
        for r in range(a.runs):
            for name, d, args in (modes if r % 2 == 0 else modes[::-1]):
                bench.BIN = d
                src = b.create_source(a.heap, b.name("bd", name, r, "src"), idle=a.idle)
                swap = args == ["swap"]
                s = {"memfile": {}} if swap else b.dump(src["id"], memfile_args=args)
                names = [b.name("bd", name, r, i) for i in range(a.n)]
                tr = Trace() if a.trace else None
                slab0 = global_slabs()
                try:
                    if swap:  # the default `lazyfork fork` of a running container: the source swapped onto its snapshot
                        forks = b.jsonl(b.lf("fork", src["id"], "-n", a.n, "--json",
                                             *[x for nm in names for x in ("--name", nm)], timeout=900).stdout)
                    else:
                        forks, _, _, _ = b.restore(s, a.n, names)
                    t0 = time.time()
                    first = {f["id"]: take(int(f["pid"])) for f in forks}
                    time.sleep(max(0.0, t0 + a.settle - time.time()))
                    now = {f["id"]: take(int(f["pid"])) for f in forks}
                    slab1 = global_slabs()
                    sums = tr.stop() if tr else {}
                finally:
                    if tr:
                        tr.close()
                items = trace_items()
                for f in forks:
                    x = now[f["id"]]
                    _, d = cgroup_dir(int(f["pid"]))
                    ino = os.stat(d).st_ino
                    traced = {items[it][0]: v * items[it][1] for (mid, it), v in sums.items() if mid == ino and it in items}
                    res.append(dict(mode=name, run=r, fork=f["id"], restore_ms=f.get("restore_ms"),
                                    huge_pages=s["memfile"].get("huge_pages"), memfile_ms=s["memfile"].get("ms"),
                                    at_restore=first[f["id"]], traced=traced,
                                    slab_per_fork={c: (slab1.get(c, 0) - slab0.get(c, 0)) / len(forks)
                                                   for c in set(slab0) | set(slab1)}, **x))
                b.delete([f["id"] for f in forks] + [src["id"]])
    finally:
        for e in b.cleanup():
            log(f"cleanup: {e}")
    (out / "fork_breakdown.json").write_text(json.dumps(res, indent=1) + "\n")
    report(res, [m[0] for m in modes])


def report(res, names):
    MB = 1e6
    for name in names:
        rs = [x for x in res if x["mode"] == name]
        if not rs:
            continue

        def p(fn):
            v = pct([fn(x) for x in rs], 50)
            return "-" if v is None else f"{v / MB:.3f}"

        def proc_sum(x, fn):
            return sum(fn(q) for q in x["procs"])

        kinds = sorted({k for x in rs for q in x["procs"] for k in list(q["pt_regions"]) + list(q["rss_by"])})
        print(f"== {name}: {len(rs)} forks, memfile {pct([x['memfile_ms'] for x in rs], 50)} ms, "
              f"huge pages {rs[0]['huge_pages']}, processes {pct([len(x['procs']) for x in rs], 50)}; MB p50")
        print(f"charge                      {p(lambda x: x['cg'].get('charge', 0))}")
        for k in ("rss", "cache", "kmem", "anon", "file", "kernel", "kernel_stack", "pagetables", "percpu", "sock"):
            if any(k in x["cg"] for x in rs):
                print(f"  cgroup {k:20} {p(lambda x: x['cg'].get(k, 0))}")
        for k in sorted({k for x in rs for k in x.get("traced", {})}):
            print(f"  traced {k:20} {p(lambda x: x['traced'].get(k, 0))}")
        print(f"  charge at restore         {p(lambda x: x['at_restore']['cg'].get('charge', 0))} "
              f"(VmPTE {p(lambda x: proc_sum(x['at_restore'], lambda q: q['status'].get('VmPTE', 0)))}, rss "
              f"{p(lambda x: x['at_restore']['cg'].get('rss', 0))}, kmem {p(lambda x: x['at_restore']['cg'].get('kmem', 0))})")
        print(f"  VmPTE (all processes)     {p(lambda x: proc_sum(x, lambda q: q['status'].get('VmPTE', 0)))}")
        print(f"  2 MiB stretches mapped by 4 KiB pages (= page tables), x 4 KiB:")
        for k in kinds:
            print(f"    {k:24} {p(lambda x: proc_sum(x, lambda q: q['pt_regions'].get(k, 0) * 4096))}"
                  f"   ({pct([proc_sum(x, lambda q: q['pt_regions'].get(k, 0)) for x in rs], 50)} tables)")
        print(f"  PMD-mapped huge pages     {pct([proc_sum(x, lambda q: q['pmd_mapped']) for x in rs], 50)}")
        print(f"  Anonymous (owned) by mapping:")
        for k in kinds:
            print(f"    {k:24} {p(lambda x: proc_sum(x, lambda q: q['anon_by'].get(k, 0)))}")
        slabs = {}
        for x in rs:
            for c, v in (x.get("slab_per_fork") or {}).items():
                slabs.setdefault(c, []).append(v)
        top = sorted(slabs, key=lambda c: -pct(slabs[c], 50))[:16]
        if top:
            tot = sum(pct(v, 50) for v in slabs.values())
            print(f"  slab, the machine's /proc/slabinfo growth per fork: {tot / MB:.3f} MB; top: " +
                  ", ".join(f"{c} {pct(slabs[c], 50) / 1024:.1f}K" for c in top))


if __name__ == "__main__":
    main()
