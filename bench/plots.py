"""PNG plots from a results directory's CSVs (python3 bench/plots.py DIR re-draws them)."""
import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MB = 1e6
STYLE = {"lazyfork": ("LazyFork", "tab:blue", "o"), "plain-criu": ("plain CRIU restore", "tab:red", "s"),
         "criu-lazy-pages": ("CRIU lazy-pages", "tab:orange", "^"), "lazyfork-share": ("LazyFork, source moved onto its snapshot", "tab:green", "D"),
         "lazyfork-e2e": ("lazyfork fork (end to end)", "tab:purple", "v"),
         "lazyfork-swrk": ("LazyFork, criu per fork (before the service)", "tab:cyan", "x")}
DASH = {128: ":", 256: "-"}


def load(path):
    if not path.exists():
        return []
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k, v in list(r.items()):
            try:
                r[k] = float(v) if v not in ("", None) and k not in ("method", "kind", "note", "stopped_at", "id") else v
            except ValueError:
                pass
    return rows


def series(rows, method, heap, key):
    rs = sorted((r for r in rows if r["method"] == method and r["heap_mb"] == heap and r.get("forks_run")
                 and r.get(key) not in ("", None)), key=lambda r: r["n"])
    return [r["n"] for r in rs], [r[key] for r in rs], rs


def lines(ax, rows, methods, key, scale=1.0, label_n=False):
    heaps = sorted({r["heap_mb"] for r in rows})
    for m in methods:
        name, color, marker = STYLE[m]
        for h in heaps:
            x, y, rs = series(rows, m, h, key)
            if not x:
                continue
            ax.plot(x, [v / scale for v in y], linestyle=DASH.get(int(h), "-"), color=color, marker=marker,
                    label=f"{name}, {int(h)} MiB")
            if label_n:
                for r in rs:
                    if r["forks_run"] < r["n"]:
                        ax.annotate(f"stopped at {int(r['forks_run'])}", (r["n"], r[key] / scale), fontsize=7,
                                    textcoords="offset points", xytext=(-40, 6))


def xaxis(ax, rows):
    ns = sorted({int(r["n"]) for r in rows if r.get("n") not in ("", None)})
    if len(ns) > 2:
        ax.set_xscale("log")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off() if len(ns) > 2 else None


def n_axes(axs, rows, which="both"):
    """Finishes axes over N: the forks as ticks, a grid, the legend."""
    for ax in axs:
        xaxis(ax, rows)
        ax.grid(True, which=which, alpha=0.3)
        ax.legend(fontsize=8)


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(out):
    out = Path(out)
    rows = load(out / "rows.csv")
    base = ["lazyfork", "plain-criu", "criu-lazy-pages"]

    fig, axs = plt.subplots(1, 2, figsize=(13, 5))
    lines(axs[0], rows, base, "fork_mem_p50_bytes", MB)
    axs[0].set(title="Memory per fork after 5 s (cgroup rss+cache+kmem, p50)", xlabel="forks (N)", ylabel="MB", yscale="log")
    axs[0].axhline(0.8, color="gray", lw=0.8, ls="--")
    axs[0].annotate("target 0.8 MB", (1, 0.85), fontsize=8, color="gray")
    lines(axs[1], rows, base, "forks_mem_total_bytes", MB, label_n=True)
    axs[1].set(title="Memory of all forks together (beyond the parent)", xlabel="forks (N)", ylabel="MB", yscale="log")
    n_axes(axs, rows)
    save(fig, out / "memory_vs_n.png")

    fig, axs = plt.subplots(1, 2, figsize=(13, 5))
    lines(axs[0], rows, base + ["lazyfork-swrk"], "restore_p50_ms")
    lines(axs[0], rows, base + ["lazyfork-swrk"], "restore_p95_ms")
    for ln in axs[0].get_lines()[len(axs[0].get_lines()) // 2:]:
        ln.set_alpha(0.35)
        ln.set_label("_" + ln.get_label())
    axs[0].set(title="Restore latency per fork: p50 (solid markers), p95 (faint)", xlabel="forks (N)", ylabel="ms", yscale="log")
    axs[0].axhline(60, color="gray", lw=0.8, ls="--")
    axs[0].annotate("target 60 ms", (1, 63), fontsize=8, color="gray")
    lines(axs[1], rows, base + ["lazyfork-e2e", "lazyfork-swrk"], "wall_ms", 1000, label_n=True)
    axs[1].set(title="Wall time to make N forks", xlabel="forks (N)", ylabel="s", yscale="log")
    axs[1].axhline(4, color="gray", lw=0.8, ls="--")
    n_axes(axs, rows)
    save(fig, out / "latency_vs_n.png")

    fig, ax = plt.subplots(figsize=(7, 5))
    lines(ax, rows, ["plain-criu", "lazyfork", "lazyfork-share"], "family_ram_bytes", MB, label_n=True)
    ax.set(title="Family RAM: source + forks (+ memory files)", xlabel="forks (N)", ylabel="MB", yscale="log")
    n_axes([ax], rows, which="major")
    save(fig, out / "family_ram.png")

    lin = load(out / "lineage.csv")
    if lin:
        fig, ax = plt.subplots(figsize=(7, 5))
        lv = [r["level"] for r in lin]
        ax.bar([x - 0.2 for x in lv], [r["dump_pages_written"] for r in lin], width=0.4, label="pages dumped")
        if all(r.get("delta_pages") not in ("", None) for r in lin):
            ax.bar([x + 0.2 for x in lv], [r["delta_pages"] for r in lin], width=0.4, label="delta pages")
        ax.set(title="Lineage: snapshot size per level (log)", xlabel="level", ylabel="pages", yscale="log")
        ax2 = ax.twinx()
        ax2.plot(lv, [r["restore_ms"] for r in lin], color="black", marker="o", label="restore ms")
        ax2.set_ylabel("restore ms")
        ax2.set_ylim(bottom=0)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=8)
        save(fig, out / "lineage.png")

    cp = load(out / "memfile_vs_copy.csv")
    if cp:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        labels = ["lf-memfile", "cp", "dd bs=1M"]
        wdt = 0.8 / len(cp)
        for i, c in enumerate(cp):
            ax.bar([j + i * wdt for j in range(3)], [c["memfile_mb_s"], c["cp_mb_s"], c["dd_mb_s"]], width=wdt,
                   label=f"{int(c['heap_mb'])} MiB heap")
        ax.set_xticks([j + 0.4 - wdt / 2 for j in range(3)], labels)
        ax.set(title="Writing the memory files vs a plain copy on the same tmpfs", ylabel="MB/s")
        ax.legend(fontsize=8)
        save(fig, out / "memfile_vs_copy.png")


if __name__ == "__main__":
    render(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent / "results")
