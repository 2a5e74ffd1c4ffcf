"""One fork's memory over time (bench.py --fork-memory): a container holding a 256 MiB heap
(agent.py) is dumped, rewritten into memory files and forked once; the fork's
/proc/PID/smaps_rollup (and smaps, to tell the memory files from the libraries) is sampled
every 0.5 s for 30 s. Writes fork_memory.csv and fork_memory.png to the results directory;
`make fork-memory` copies the PNG to docs/fork-memory.png.

Columns (bytes): rss, pss, anonymous, shared_clean/dirty, private_clean/dirty from
smaps_rollup; memfile_bytes, the resident pages mapped from the memory files (clean: the
tmpfs page cache every fork of the family shares); private_bytes = anonymous, the pages the
fork owns (written since the restore, copied on write, or never in a memory file).
"""
import csv
import json
import time
from pathlib import Path

from bench import BIN, MiB, log, now, smaps

ROLLUP = ("Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty", "Anonymous")
FIELDS = ["t_s", "rss", "pss", "anonymous", "shared_clean", "shared_dirty", "private_clean", "private_dirty",
          "memfile_bytes", "private_bytes"]


def rollup(pid):
    """smaps_rollup's fields in bytes, None once the process is gone."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ROLLUP:
                out[k.lower()] = int(v.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return out


def run(b, heap, seconds, interval):
    """Create, dump, rewrite, fork once, sample; returns (samples, facts)."""
    b.clean_stale()
    b.tmp.mkdir(mode=0o700, parents=True, exist_ok=True)
    log(f"fork memory: a {heap} MiB agent, one fork sampled every {interval} s for {seconds} s")
    src = b.create_source(heap, b.name("fm", "src"))
    snap = b.dump(src["id"])
    p = b.run([BIN / "lf-restore", "--rm", "--name", b.name("fm", "fork")], input=json.dumps(snap), timeout=600)
    fork = b.jsonl(p.stdout)[0]
    pid = int(fork["pid"])
    samples, t0 = [], now()
    while now() - t0 < seconds:
        t = now()
        r, s = rollup(pid), smaps(pid)
        if r is None or s is None:
            raise RuntimeError(f"fork {fork['id']} (pid {pid}) exited after {t - t0:.1f} s")
        row = dict(t_s=round(t - t0, 2), **r, memfile_bytes=s["memfile_mapped_bytes"], private_bytes=r["anonymous"])
        samples.append(row)
        time.sleep(max(0.0, t + interval - now()))
    # What the figure is for: the fork's heap is pages of the memory files, not its own.
    if max(r["memfile_bytes"] for r in samples) == 0:
        raise RuntimeError(f"fork {fork['id']} maps no page of the memory files: the rewrite did not take")
    facts = dict(heap_mb=heap, fork=fork["id"], restore_ms=fork.get("restore_ms"),
                 family_bytes=b.stats(fork["id"]).get("family_bytes"), pages_moved=snap["memfile"]["pages_moved"],
                 memfiled_bytes=snap["memfile"]["bytes_written"])
    return samples, facts


def write(out, samples, facts):
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "fork_memory.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(samples)
    (out / "fork_memory.json").write_text(json.dumps(facts, indent=2) + "\n")
    first, last = samples[0], samples[-1]
    log(f"fork memory: {len(samples)} samples; memory files {first['memfile_bytes'] / MiB:.1f} -> "
        f"{last['memfile_bytes'] / MiB:.1f} MiB resident, private {first['private_bytes'] / MiB:.1f} -> "
        f"{last['private_bytes'] / MiB:.1f} MiB, rss {last['rss'] / MiB:.1f} MiB, pss {last['pss'] / MiB:.1f} MiB; "
        f"family memory files {(facts['family_bytes'] or 0) / MiB:.1f} MiB")


def plot(out):
    """fork_memory.png from fork_memory.csv (matplotlib; ImportError when it is missing)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(out / "fork_memory.csv") as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    facts = json.loads((out / "fork_memory.json").read_text())
    t = [r["t_s"] for r in rows]
    mem = [r["memfile_bytes"] / MiB for r in rows]
    priv = [r["private_bytes"] / MiB for r in rows]
    fig, (ax, low) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, gridspec_kw=dict(height_ratios=[3, 1]))
    ax.stackplot(t, priv, mem, labels=["private: anonymous, the fork's own pages",
                                       "shared: resident from the memory files (tmpfs)"],
                 colors=["tab:red", "tab:blue"], alpha=0.75)
    ax.plot(t, [r["rss"] / MiB for r in rows], "k--", lw=1, label="RSS (all mappings, incl. libraries)")
    ax.set_ylabel("MiB resident")
    ax.set_title(f"One fork of a {facts['heap_mb']} MiB agent, sampled every 0.5 s "
                 f"(family memory files {(facts['family_bytes'] or 0) / MiB:.0f} MiB)", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    low.plot(t, [r["private_bytes"] / 1024 for r in rows], color="tab:red")
    low.set_ylabel("private KiB")
    low.set_ylim(bottom=0)
    low.set_xlabel("seconds since lf-restore returned (the fork running)")
    low.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "fork_memory.png", dpi=110)
    plt.close(fig)
