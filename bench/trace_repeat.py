#!/usr/bin/env python3
"""Where a repeat fork + exec spends its time, step by step, for one or more builds side by side.

    bench/trace_repeat.py [--heap 256] [-k 8] --bin OLD/bin --bin NEW/bin

Starts one `lazyfork daemon run` per build (own socket, the same state roots), creates one
source running bench/agent.py through the first build's daemon, forks it once (the swap),
(with --own-source: one source per build, created and swapped by that build's daemon, for
changes to what a swap gives the source, its network namespace among them), then for k
rounds runs, for each build in turn, `lazyfork --trace fork SRC --name X --json`
and `lazyfork --trace exec X -- hostname` through that build's daemon and deletes X. It
prints, per build, the median wall time of both commands, of the source's pause (the agent's
longest gap during the fork) and of every traced step (lib/trace; ids are folded). Every
timing here is a measurement, never a target: run it on a quiet host, alone
(`flock /tmp/lazyfork-bench.lock bench/trace_repeat.py ...`). Everything it creates is named
trace-<pid>-... and deleted at the end, also on failure.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import end, parse_pauses  # bench/ is this script's directory

HERE = Path(__file__).resolve().parent
AGENT = (HERE / "agent.py").read_text()
IMAGE = os.environ.get("LF_BENCH_IMAGE", "lazyfork/debian:bookworm")
PREFIX = f"trace-{os.getpid()}"
IDS = re.compile(r"\b(s?[0-9a-f]{12})\b")
LINE = re.compile(r"^\s*(-?[0-9.]+)\s+([0-9.]+)  (.*)$")
ROUND = re.compile(r"\bX-[0-9]+-[0-9]+\b")  # a fork's name: X-round-build
SRC = re.compile(r"\bX-src[0-9]+\b")  # a build's own source (--own-source)
SINCE = re.compile(r"^\s*([0-9.]+)\s+\(since the recorder started\)")


def run(args, env, check=True, timeout=600, stdin=None):
    p = subprocess.run([str(a) for a in args], env=env, capture_output=True, text=True, timeout=timeout, input=stdin)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))}: exit {p.returncode}: {p.stderr.strip()[-2000:]}")
    return p


def since(stderr):
    """ms from the start of the command's main to its trace's end (None without a trace)."""
    for line in stderr.splitlines():
        m = SINCE.match(line)
        if m:
            return float(m[1])
    return None


def spans(stderr):
    """{step name (ids folded, indented as printed): ms}, same-named steps summed."""
    out = {}
    for line in stderr.splitlines():
        m = LINE.match(line)
        if not m or m[3].startswith("("):
            continue
        name = SRC.sub("X-src", ROUND.sub("X", IDS.sub("ID", m[3].replace(PREFIX, "X"))))
        out[name] = out.get(name, 0.0) + float(m[2])
    return out


class Build:
    def __init__(self, i, bindir):
        self.label, self.bin = f"{i}:{bindir}", Path(bindir)
        self.sock = Path("/run/lazyfork") / f"{PREFIX}-{i}.sock"
        self.env = dict(os.environ, LAZYFORK_SOCKET=str(self.sock), LAZYFORK_GROUP="none")
        self.env.pop("LAZYFORK_LOCAL", None)
        self.proc = None
        # A build from before --trace gives wall times only.
        help_text = run([self.bin / "lazyfork", "--help"], self.env, check=False).stdout
        self.trace = ["--trace"] if "--trace" in help_text else []
        self.rows = []  # per round: {"fork": ms, "exec": ms, "pause": ms, steps...}

    def lf(self, *args, **kw):
        return run([self.bin / "lazyfork", *args], self.env, **kw)

    def start(self):
        self.sock.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.log = open(f"/tmp/{PREFIX}-daemon-{self.sock.stem}.log", "ab")
        self.proc = subprocess.Popen([self.bin / "lazyfork", "daemon", "run"], env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=self.log, start_new_session=True)
        deadline = time.monotonic() + 30
        while self.lf("daemon", "status", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon of {self.label} did not answer on {self.sock}")
            time.sleep(0.1)

    def stop(self):
        if self.proc:
            end(self.proc, 60)
        for f in (self.sock, Path(f"{self.sock}.lock")):
            f.unlink(missing_ok=True)


def pauses(b, src):
    return parse_pauses(b.lf("exec", src, "--", "cat", "/tmp/lf-pauses", check=False).stdout)


def fork_exec(b, src, name, fork_args, made, raw, tag):
    """Forks src through build b as name, then execs hostname in the fork, each command
    timed. The fork joins made; with raw, both commands' stderr (their traces) are kept
    there as <tag>-fork.txt and <tag>-exec.txt. Returns the two processes, the fork's id,
    both times in ms and the wall clock around the fork command."""
    w0, t = time.time(), time.monotonic()
    pf = b.lf(*b.trace, "fork", src, "--name", name, "--json", *fork_args)
    t_fork, w1 = (time.monotonic() - t) * 1000, time.time()
    fid = json.loads(pf.stdout.splitlines()[0])["id"]
    made.append((b, fid))
    t = time.monotonic()
    pe = b.lf(*b.trace, "exec", fid, "--", "hostname")
    t_exec = (time.monotonic() - t) * 1000
    if raw:
        Path(raw).mkdir(parents=True, exist_ok=True)
        for what, p in (("fork", pf), ("exec", pe)):
            (Path(raw) / f"{tag}-{what}.txt").write_text(p.stderr)
    return pf, pe, fid, t_fork, t_exec, w0, w1


def print_medians(builds, keys, steps, short):
    """Prints one row per step (keys first, then with steps every other traced step) and one
    column per build: the median of its rounds, in ms. short(label) names a column."""
    keys = list(keys)
    if steps:
        for b in builds:
            for row in b.rows:
                keys += [k for k in row if k not in keys]
    width = max(len(k) for k in keys)
    print(f"{'':{width}}  " + "  ".join(f"{short(b.label):>24}" for b in builds))
    for k in keys:
        cells = []
        for b in builds:
            vals = [row[k] for row in b.rows if k in row]
            cells.append(f"{statistics.median(vals):24.1f}" if vals else f"{'-':>24}")
        print(f"{k:{width}}  " + "  ".join(cells))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", action="append", required=True, help="a build's bin directory (repeat to compare)")
    ap.add_argument("--heap", type=int, default=256, help="the agent's heap, MiB")
    ap.add_argument("-k", type=int, default=8, help="rounds (one repeat fork + exec per build each)")
    ap.add_argument("--steps", action="store_true", help="also print every traced step's median")
    ap.add_argument("--raw", metavar="DIR", help="write each command's trace there")
    ap.add_argument("--own-source", action="store_true", help="one source per build, swapped by that build")
    a = ap.parse_args()
    builds = [Build(i, d) for i, d in enumerate(a.bin)]
    srcs, made = {}, []
    try:
        for b in builds:
            b.start()
        b0 = builds[0]
        for b in (builds if a.own_source else [b0]):
            rec = json.loads(b.lf("create", IMAGE, "--name", f"{PREFIX}-src{b.sock.stem[-1]}", "--json", "--", "python3",
                                  "-c", AGENT, str(a.heap)).stdout)
            srcs[b] = rec["id"]
        for b, src in srcs.items():
            deadline = time.monotonic() + 120
            while True:
                info = next((r for r in json.loads(b.lf("list", "--json").stdout or "[]") if r["id"] == src), {})
                if info.get("memory_bytes", 0) >= a.heap * (1 << 20) * 0.97:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"source heap of {a.heap} MiB not resident after 120 s")
                time.sleep(0.3)
        time.sleep(1.2)
        for b, src in srcs.items():
            first = json.loads(b.lf("fork", src, "--json").stdout.splitlines()[0])  # the swap
            b.lf("delete", first["id"])
        spans_at = []
        for r in range(a.k):
            for b in builds:
                src = srcs.get(b, srcs[b0])
                name = f"{PREFIX}-{r}-{b.sock.stem[-1]}"
                pf, pe, fid, t_fork, t_exec, w0, w1 = fork_exec(b, src, name, [], made, a.raw, f"{r}-{b.sock.stem[-1]}")
                row = {"fork command": t_fork, "exec command": t_exec, "fork + exec": t_fork + t_exec}
                # What the command's wall time holds besides its main: the binary's start
                # (runtime, package inits), its exit and the spawn from here.
                for what, p, wall in (("fork", pf, t_fork), ("exec", pe, t_exec)):
                    if since(p.stderr) is not None:
                        row[f"{what} command outside main"] = wall - since(p.stderr)
                row.update({"fork: " + k: v for k, v in spans(pf.stderr).items()})
                row.update({"exec: " + k: v for k, v in spans(pe.stderr).items()})
                b.rows.append(row)
                spans_at.append((b, row, w0, w1))
                b.lf("delete", fid)
                made.remove((b, fid))
        gaps = {b: pauses(b, src) for b, src in srcs.items()}
        for b, row, w0, w1 in spans_at:
            row["source paused"] = max([g for e, g in gaps.get(b, gaps[b0]) if w0 <= e <= w1 + 0.05] or [0.0])
        print(f"# {a.k} repeat forks + exec of a {a.heap} MiB agent per build, medians in ms", file=sys.stderr)
        keys = ["fork + exec", "fork command", "exec command", "fork command outside main", "exec command outside main",
                "source paused"]
        print_medians(builds, keys, a.steps, lambda label: label[:24])
    finally:
        for b, fid in made:
            b.lf("delete", fid, check=False)
        for b, src in srcs.items():
            b.lf("delete", src, check=False)
        for b in builds:
            b.stop()


if __name__ == "__main__":
    main()
