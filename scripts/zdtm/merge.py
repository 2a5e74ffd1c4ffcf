#!/usr/bin/env python3
"""Merge a quick run's rows into a full run's CSV (run.sh --merge).

usage: merge.py QUICK.csv FULL.csv FULL.md

The rows of the tests the quick run ran (not its skips) replace the full CSV's rows of the
same tests; every other row stays as the full run wrote it. Each row's `run` column names
the run it came from (its date and commit); FULL.csv's sidecar FULL.runs.json maps those
names to the runs' descriptions (ZDTM_META), which md.py prints in the report's header.
Rows of a CSV written before the column existed belong to the run named on FULL.md's
"Run:" line.
"""
import csv
import json
import os
import re
import sys

from run import FIELDS


def label(meta):
    """'2026-12-01 10:42 UTC, LazyFork ded0014 (...' -> '2026-12-01 10:42 UTC ded0014'."""
    m = re.match(r"([\d-]+ [\d:]+ UTC), LazyFork (\S+)", meta or "")
    return "%s %s" % (m.group(1), m.group(2)) if m else (meta or "unknown run")


def runs_path(full_csv):
    return re.sub(r"\.csv$", "", full_csv) + ".runs.json"


def main():
    quick_csv, full_csv, full_md = sys.argv[1:4]
    meta = os.environ.get("ZDTM_META", "")
    if not meta:
        sys.exit("merge.py: ZDTM_META is not set (run through run.sh --merge)")
    rp = runs_path(full_csv)
    runs = json.load(open(rp)) if os.path.exists(rp) else {}
    full = list(csv.DictReader(open(full_csv)))
    if full and not full[0].get("run"):
        base = ""
        if os.path.exists(full_md):
            for line in open(full_md):
                if line.startswith("Run: "):
                    base = line[len("Run: "):].strip().rstrip(".")
                    break
        if not base:
            sys.exit("merge.py: %s names no run (no Run: line) to credit its rows to" % full_md)
        runs.setdefault(label(base), base)
        for r in full:
            r["run"] = label(base)
    this = label(meta)
    runs[this] = meta
    quick = {r["test"]: r for r in csv.DictReader(open(quick_csv)) if r["fork"] != "skip"}
    known = {r["test"] for r in full}
    unknown = sorted(set(quick) - known)
    if unknown:
        sys.exit("merge.py: %s not in %s (another manifest?)" % (", ".join(unknown), full_csv))
    for i, r in enumerate(full):
        if r["test"] in quick:
            full[i] = dict(quick[r["test"]], run=this)
    # Runs no row comes from any more are dropped from the sidecar.
    runs = {k: v for k, v in runs.items() if any(r["run"] == k for r in full)}
    tmp = full_csv + ".merge"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS + ["run"], extrasaction="ignore")
        w.writeheader()
        w.writerows(full)
    with open(rp + ".merge", "w") as f:
        json.dump(runs, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(rp + ".merge", rp)
    os.replace(tmp, full_csv)
    print("merged %d rows (%s) into %s" % (len(quick), ", ".join(sorted(quick)), full_csv), file=sys.stderr)


if __name__ == "__main__":
    main()
