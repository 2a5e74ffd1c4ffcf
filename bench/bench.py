#!/usr/bin/env python3
"""LazyFork benchmark (issue 5): forks vs plain CRIU restore vs CRIU lazy-pages restore.

Run through bench/run.sh (`make bench`, or `make bench-smoke` for the short CI mode).
Standard library only; matplotlib for the plots (plots.py). Everything this creates is
named bench-<pid>-... and deleted on exit, also on failure or Ctrl-C; a later run also
removes what a killed run (dead pid) left behind.
"""
import argparse
import csv
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BIN = Path(os.environ.get("LAZYFORK_BIN", REPO / "bin"))
IMAGE = os.environ.get("LF_BENCH_IMAGE", "lazyfork/debian:bookworm")
CRIU = os.environ.get("LAZYFORK_CRIU") or next((c for c in ("/usr/local/lib/lazyfork/criu/bin/criu", "/usr/sbin/criu") if os.access(c, os.X_OK)), "criu")
AGENT = (HERE / "agent.py").read_text()
STATE_ROOT = Path(os.environ.get("LAZYFORK_ROOT", "/var/lib/lazyfork"))
MiB, GiB, PAGE = 1 << 20, 1 << 30, 4096
FLOOR = 4 * GiB  # plain/lazy-pages baselines stop before MemAvailable would drop below this
SHM = Path("/dev/shm")  # the tmpfs the memory files live on (LAZYFORK_RUN default)

FULL = dict(
    heaps=[128, 256], ns=[1, 10, 25, 50, 100], plain_ns=[1, 10, 25, 50, 100],
    lazy_ns=[1, 10, 25, 50], share_ns={256: [1, 10, 100], 128: [10, 100]},
    lineage_heap=256, lineage_levels=9, nfp_n=10, e2e_ns=[1, 100], swrk_ns=[1, 10, 100], huge_ns=[10, 100], settle=5.0,
    target_heap=256, copy_runs=3, confine_n=50, repeat_k=8, first_req_k=10, scale_ns=[100, 500, 1000],
)
SMOKE = dict(
    heaps=[16], ns=[1, 2], plain_ns=[1, 2], lazy_ns=[1], share_ns={16: [2]},
    lineage_heap=16, lineage_levels=2, nfp_n=1, e2e_ns=[2], swrk_ns=[2], huge_ns=[2], settle=1.0,
    target_heap=16, copy_runs=1, confine_n=2, repeat_k=2, first_req_k=2, scale_ns=[2, 4],
)
# Parts of the run, for `run.sh --only a,b` (a partial run never writes bench/results).
# core: the per-heap rows (lf-restore N forks, plain CRIU, lazy-pages, rewrite rates,
# huge pages, end to end, lineage); the others run on the target heap only.
SECTIONS = ("core", "tree", "idle", "confine", "net", "repeat", "scale", "share", "budget")


def parse_builds(prog, flag, specs, need, with_args=False):
    """--bin/--mode NAME=DIR[:ARG,ARG] of a side-by-side script, as (name, dir[, args])."""
    builds = []
    for spec in specs:
        name, _, rest = spec.partition("=")
        d, _, args = rest.partition(":") if with_args else (rest, "", "")
        if not name or not d or not (Path(d) / need).is_file():
            form = "NAME=DIR[:ARGS]" if with_args else "NAME=DIR"
            sys.exit(f"{prog}: {flag} {spec}: want {form} with DIR/{need}")
        build = (name, Path(d).resolve())
        builds.append(build + ([x for x in args.split(",") if x],) if with_args else build)
    return builds


def side_by_side_bench(prog, out, settle=None):
    """The Bench a side-by-side script measures with: root, the builds under test run their
    own stages (LAZYFORK_LOCAL), and a private tmp that cleanup removes (daemon logs)."""
    if os.geteuid() != 0:
        sys.exit(f"{prog}: must run as root")
    os.environ["LAZYFORK_LOCAL"] = "1"
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    b = Bench(SMOKE if settle is None else dict(SMOKE, settle=settle), out, False)
    b.tmp.mkdir(mode=0o700, parents=True, exist_ok=True)
    return out, b


class Interrupted(BaseException):  # not swallowed by "except Exception"
    pass


def end(p, grace):
    """Ends child p (one this run started): SIGTERM, then SIGKILL after grace seconds.
    Returns True when it had to be killed."""
    if p.poll() is not None:
        return False
    p.terminate()
    try:
        p.wait(timeout=grace)
        return False
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return True


def parse_pauses(text):
    """The agent's gaps as it logs them (agent.py: "<end unix time> <ms>" lines):
    [(end unix time, ms)]; other lines are skipped."""
    out = []
    for line in text.splitlines():
        try:
            t, g = line.split()
            out.append((float(t), float(g)))
        except ValueError:
            pass
    return out


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def now():
    return time.monotonic()


def meminfo():
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        k, v = line.split(":", 1)
        out[k] = int(v.split()[0]) * 1024
    return out


def pct(vals, p):
    """Nearest-rank percentile (p in 0..100); None for no values."""
    vals = sorted(v for v in vals if v is not None)
    if not vals:
        return None
    k = max(1, math.ceil(p / 100 * len(vals)))
    return vals[k - 1]


def mean(vals):
    vals = [v for v in vals if v is not None]
    return statistics.fmean(vals) if vals else None


def smaps(pid):
    """Pages of pid mapped from LazyFork memory files (shared, resident) and pages it owns
    (anonymous, incl. copied-on-write), in bytes."""
    memfile = owned = rss = 0
    in_memfile = False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                    parts = line.split(None, 5)
                    path = parts[5].strip() if len(parts) > 5 else ""
                    in_memfile = "/.lazyfork/mem/" in path or "/lazyfork/families/" in path
                    continue
                if line.startswith("Rss:"):
                    kb = int(line.split()[1]) * 1024
                    rss += kb
                    if in_memfile:
                        memfile += kb
                elif line.startswith("Anonymous:"):
                    kb = int(line.split()[1]) * 1024
                    owned += kb
                    if in_memfile:
                        memfile -= kb  # copied-on-write pages are the fork's own
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return dict(memfile_mapped_bytes=memfile, owned_bytes=owned, rss_bytes=rss)


def cg_memory(pid):
    """A process's memory cgroup charge as lazyfork reports it (v1: total_rss + total_cache
    from memory.stat + memory.kmem.usage_in_bytes; memory.usage_in_bytes is off by up to
    256 kB from per-CPU batching). None where there is no v1 memory controller."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if "memory" in ctrls.split(","):
            d = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            try:
                kv = dict(l.split() for l in (d / "memory.stat").read_text().splitlines())
                kmem = int((d / "memory.kmem.usage_in_bytes").read_text())
            except (OSError, ValueError):
                return None
            rss, cache = int(kv["total_rss"]), int(kv["total_cache"])
            return dict(memory_bytes=rss + cache + kmem, rss=rss, cache=cache, kmem=kmem,
                        mapped_file=int(kv.get("total_mapped_file", 0)))
    return None


def vm_pte(pid):
    """Page-table memory of pid (VmPTE), part of its cgroup's kmem."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmPTE:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class Sampler:
    """Samples each fork (cgroup charge, smaps) once it has run `settle` seconds."""

    def __init__(self, settle):
        self.settle = settle
        self.timers, self.samples = {}, {}
        self.lock = threading.Lock()

    def on_line(self, line):  # lf-restore --progress: a lazyfork.fork document per fork as it runs
        if not line.startswith("{"):
            return
        try:
            doc = json.loads(line)
        except ValueError:
            return
        if isinstance(doc, dict) and doc.get("kind") == "lazyfork.fork":
            self.start(doc["id"], int(doc["pid"]))

    def start(self, fid, pid, t0=None):
        t0 = now() if t0 is None else t0
        tm = threading.Timer(max(0.0, t0 + self.settle - now()), self._take, (fid, pid, t0))
        tm.daemon = True
        with self.lock:
            self.timers[fid] = tm
        tm.start()

    def _take(self, fid, pid, t0):
        s = dict(cg_memory(pid) or {})
        s.update(smaps(pid) or {})
        s["pte_bytes"] = vm_pte(pid)
        s["age_s"] = now() - t0
        with self.lock:
            self.samples[fid] = s

    def get(self, fid):
        tm = self.timers.get(fid)
        if tm is not None:
            tm.join(timeout=self.settle + 60)
        return self.samples.get(fid)

    def cancel(self):
        for tm in self.timers.values():
            tm.cancel()


class Bench:
    def __init__(self, cfg, out, smoke, only=None):
        self.cfg, self.out, self.smoke = cfg, out, smoke
        self.only = set(only or SECTIONS)  # the parts of the run to do (--only)
        self.daemon_proc = None  # `lazyfork daemon run` of the repeat rows, on its own socket
        self.daemon_sock = None
        self.pid = os.getpid()
        self.prefix = f"bench-{self.pid}"
        self.named = set()  # every container name this run made up (name())
        # Under the state root: the stages refuse directories outside it (issue 9's guards).
        self.tmp = STATE_ROOT / f"lfbench-{self.pid}"
        self.lazy = []  # lazy-pages forks: dicts with dir, daemon, pid
        self.rows = []  # rows.csv: one per (method, heap, N)
        self.forks = []  # forks.csv: one per fork
        self.snaps = []  # snapshots.csv
        self.copies = []  # memfile_vs_copy.csv
        self.lineage = []  # lineage.csv
        self.budget = []  # budget.csv: lib/budget's planning cost (pure Go, no containers)
        self.first_req = []  # first_request.csv: fork + first HTTP answer, per network mode
        self.tree = []  # tree.csv: snapshot tree operations (lazyfork tree)
        self.notes = []  # free-form findings for the summary
        self.env = {}
        self.share_flag = self.swap_default = False
        self.started = now()

    # ---------- running commands ----------

    def run(self, args, input=None, timeout=600, check=True, env=None, on_stderr_line=None):
        """Run a command in its own session, so a Ctrl-C reaches only this script; on an
        interrupt the command gets SIGTERM and time to undo its work (the tools cancel
        cleanly), then SIGKILL. on_stderr_line sees each stderr line as it comes."""
        args = [str(a) for a in args]
        p = subprocess.Popen(args, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, env=env)
        bufs = {"out": [], "err": []}

        def pump(f, key, cb):
            for line in f:
                bufs[key].append(line)
                if cb:
                    cb(line)
        ths = [threading.Thread(target=pump, args=(p.stdout, "out", None), daemon=True),
               threading.Thread(target=pump, args=(p.stderr, "err", on_stderr_line), daemon=True)]
        for th in ths:
            th.start()
        try:
            if input is not None:
                try:
                    p.stdin.write(input)
                    p.stdin.close()
                except BrokenPipeError:
                    pass
            p.wait(timeout=timeout)
        except BaseException:
            end(p, 90)
            raise
        finally:
            for th in ths:
                th.join(timeout=10)
        out, err = "".join(bufs["out"]), "".join(bufs["err"])
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:6])}{' ...' if len(args) > 6 else ''}: exit {p.returncode}: {err.strip()[-2000:]}")
        return subprocess.CompletedProcess(args, p.returncode, out, err)

    def lf(self, *args, **kw):
        return self.run([BIN / "lazyfork", *args], **kw)

    def jsonl(self, text):
        return [json.loads(l) for l in text.splitlines() if l.strip().startswith("{")]

    def lf_list(self):
        return json.loads(self.lf("list", "--json").stdout or "[]") or []

    def name(self, *parts):
        n = "-".join([self.prefix, *[str(p) for p in parts]])
        self.named.add(n)  # for a cleanup that cannot list (below)
        return n

    # ---------- cleanup ----------

    def cleanup(self, prefixes=None):
        """Delete every container, lazy-pages restore and temp file this run (or, with
        prefixes, a dead earlier run) made. Forks first, then sources."""
        prefixes = prefixes or [self.prefix]
        errs = []
        for rec in list(self.lazy):
            errs += self.lazy_teardown(rec)
        self.lazy.clear()
        try:
            mine = [r for r in self.lf_list() if any((r.get("name") or "").startswith(p + "-") for p in prefixes)]
        except Exception as e:  # noqa: BLE001 - report, keep cleaning
            # A host overloaded by the run's own forks (1000 agents on 2 cores) can keep
            # `lazyfork list` past its timeout: delete every name this run made up instead
            # (those it never created are refused as not found).
            mine, errs = [], errs + [str(e)]
            if prefixes == [self.prefix]:
                mine = [{"id": n, "depth": 0 if n.endswith("src") else 1} for n in sorted(self.named)]
        mine.sort(key=lambda r: -r.get("depth", 0))
        for i in range(0, len(mine), 40):
            batch = [r["id"] for r in mine[i:i + 40]]
            p = self.lf("delete", *batch, check=False, timeout=600)
            if p.returncode != 0:
                errs += [l for l in p.stderr.strip().splitlines() if "no such container" not in l][-5:]
        for p in prefixes:
            for f in SHM.glob(f"lfbench-{p.split('-')[-1]}-*"):
                f.unlink(missing_ok=True)
        if self.tmp.exists():
            shutil.rmtree(self.tmp, ignore_errors=True)
        left = [r["name"] for r in self.lf_list() if any((r.get("name") or "").startswith(p + "-") for p in prefixes)]
        if left:
            errs.append(f"containers left behind: {left}")
        return errs

    def clean_stale(self):
        """Remove what an earlier, killed benchmark run left (its pid is gone)."""
        stale = set()
        for r in self.lf_list():
            m = re.match(r"^bench-(\d+)-", r.get("name") or "")
            if m and int(m.group(1)) != self.pid and not Path(f"/proc/{m.group(1)}").exists():
                stale.add(f"bench-{m.group(1)}")
        for d in STATE_ROOT.glob("lfbench-*"):
            pid = d.name.split("-")[-1]
            if pid.isdigit() and int(pid) != self.pid and not Path(f"/proc/{pid}").exists():
                for sub in sorted(d.glob("lp*")):
                    self.lazy_teardown({"dir": sub, "daemon": None})
                shutil.rmtree(d, ignore_errors=True)
                stale.add(f"bench-{pid}")
        if stale:
            log(f"removing leftovers of killed runs: {sorted(stale)}")
            other = Bench(self.cfg, self.out, self.smoke)
            other.tmp = Path("/nonexistent")
            for e in other.cleanup(sorted(stale)):
                log(f"warning: {e}")

    # ---------- environment ----------

    def collect_env(self):
        cpu = ""
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        rev = self.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], check=False).stdout.strip()
        dirty = self.run(["git", "-C", REPO, "status", "--porcelain", "--", "lib", "cmd"], check=False).stdout.strip()
        osr = {}
        if Path("/etc/os-release").exists():
            for line in Path("/etc/os-release").read_text().splitlines():
                if "=" in line:
                    k, v = line.split("=", 1)
                    osr[k] = v.strip('"')
        self.env = dict(
            date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            os=osr.get("PRETTY_NAME", ""), kernel=platform.release(), arch=platform.machine(),
            cpu=cpu, cores=os.cpu_count(), mem_total_gib=round(meminfo()["MemTotal"] / GiB, 1),
            criu=self.run([CRIU, "--version"], check=False).stdout.split("\n")[0].replace("Version: ", ""),
            commit=rev + (" (lib/cmd modified)" if dirty else ""),
            loadavg_start=Path("/proc/loadavg").read_text().split()[:3],
            mode=("smoke" if self.smoke else "full") + ("" if self.only == set(SECTIONS) else
                                                         " (only " + ",".join(s for s in SECTIONS if s in self.only) + ")"),
        )
        h = self.lf("fork", "--help").stdout
        self.share_flag, self.swap_default = "--share" in h, "--copy" in h

    # ---------- containers ----------

    def create_source(self, heap, name, idle=False, create_args=()):
        """Start a container running the agent and wait until its heap is resident."""
        p = self.lf("create", IMAGE, "--name", name, "--json", *create_args, "--", "python3", "-c", AGENT, str(heap),
                    *(["idle"] if idle else []))
        rec = json.loads(p.stdout)
        deadline = now() + 120
        while now() < deadline:
            r = self.info(rec["id"])
            if r and r.get("state") != "running":
                raise RuntimeError(f"source {name} is {r.get('state')}")
            if r and r.get("memory_bytes", 0) >= heap * MiB * 0.97:
                break
            time.sleep(0.3)
        else:
            raise RuntimeError(f"source {name}: heap of {heap} MiB not resident after 120 s")
        time.sleep(1.2)  # into the steady read/write loop
        return rec

    def resident(self, ref):
        """Bytes resident in the container's first process (VmRSS), 0 while it has none."""
        pid = (self.info(ref) or {}).get("pid")
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError):
            pass
        return 0

    def info(self, ref):
        for r in self.lf_list():
            if r["id"] == ref or r.get("name") == ref:
                return r
        return None

    def stats(self, ref):
        return json.loads(self.lf("stats", ref, "--json").stdout)

    def agent_ready(self, ref):
        """Whether the agent in container ref has filled its heap (agent.py's /tmp/lf-ready)."""
        p = self.lf("exec", ref, "--timeout", "10s", "--", "cat", "/tmp/lf-ready", check=False)
        return p.returncode == 0 and p.stdout.strip() != ""

    def pause_ms(self, rec):
        """Longest pause the agent in a source saw (see agent.py), read from its root."""
        rootfs = rec.get("rootfs")
        if not rootfs:
            p = self.run([BIN / "lf-tree", "get", rec["id"]], check=False)
            try:
                rootfs = json.loads(p.stdout).get("rootfs")
            except ValueError:
                rootfs = None
        if rootfs:
            try:
                return float((Path(rootfs) / "tmp" / "lf-pause").read_text().strip())
            except (OSError, ValueError):
                pass
        p = self.lf("exec", rec["id"], "--timeout", "10s", "--", "cat", "/tmp/lf-pause", check=False)
        try:
            return float(p.stdout.strip())
        except ValueError:
            return None

    def delete(self, ids):
        t = now()
        for i in range(0, len(ids), 40):
            self.lf("delete", *ids[i:i + 40], timeout=600)
        return (now() - t) * 1000

    # ---------- measuring forks ----------

    def settle(self, since):
        """Let every fork run cfg.settle seconds (reading and writing pages) before reading."""
        left = self.cfg["settle"] - (now() - since)
        if left > 0:
            time.sleep(left)

    def measure(self, forks, sampler=None, lazy=False):
        """Per-fork figures, each taken when that fork had run cfg.settle s (sampler), or,
        without a sampler, now: cgroup charge (rss + cache + kmem), pages mapped from the
        memory files vs owned (smaps). memory_bytes_list is `lazyfork list --json` read once
        after the batch, as a cross-check."""
        if sampler is None:
            sampler = Sampler(0)
            for f in forks:
                sampler.start(f["id"], f["pid"])
        smps = {f["id"]: sampler.get(f["id"]) or {} for f in forks}  # waits for every sample
        listed = {} if lazy else {r["id"]: r for r in self.lf_list()}
        out = []
        for f in forks:
            smp = smps[f["id"]]
            m = dict(id=f["id"], restore_ms=f.get("restore_ms"))
            m.update(smp)
            if not lazy:
                r = listed.get(f["id"], {})
                m["memory_bytes_list"] = r.get("memory_bytes")
                m["state"] = r.get("state", "gone")
                if m.get("memory_bytes") is None:  # no v1 memory controller: lazyfork's figure
                    m["memory_bytes"] = r.get("memory_bytes")
            else:
                m["state"] = "running" if Path(f"/proc/{f['pid']}").exists() else "gone"
            out.append(m)
        dead = [m["id"] for m in out if m["state"] != "running"]
        if dead:
            raise RuntimeError(f"forks not running after {self.cfg['settle']} s: {dead}")
        if not lazy and out:
            out[0]["family_bytes"] = self.stats(out[0]["id"])["family_bytes"]
        return out

    def quiet(self, timeout=None):
        """/proc/meminfo once MemAvailable has stopped moving (memory of deleted forks is
        freed asynchronously), so before/after differences measure this step only. Other
        work on the host keeps it moving a little: give up after `timeout` seconds."""
        timeout = timeout or (0.01 if self.smoke else 3)
        hist, end = [], now() + timeout
        while True:
            m = meminfo()
            hist = (hist + [m["MemAvailable"]])[-5:]
            if (len(hist) == 5 and max(hist) - min(hist) < 8 * MiB) or now() > end:
                return m
            time.sleep(0.2)

    def feasible(self, n, heap):
        """How many full-copy forks fit while keeping FLOOR bytes available."""
        per = heap * MiB + 8 * MiB
        avail = meminfo()["MemAvailable"]
        return max(0, min(n, int((avail - FLOOR) // per))), avail

    def row(self, method, heap, n, forks, wall_ms, pre, post, extra=None):
        mem = [f["memory_bytes"] for f in forks]
        lat = [f["restore_ms"] for f in forks]
        r = dict(
            method=method, heap_mb=heap, n=n, forks_run=len(forks),
            restore_p50_ms=pct(lat, 50), restore_p95_ms=pct(lat, 95), restore_max_ms=pct(lat, 100),
            wall_ms=wall_ms,
            fork_mem_p50_bytes=pct(mem, 50), fork_mem_mean_bytes=mean(mem), fork_mem_max_bytes=pct(mem, 100),
            forks_mem_total_bytes=sum(m for m in mem if m is not None),
            forks_mem_list_total_bytes=sum(f.get("memory_bytes_list") or 0 for f in forks),
            fork_mem_list_p50_bytes=pct([f.get("memory_bytes_list") for f in forks], 50),
            sample_age_p50_s=pct([f.get("age_s") for f in forks], 50),
            memfile_mapped_p50_bytes=pct([f.get("memfile_mapped_bytes") for f in forks], 50),
            owned_p50_bytes=pct([f.get("owned_bytes") for f in forks], 50),
            rss_p50_bytes=pct([f.get("rss") for f in forks], 50),
            cache_p50_bytes=pct([f.get("cache") for f in forks], 50),
            kmem_p50_bytes=pct([f.get("kmem") for f in forks], 50),
            pte_p50_bytes=pct([f.get("pte_bytes") for f in forks], 50),
            meminfo_delta_bytes=pre["MemAvailable"] - post["MemAvailable"],
            shmem_delta_bytes=post["Shmem"] - pre["Shmem"],
            stopped_at="", note="",
        )
        r.update(extra or {})
        self.rows.append(r)
        for i, f in enumerate(forks):
            self.forks.append(dict(method=method, heap_mb=heap, n=n, index=i, id=f["id"],
                                   restore_ms=f["restore_ms"], memory_bytes=f["memory_bytes"],
                                   memory_bytes_list=f.get("memory_bytes_list"), sample_age_s=f.get("age_s"),
                                   memfile_mapped_bytes=f.get("memfile_mapped_bytes"),
                                   owned_bytes=f.get("owned_bytes"), rss_bytes=f.get("rss"),
                                   cache_bytes=f.get("cache"), kmem_bytes=f.get("kmem"),
                                   page_table_bytes=f.get("pte_bytes")))
        log(f"  {method:>14} heap {heap} N={n:<3} ran {len(forks):<3} p50 {fmt_ms(r['restore_p50_ms'])} "
            f"wall {fmt_ms(wall_ms)} per-fork {fmt_mb(r['fork_mem_p50_bytes'])} all forks {fmt_mb(r['forks_mem_total_bytes'])}"
            + (f"  [{r['stopped_at']}]" if r["stopped_at"] else ""))
        return r

    # ---------- LazyFork: stage pipeline, snapshot once, fork N times ----------

    def dump(self, ref, memfile=True, memfile_args=()):
        t = now()
        d = self.run([BIN / "lf-dump", ref]).stdout
        if not memfile:
            s = json.loads(d)
            s["_wall_ms"] = (now() - t) * 1000
            return s
        m = self.run([BIN / "lf-memfile", *memfile_args], input=d).stdout
        s = json.loads(m)
        s["_wall_ms"] = (now() - t) * 1000
        return s

    def restore(self, snap, n, names, rm=False, extra=()):
        """lf-restore -n N. Each fork is sampled (cgroup memory, smaps) when it has run
        cfg.settle seconds, timed from its lazyfork.fork document on lf-restore --progress's stderr."""
        args = [BIN / "lf-restore", "--progress", "-n", n, *extra]
        for nm in names:
            args += ["--name", nm]
        if rm:
            args.append("--rm")
        sampler = Sampler(self.cfg["settle"])
        t = now()
        p = self.run(args, input=json.dumps(snap), timeout=900, on_stderr_line=sampler.on_line)
        wall, t_end = (now() - t) * 1000, now()
        forks = self.jsonl(p.stdout)
        return forks, wall, t_end, sampler

    def lazyfork_rows(self, heap, src, snap, m0):
        for n in self.cfg["ns"]:
            pre = self.quiet()
            forks, wall, _, smp = self.restore(snap, n, [self.name(f"h{heap}", "lf", f"n{n}", i) for i in range(n)])
            ms = self.measure(forks, smp)
            post = meminfo()
            src_mem = (self.info(src["id"]) or {}).get("memory_bytes", 0)
            fam = ms[0].get("family_bytes") or 0
            # Read after the batch, like the --share rows (whose forks are only known then).
            family_ram = src_mem + sum(f.get("memory_bytes_list") or 0 for f in ms) + fam
            self.row("lazyfork", heap, n, ms, wall, pre, post, dict(
                parent_mem_bytes=src_mem, family_files_bytes=fam, family_ram_bytes=family_ram,
                family_ram_meminfo_bytes=m0["MemAvailable"] - post["MemAvailable"],
                family_shmem_bytes=post["Shmem"] - m0["Shmem"],
                source_pause_ms=snap["dump"]["frozen_ms"]))
            self.delete([f["id"] for f in forks])

    # ---------- restore path: a criu per fork (before) vs the batch's criu service (after) ----------

    def swrk_rows(self, heap, snap):
        for n in self.cfg["swrk_ns"]:
            pre = self.quiet()
            forks, wall, _, smp = self.restore(snap, n, [self.name(f"h{heap}", "swrk", f"n{n}", i) for i in range(n)],
                                               extra=["--per-fork-criu"])
            ms = self.measure(forks, smp)
            post = meminfo()
            self.row("lazyfork-swrk", heap, n, ms, wall, pre, post, dict(note="lf-restore --per-fork-criu"))
            self.delete([f["id"] for f in forks])

    # ---------- plain CRIU restore of the same checkpoint ----------

    def plain_rows(self, heap, dumped, src):
        for n in self.cfg["plain_ns"]:
            k, avail = self.feasible(n, heap)
            stop = ""
            if k < n:
                stop = (f"stopped at {k} of {n}: {k + 1} full copies of {heap} MiB would leave "
                        f"< {FLOOR // GiB} GiB of {avail / GiB:.1f} GiB available")
            if k == 0:
                self.rows.append(dict(method="plain-criu", heap_mb=heap, n=n, forks_run=0, stopped_at=stop))
                log(f"  plain-criu heap {heap} N={n}: {stop}")
                continue
            pre = self.quiet()
            forks, wall, _, smp = self.restore(dumped, k, [self.name(f"h{heap}", "plain", f"n{n}", i) for i in range(k)])
            ms = self.measure(forks, smp)
            post = meminfo()
            src_mem = (self.info(src["id"]) or {}).get("memory_bytes", 0)
            self.row("plain-criu", heap, n, ms, wall, pre, post, dict(
                stopped_at=stop, parent_mem_bytes=src_mem,
                family_ram_bytes=src_mem + sum(f["memory_bytes"] for f in ms)))
            self.delete([f["id"] for f in forks])

    # ---------- CRIU lazy-pages restore (by hand: criu lazy-pages + criu restore --lazy-pages) ----------

    def lazy_one(self, dumped, heap, tag, i, sampler):
        d = self.tmp / f"lp{tag}-{i}"
        rec = dict(dir=d, daemon=None, id=self.name("lp", tag, i))
        self.lazy.append(rec)
        d.mkdir(parents=True)
        t0 = now()
        layer = self.run([BIN / "lf-overlay", "prepare", "--lower", ",".join(dumped["lower"]),
                          "--upper", d / "upper", "--work", d / "work", "--target", d / "root"]).stdout
        (d / "layer.json").write_text(layer)
        cg = self.run([BIN / "lf-cgroup", "create", rec["id"]]).stdout
        (d / "cg.json").write_text(cg)
        roots = json.loads(cg)["criu_cgroup_root"]
        w = d / "w"
        w.mkdir()
        env = dict(os.environ, CRIU_FAULT="130")
        rec["daemon"] = subprocess.Popen(
            ["timeout", "-k", "5", "300", CRIU, "lazy-pages", "-D", dumped["images_dir"], "-W", w,
             "-o", d / "lazy.log", "-v2"], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        sock = w / "lazy-pages.socket"
        deadline = now() + 10
        while not sock.exists():
            if now() > deadline or rec["daemon"].poll() is not None:
                raise RuntimeError(f"criu lazy-pages did not start: {tail(d / 'lazy.log')}")
            time.sleep(0.005)
        args = ["timeout", "-k", "5", "120", CRIU, "restore", "-D", dumped["images_dir"], "-W", w, "-d",
                "--root", d / "root", "--lazy-pages", "--external", f"mnt[lfmem]:{dumped['family_dir']}",
                "--pidfile", d / "pid", "-o", d / "restore.log", "-v2"]
        for r in roots:
            args += ["--cgroup-root", r]
        t1 = now()
        p = self.run(args, env=env, timeout=180, check=False)
        t2 = now()
        if p.returncode != 0:
            raise RuntimeError(f"criu restore --lazy-pages: exit {p.returncode}: {tail(d / 'restore.log')}")
        rec["pid"] = int((d / "pid").read_text().strip())
        sampler.start(rec["id"], rec["pid"], t2)
        done = {}

        def wait_daemon():
            rec["daemon"].wait()
            done["t"] = now()
        th = threading.Thread(target=wait_daemon, daemon=True)
        th.start()
        return dict(id=rec["id"], pid=rec["pid"], restore_ms=(t2 - t0) * 1000, criu_ms=(t2 - t1) * 1000,
                    cg_json=str(d / "cg.json"), _done=done, _t1=t1, _thread=th)

    def lazy_teardown(self, rec):
        errs = []
        d = Path(rec["dir"])
        dm = rec.get("daemon")
        if dm is not None and dm.poll() is None:
            # timeout and its criu child form their own process group (start_new_session).
            try:
                os.killpg(dm.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            dm.wait()
        if (d / "cg.json").exists():
            for op in ("kill", "remove"):
                p = self.run([BIN / "lf-cgroup", op, "--in", d / "cg.json"], check=False)
                if p.returncode != 0 and "not exist" not in p.stderr and "no such" not in p.stderr.lower():
                    errs.append(f"lf-cgroup {op} {d}: {p.stderr.strip()[-300:]}")
        if (d / "layer.json").exists():
            p = self.run([BIN / "lf-overlay", "teardown", "--in", d / "layer.json"], check=False)
            if p.returncode != 0:
                errs.append(f"lf-overlay teardown {d}: {p.stderr.strip()[-300:]}")
        shutil.rmtree(d, ignore_errors=True)
        return errs

    def lazy_rows(self, heap, dumped):
        os.makedirs(dumped["family_dir"], exist_ok=True)  # the lfmem mount of a plain image: empty
        for n in self.cfg["lazy_ns"]:
            k, avail = self.feasible(n, heap)
            stop = ""
            if k < n:
                stop = f"stopped at {k} of {n}: memory floor ({avail / GiB:.1f} GiB available)"
            if k == 0:
                self.rows.append(dict(method="criu-lazy-pages", heap_mb=heap, n=n, forks_run=0, stopped_at=stop))
                continue
            pre = self.quiet()
            smp = Sampler(self.cfg["settle"])
            t = now()
            with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
                futs = [ex.submit(self.lazy_one, dumped, heap, f"h{heap}n{n}", i, smp) for i in range(k)]
                forks = [f.result() for f in futs]
            wall = (now() - t) * 1000
            ms = self.measure(forks, smp, lazy=True)
            for f in forks:
                f["_thread"].join(timeout=120)
            copied = [(f["_done"]["t"] - f["_t1"]) * 1000 for f in forks if "t" in f["_done"]]
            post = meminfo()
            self.row("criu-lazy-pages", heap, n, ms, wall, pre, post, dict(
                stopped_at=stop, note=f"all pages copied in p50 {pct(copied, 50):.0f} ms after restore start" if copied else ""))
            for rec in [r for r in self.lazy if r["id"] in {f["id"] for f in forks}]:
                for e in self.lazy_teardown(rec):
                    log(f"warning: {e}")
                self.lazy.remove(rec)

    # ---------- memfile write rate vs a plain copy of the same bytes ----------

    def copy_rates(self, heap, src, dumped, memfiled):
        """lf-memfile's write rate (bytes written / its run time) against cp and dd of the
        dump's pages-*.img to a new file on the same tmpfs; cfg.copy_runs rounds, medians."""
        imgs = sorted(Path(dumped["images_dir"]).glob("pages-*.img"))
        size = sum(p.stat().st_size for p in imgs)
        rates = {"memfile": [], "cp": [], "dd": []}
        for r in range(self.cfg["copy_runs"]):
            s = memfiled
            if r > 0:  # a fresh snapshot of the same source (its files stay until it is deleted)
                s = self.dump(src["id"])
                self.snap_row(heap, f"memfiled (rate sample {r + 1})", s)
            rates["memfile"].append(s["memfile"]["mb_per_sec"])
            for tool in ("cp", "dd"):
                dst = SHM / f"lfbench-{self.pid}-copy"
                dst.unlink(missing_ok=True)
                t = now()
                for img in imgs:  # one file in practice (pages-1.img)
                    if tool == "cp":
                        self.run(["cp", img, dst])
                    else:
                        self.run(["dd", f"if={img}", f"of={dst}", "bs=1M", "status=none"])
                dt = now() - t
                dst.unlink(missing_ok=True)
                rates[tool].append(size / 1e6 / dt)  # decimal MB/s, as lf-memfile reports
        res = dict(heap_mb=heap, image_pages_bytes=size, memfile_bytes=memfiled["memfile"]["bytes_written"],
                   memfile_mb_s=statistics.median(rates["memfile"]), cp_mb_s=statistics.median(rates["cp"]),
                   dd_mb_s=statistics.median(rates["dd"]),
                   samples=" ".join(f"{k}:" + "/".join(f"{v:.0f}" for v in vs) for k, vs in rates.items()))
        res["memfile_vs_copy"] = res["memfile_mb_s"] / max(res["cp_mb_s"], res["dd_mb_s"])
        self.copies.append(res)
        log(f"  memfile {res['memfile_mb_s']:.0f} MB/s vs cp {res['cp_mb_s']:.0f} / dd {res['dd_mb_s']:.0f} MB/s "
            f"({res['memfile_vs_copy']:.2f}x; {res['samples']})")

    def snap_row(self, heap, kind, s):
        m = s.get("memfile") or {}
        d = s.get("dump") or {}
        self.snaps.append(dict(
            heap_mb=heap, kind=kind, id=s["id"], dump_wall_ms=d.get("wall_ms"), dump_frozen_ms=d.get("frozen_ms"),
            pages_written=d.get("pages_written"), image_bytes=d.get("image_bytes"),
            memfile_ms=m.get("ms"), memfile_mb_s=m.get("mb_per_sec"), memfile_bytes=m.get("bytes_written"),
            pages_moved=m.get("pages_moved"), pages_kept=m.get("pages_kept"), delta_pages=m.get("delta_pages"),
            files=m.get("files"), file_vmas_converted=m.get("file_vmas_converted"), huge_pages=m.get("huge_pages"),
            pipeline_wall_ms=s.get("_wall_ms")))

    # ---------- one copy of the memory per family ----------

    def share_rows(self, heap):
        for n in self.cfg["share_ns"].get(heap, []):
            m0 = self.quiet()
            src = self.create_source(heap, self.name(f"h{heap}", "share", f"n{n}", "src"))
            names = [self.name(f"h{heap}", "share", f"n{n}", i) for i in range(n)]
            nameargs = [a for nm in names for a in ("--name", nm)]
            pre = meminfo()
            t = now()
            if self.swap_default:
                # The default since issue 14: the source is swapped onto the snapshot.
                mode = "fork"
                forks = self.jsonl(self.lf("fork", src["id"], "-n", n, "--json", *nameargs, timeout=900).stdout)
            elif self.share_flag:
                mode = "fork --share"
                forks = self.jsonl(self.lf("fork", src["id"], "-n", n, "--share", "--json", *nameargs, timeout=900).stdout)
            else:
                # Without `fork --share`: stop moves the source onto its memfiled snapshot,
                # forks restore from it, start brings the source back from the same files.
                mode = "stop + fork + start"
                self.lf("stop", src["id"])
                forks = self.jsonl(self.lf("fork", src["id"], "-n", n, "--json", *nameargs, timeout=900).stdout)
                self.lf("start", src["id"])
            wall = (now() - t) * 1000
            t_end = now()
            self.settle(t_end)
            ms = self.measure(forks)
            post = meminfo()
            st = self.stats(src["id"])
            fam = ms[0].get("family_bytes") or 0
            src_mem = st["memory_bytes"]
            pause = self.pause_ms(src)
            self.row("lazyfork-share", heap, n, ms, wall, pre, post, dict(
                parent_mem_bytes=src_mem, family_files_bytes=fam,
                family_ram_bytes=src_mem + sum(f["memory_bytes"] for f in ms) + fam,
                family_ram_meminfo_bytes=m0["MemAvailable"] - post["MemAvailable"],
                family_shmem_bytes=post["Shmem"] - m0["Shmem"],
                source_pause_ms=pause, note=mode))
            self.delete([f["id"] for f in forks] + [src["id"]])

    # ---------- file-private pages left in the image (before) vs converted (after) ----------

    def no_file_private(self, heap, src):
        n = self.cfg["nfp_n"]
        s = self.dump(src["id"], memfile_args=["--no-file-private"])
        self.snap_row(heap, "memfiled --no-file-private", s)
        pre = self.quiet()
        forks, wall, _, smp = self.restore(s, n, [self.name(f"h{heap}", "nfp", i) for i in range(n)], rm=True)
        ms = self.measure(forks, smp)
        post = meminfo()
        self.row("lazyfork-anon-only", heap, n, ms, wall, pre, post, dict(note="lf-memfile --no-file-private"))
        self.delete([f["id"] for f in forks])

    # ---------- huge pages: lf-memfile --huge-pages ----------

    def huge_rows(self, heap, src):
        s = self.dump(src["id"], memfile_args=["--huge-pages"])
        self.snap_row(heap, "memfiled --huge-pages", s)
        for n in self.cfg["huge_ns"]:
            pre = self.quiet()
            forks, wall, _, smp = self.restore(s, n, [self.name(f"h{heap}", "huge", f"n{n}", i) for i in range(n)])
            ms = self.measure(forks, smp)
            post = meminfo()
            self.row("lazyfork-huge", heap, n, ms, wall, pre, post, dict(
                note=f"lf-memfile --huge-pages ({s['memfile'].get('huge_pages')} huge pages)",
                memfile_ms=s["memfile"]["ms"], memfile_mb_s=s["memfile"]["mb_per_sec"]))
            self.delete([f["id"] for f in forks])

    # ---------- confinement: the default (confined) container vs --privileged ----------

    def confinement_rows(self, heap):
        """Fork latency and memory per fork of a confined container and of a --privileged one,
        one after the other with the same N: what the hardening costs a fork."""
        n = self.cfg["confine_n"]
        for method, tag, args in (("lazyfork-confined", "conf", ()), ("lazyfork-privileged", "priv", ("--privileged",))):
            src = self.create_source(heap, self.name(f"h{heap}", tag, "src"), create_args=args)
            s = self.dump(src["id"])
            self.snap_row(heap, f"memfiled ({method})", s)
            pre = self.quiet()
            forks, wall, _, smp = self.restore(s, n, [self.name(f"h{heap}", tag, i) for i in range(n)])
            ms = self.measure(forks, smp)
            post = meminfo()
            self.row(method, heap, n, ms, wall, pre, post, dict(
                note="default confinement (capabilities, no_new_privs, seccomp, masked paths, device list)"
                if not args else "lazyfork create --privileged", dump_ms=s["dump"]["wall_ms"],
                frozen_ms=s["dump"]["frozen_ms"]))
            self.delete([f["id"] for f in forks] + [src["id"]])

    # ---------- network modes: none (default) vs bridge vs host ----------

    def network_rows(self, heap):
        """Fork latency and memory per fork in each network mode, one after the other with the
        same N. Bridge mode runs on a bridge and /24 of the benchmark's own (every fork gets an
        address and a veth before CRIU restores into its namespace)."""
        n = self.cfg["confine_n"]
        os.environ.setdefault("LAZYFORK_BRIDGE", "lfbrbench")
        os.environ.setdefault("LAZYFORK_SUBNET", "10.213.254.0/24")
        for mode in ("none", "bridge", "host"):
            method = f"lazyfork-net-{mode}"
            src = self.create_source(heap, self.name(f"h{heap}", "net", mode, "src"), create_args=("--net", mode))
            s = self.dump(src["id"])
            self.snap_row(heap, f"memfiled ({method})", s)
            pre = self.quiet()
            forks, wall, _, smp = self.restore(s, n, [self.name(f"h{heap}", "net", mode, i) for i in range(n)])
            ms = self.measure(forks, smp)
            post = meminfo()
            self.row(method, heap, n, ms, wall, pre, post, dict(
                note={"none": "--net none (default): own namespace, loopback only",
                      "bridge": "--net bridge: own namespace, veth and address per fork",
                      "host": "--net host: the host's network"}[mode],
                dump_ms=s["dump"]["wall_ms"], frozen_ms=s["dump"]["frozen_ms"]))
            self.delete([f["id"] for f in forks] + [src["id"]])
        self.first_request_rows()

    def first_request_rows(self):
        """Fork + first request: a web server (python3 -m http.server) forked one fork at a
        time with lf-restore; from lf-restore's start to the fork's first HTTP answer. In none
        mode the request is made inside the fork's namespace (nsenter), in bridge mode from
        the host to the fork's address over the bridge (curl bound to the bridge)."""
        k = self.cfg["first_req_k"]
        for mode in ("none", "bridge"):
            src = json.loads(self.lf("create", IMAGE, "--name", self.name("web", mode, "src"), "--json", "--net", mode,
                                     "--", "python3", "-m", "http.server", "8080", "--bind", "0.0.0.0").stdout)
            ids = []
            try:
                self.wait_http(src, mode, 60)
                s = self.dump(src["id"])
                restore, first = [], []
                for i in range(k):
                    t = now()
                    p = self.run([BIN / "lf-restore", "-n", 1, "--name", self.name("web", mode, i)], input=json.dumps(s), timeout=300)
                    f = self.jsonl(p.stdout)[0]
                    ids.append(f["id"])
                    restore.append((now() - t) * 1000)
                    self.wait_http(f, mode, 30)
                    first.append((now() - t) * 1000)
                self.first_req.append(dict(mode=mode, n=k, restore_p50_ms=pct(restore, 50), first_request_p50_ms=pct(first, 50),
                                           first_request_p95_ms=pct(first, 95), dump_ms=s["dump"]["wall_ms"]))
                log(f"  fork + first request, --net {mode}: restore p50 {pct(restore, 50):.0f} ms, "
                    f"first answer p50 {pct(first, 50):.0f} ms after lf-restore started")
            finally:
                self.delete(ids + [src["id"]])

    def wait_http(self, rec, mode, timeout):
        """Polls the server of rec (a create or fork document) until it answers 200."""
        if mode == "bridge":
            cmd = ["curl", "-sf", "-o", "/dev/null", "--max-time", "1", "--interface", os.environ["LAZYFORK_BRIDGE"],
                   f"http://{rec['address']}:8080/"]
        else:
            cmd = ["nsenter", "-t", str(rec["pid"]), "-n", "curl", "-sf", "-o", "/dev/null", "--max-time", "1",
                   "http://127.0.0.1:8080/"]
        deadline = now() + timeout
        while now() < deadline:
            if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
                return
            time.sleep(0.005)
        raise RuntimeError(f"{rec['id']} (--net {mode}) did not answer HTTP within {timeout} s")

    # ---------- idle forks: the agent only holds its heap ----------

    def idle_rows(self, heap):
        n = self.cfg["nfp_n"]
        src = self.create_source(heap, self.name(f"h{heap}", "idle", "src"), idle=True)
        s = self.dump(src["id"])
        self.snap_row(heap, "memfiled (idle agent)", s)
        pre = self.quiet()
        forks, wall, _, smp = self.restore(s, n, [self.name(f"h{heap}", "idle", i) for i in range(n)])
        ms = self.measure(forks, smp)
        post = meminfo()
        self.row("lazyfork-idle", heap, n, ms, wall, pre, post, dict(note="agent holding its heap, touching nothing"))
        self.delete([f["id"] for f in forks] + [src["id"]])

    # ---------- lineage: forks of forks ----------

    def lineage_rows(self, heap, src):
        cur = src["id"]
        for level in range(1, self.cfg["lineage_levels"] + 1):
            s = self.dump(cur)
            self.snap_row(heap, f"lineage: snapshot forked into level {level}", s)
            pre = meminfo()
            forks, wall, _, smp = self.restore(s, 1, [self.name(f"h{heap}", "lin", level)], rm=True)
            ms = self.measure(forks, smp)
            post = meminfo()
            f, m, d = ms[0], s["memfile"], s["dump"]
            self.lineage.append(dict(
                level=level, heap_mb=heap, source=cur, fork=f["id"], dump_pages_written=d["pages_written"],
                dump_frozen_ms=d["frozen_ms"], dump_wall_ms=d["wall_ms"], memfile_ms=m["ms"],
                delta_pages=m.get("delta_pages"), pages_moved=m.get("pages_moved"), pages_kept=m.get("pages_kept"),
                shared_pages=m.get("shared_pages"), rebased=m.get("rebased"), restore_ms=f["restore_ms"],
                fork_mem_bytes=f["memory_bytes"], memfile_mapped_bytes=f.get("memfile_mapped_bytes"),
                owned_bytes=f.get("owned_bytes"), meminfo_delta_bytes=pre["MemAvailable"] - post["MemAvailable"]))
            log(f"  lineage level {level}: dumped {d['pages_written']} pages (delta {m.get('delta_pages')}, "
                f"rebased {m.get('rebased')}), restore {f['restore_ms']:.0f} ms, fork {fmt_mb(f['memory_bytes'])}")
            cur = f["id"]

    # ---------- the porcelain, end to end (dump + memfile + restore) ----------

    def e2e_rows(self, heap, src):
        for n in self.cfg["e2e_ns"]:
            names = [self.name(f"h{heap}", "e2e", f"n{n}", i) for i in range(n)]
            pre = self.quiet()
            t = now()
            forks = self.jsonl(self.lf("fork", src["id"], "-n", n, "--json", "--copy",
                                       *[a for nm in names for a in ("--name", nm)], timeout=900).stdout)
            wall = (now() - t) * 1000
            t_end = now()
            self.settle(t_end)
            ms = self.measure(forks)
            post = meminfo()
            tim = self.stats(forks[0]["id"]).get("timings_ms") or {}
            self.row("lazyfork-e2e", heap, n, ms, wall, pre, post, dict(
                dump_ms=tim.get("dump_ms"), frozen_ms=tim.get("frozen_ms"), memfile_ms=tim.get("memfile_ms"),
                note="lazyfork fork -n N: dump + memfile + restore"))
            self.delete([f["id"] for f in forks])

    # ---------- forking a live container again and again: swap (default) vs --copy ----------

    def family_bytes(self):
        root = Path(os.environ.get("LAZYFORK_RUN", "/dev/shm/lazyfork")) / "families"
        total = 0
        for dirpath, _, files in os.walk(root):
            for fn in files:
                try:
                    total += os.lstat(os.path.join(dirpath, fn)).st_blocks * 512
                except OSError:
                    pass
        return total

    def start_daemon(self):
        """`lazyfork daemon run` on a socket of this run's own (the same state roots), so the
        repeat rows go through a daemon as users with one running do; returns the env that
        points `lazyfork` at it."""
        sock = Path("/run/lazyfork") / f"{self.prefix}.sock"
        sock.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.daemon_sock = sock
        env = dict(os.environ, LAZYFORK_SOCKET=str(sock), LAZYFORK_GROUP="none")
        env.pop("LAZYFORK_LOCAL", None)
        self.daemon_log = self.tmp / "daemon.log"
        with open(self.daemon_log, "ab") as logf:
            self.daemon_proc = subprocess.Popen([BIN / "lazyfork", "daemon", "run"], env=env, stdin=subprocess.DEVNULL,
                                                stdout=logf, stderr=logf, start_new_session=True)
        deadline = now() + 30
        while self.run([BIN / "lazyfork", "daemon", "status"], env=env, check=False).returncode != 0:
            if self.daemon_proc.poll() is not None or now() > deadline:
                self.stop_daemon()
                raise RuntimeError(f"lazyfork daemon run did not answer on {sock}: {tail(self.daemon_log)}")
            time.sleep(0.1)
        return env

    def stop_daemon(self):
        """Ends the daemon this run started (by its pid; containers keep running)."""
        d, self.daemon_proc = self.daemon_proc, None
        if d is None:
            return []
        errs = []
        if end(d, 60):
            errs.append(f"daemon {d.pid} did not stop on SIGTERM within 60 s: killed")
        for f in (self.daemon_sock, Path(f"{self.daemon_sock}.lock")):  # this run's own names
            f.unlink(missing_ok=True)
        return errs

    def source_pauses(self, ref, env=None):
        """The agent's gaps over 10 ms (see agent.py): [(end unix time, ms)]."""
        p = self.lf("exec", ref, "--timeout", "10s", "--", "cat", "/tmp/lf-pauses", check=False, env=env)
        return parse_pauses(p.stdout)

    def conntrack_ms(self, images_dir):
        """How long CRIU's dump spent on the conntrack tables (CT, then expectations: the
        two "Dumping netns links" lines of net.c's dump_nf_ct up to the end of the
        namespaces), from the dump.log it leaves in the images directory; None if unknown."""
        try:
            text = (Path(images_dir) / "dump.log").read_text(errors="replace")
        except OSError:
            return None
        start = end = None
        for line in text.splitlines():
            m = re.match(r"^\((\d+\.\d+)\)\s*(.*)", line)
            if not m:
                continue
            if "Dumping netns links" in m[2] and start is None:
                start = float(m[1])
            elif "Namespaces dump complete" in m[2] and start is not None:
                end = float(m[1])
                break
        return None if start is None or end is None else (end - start) * 1000

    def repeat_rows(self, heap):
        """One fork at a time of the same running source, each followed by an exec in the
        fork (tree search forks one branch at a time), through the CLI with a daemon running:
        the default, where the first fork moves the source onto its snapshot and later ones
        dump only what it changed; --copy, which dumps and rewrites the whole heap every
        time; and plain CRIU (lf-dump of a CRIU image, lf-restore of one copy of it, exec).
        The source's pause per fork is the longest gap its agent saw during that fork."""
        k = self.cfg["repeat_k"]
        env = self.start_daemon()
        try:
            for method, tag, extra in (("lazyfork-repeat", "rep", ()), ("lazyfork-repeat-copy", "repc", ("--copy",)),
                                       ("plain-criu-repeat", "repp", None)):
                if extra is None:
                    kk, avail = self.feasible(2 * (k + 1), heap)  # each round: an image and a copy of the heap
                    if kk < 2 * (k + 1):
                        self.notes.append(f"plain-criu-repeat skipped: {2 * (k + 1)} copies of {heap} MiB would leave "
                                          f"< {FLOOR // GiB} GiB of {avail / GiB:.1f} GiB available")
                        continue
                fam0 = self.family_bytes()
                src = self.create_source(heap, self.name(f"h{heap}", tag, "src"))
                pre = self.quiet()
                times, frozen, forks, spans, ct = [], [], [], [], []
                t0 = now()
                for i in range(k + 1):
                    nm = self.name(f"h{heap}", tag, i)
                    t, w = now(), time.time()
                    if extra is None:
                        d = self.run([BIN / "lf-dump", src["id"]]).stdout
                        f = self.jsonl(self.run([BIN / "lf-restore", "-n", 1, "--name", nm], input=d).stdout)[0]
                        fr = json.loads(d)["dump"]["frozen_ms"]
                        ct.append(self.conntrack_ms(json.loads(d)["images_dir"]))
                    else:
                        f = self.jsonl(self.lf("fork", src["id"], "--name", nm, "--json", *extra,
                                               timeout=600, env=env).stdout)[0]
                        fr = None
                    spans.append((w, time.time()))
                    self.lf("exec", f["id"], "--", "hostname", env=env)
                    times.append((now() - t) * 1000)
                    tim = {} if extra is None else (self.stats(f["id"]).get("timings_ms") or {})
                    if fr is None:
                        fr = tim.get("frozen_ms")
                    frozen.append(fr)
                    if i == 0:
                        first_tim = tim
                    forks.append(f)
                wall = (now() - t0) * 1000
                self.settle(now())
                ms = self.measure(forks)
                post = meminfo()
                gaps = self.source_pauses(src["id"], env)
                if extra == ():
                    # A fork's snapshot (and CRIU's dump.log) is gone once the fork runs: three
                    # more dumps of the same source (lf-dump, no fork; only what it changed since
                    # its swap, so no heap-sized image) tell the conntrack part.
                    ct = [None] + [self.conntrack_ms(json.loads(self.run([BIN / "lf-dump", src["id"]]).stdout)["images_dir"])
                                   for _ in range(3)]
                elif extra:
                    ct = [None]  # --copy: as the default's (a dump of the whole heap each would only add tmpfs)
                # A gap ends when the agent runs again: within the fork command's span.
                pauses = [max([g for e, g in gaps if a <= e <= b + 0.05] or [None], key=lambda x: x or 0)
                          for a, b in spans]
                self.row(method, heap, k + 1, ms, wall, pre, post, dict(
                    first_fork_exec_ms=times[0], repeat_fork_exec_p50_ms=pct(times[1:], 50),
                    repeat_fork_exec_max_ms=pct(times[1:], 100), first_frozen_ms=frozen[0],
                    repeat_frozen_p50_ms=pct(frozen[1:], 50),
                    first_pause_ms=pauses[0], repeat_pause_p50_ms=pct(pauses[1:], 50),
                    repeat_pause_max_ms=pct(pauses[1:], 100),
                    first_conntrack_ms=ct[0], repeat_conntrack_p50_ms=pct(ct[1:], 50),  # the dump's conntrack part
                    first_dump_ms=first_tim.get("dump_ms"), first_memfile_ms=first_tim.get("memfile_ms"),
                    first_prealloc_ms=first_tim.get("prealloc_ms"),
                    fork_exec_ms=" ".join(f"{x:.0f}" for x in times),
                    pauses_ms=" ".join("-" if x is None else f"{x:.0f}" for x in pauses),
                    family_files_bytes=self.family_bytes() - fam0,
                    note=("lf-dump SRC | lf-restore -n 1 --name X (a CRIU image and a full copy each time); "
                          "lazyfork exec X -- hostname" if extra is None else
                          "lazyfork fork SRC --name X" + (" --copy" if extra else "") +
                          "; lazyfork exec X -- hostname; daemon running")))
                log(f"  {method}: fork+exec {' '.join(f'{x:.0f}' for x in times)} ms; source paused "
                    f"{' '.join('-' if x is None else f'{x:.0f}' for x in pauses)} ms")
                self.delete([f["id"] for f in forks] + [src["id"]])
        finally:
            for e in self.stop_daemon():
                log(f"warning: {e}")

    # ---------- many forks in one call: does the cost per fork stay flat? ----------

    def scale_rows(self, heap):
        """lf-restore -n N of one snapshot for each N of cfg.scale_ns (100, 500, 1000), one
        batch after the other. Each fork is measured when it has run cfg.settle s, as in the
        other rows (measured after the whole batch, the first of 1,000 forks had run 90 s
        and written 90 more pages). Per-fork restore time by position in the batch
        (forks.csv index) shows what grows with the forks already running, within one run;
        CPU per fork (lf-restore and its CRIU) what LazyFork itself spends."""
        src = self.create_source(heap, self.name(f"h{heap}", "scale", "src"))
        try:
            snap = self.dump(src["id"])
            self.snap_row(heap, "memfiled (scale)", snap)
            for n in self.cfg["scale_ns"]:
                pre = self.quiet()
                names = [self.name(f"h{heap}", "scale", f"n{n}", i) for i in range(n)]
                # CPU of lf-restore and its criu service and workers (reaped children), which
                # the load of others on a shared machine does not inflate as it does wall time.
                ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                forks, wall, _, smp = self.restore(snap, n, names)
                ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu_ms = ((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)) * 1000
                ms = self.measure(forks, smp)
                post = meminfo()
                lat = [f.get("restore_ms") for f in forks]
                tenth = max(1, n // 10)
                t_del = self.delete([f["id"] for f in forks])
                self.row("lazyfork-scale", heap, n, ms, wall, pre, post, dict(
                    first_tenth_p50_ms=pct(lat[:tenth], 50), last_tenth_p50_ms=pct(lat[-tenth:], 50),
                    cpu_ms_per_fork=cpu_ms / n,
                    delete_ms=t_del, note=f"lf-restore -n {n} of one snapshot"))
                log(f"    restore p50 of the first {tenth}: {fmt_ms(pct(lat[:tenth], 50))}, of the last {tenth}: "
                    f"{fmt_ms(pct(lat[-tenth:], 50))}; CPU {cpu_ms / n:.1f} ms per fork; delete of {n}: {t_del / 1000:.1f} s")
        finally:
            self.delete([src["id"]])

    # ---------- snapshot trees ----------

    def tree_doc(self, tid):
        return json.loads(self.lf("tree", "nodes", tid, "--json").stdout)

    def tree_op(self, op, tid, node, heap, *args, before=None):
        """Time one `lazyfork tree` operation on node and record a tree.csv row with what it
        changed: RAM (tree cgroup + its memory files on tmpfs) and disk (the tree's directory)."""
        b = before or self.tree_doc(tid)
        t0 = now()
        out = self.lf("tree", op, tid, *([node] if node else []), *args).stdout
        ms = (now() - t0) * 1000
        a = self.tree_doc(tid)
        n = a["nodes"].get(node) or {}
        ram = lambda d: d["usage"]["ram_bytes"] + d["usage"]["tmpfs_bytes"]  # noqa: E731
        self.tree.append(dict(op=op, heap_mib=heap, node=node, ms=round(ms, 1),
                              ram_before=ram(b), ram_after=ram(a),
                              disk_before=b["usage"]["disk_bytes"], disk_after=a["usage"]["disk_bytes"],
                              node_dirty_pages=n.get("dirty_pages"), node_keyframe_bytes=n.get("keyframe_bytes"),
                              node_delta_bytes=n.get("delta_bytes"), note=" ".join(args)))
        log(f"  tree {op} {node}: {ms:.0f} ms, RAM {fmt_mb(ram(b))} -> {fmt_mb(ram(a))}, "
            f"disk {fmt_mb(b['usage']['disk_bytes'])} -> {fmt_mb(a['usage']['disk_bytes'])}")
        return out, a

    def tree_rows(self, heap):
        """lazyfork tree on a node holding the heap: refresh of its keyframe (the whole heap,
        then after a few seconds of divergence), suspend and resume (time, RAM freed, bytes
        written), and eviction latency (set-budget below the tree's RAM)."""
        name = self.name(f"h{heap}", "tree")
        tid = self.lf("tree", "create", IMAGE, "--name", name, "--root-name", name + "-root", "--",
                      "python3", "-c", AGENT, str(heap)).stdout.strip()
        try:
            root = self.tree_doc(tid)["root"]
            # Resident set of the agent, not the cgroup's charge: `tree create` writes the
            # root's keyframe at once, and when that swap lands after the heap was filled
            # the heap lives in the memory files, charged to whoever wrote them.
            # the heap plus the interpreter's own few MiB: the heap is filled, not half-way
            # A keyframe written after the fill holds the heap in memory files, mapped but
            # not touched since: then the agent's /tmp/lf-ready says it is filled.
            deadline = now() + 120
            while self.resident(root) < (heap + 4) * MiB and not self.agent_ready(root):
                if now() > deadline:
                    r = self.info(root) or {}
                    raise RuntimeError(f"tree root: heap of {heap} MiB not resident after 120 s "
                                       f"(state {r.get('state')}, pid {r.get('pid')}, rss {fmt_mb(self.resident(root))})")
                time.sleep(0.3)
            # The keyframe written at create usually predates the heap: a refresh writes it.
            self.tree_op("prepare", tid, root, heap, "--refresh")
            time.sleep(5)  # the agent writes a page a second: a few pages of divergence
            self.tree_op("prepare", tid, root, heap, "--refresh")
            # A fork maps the root's keyframe: suspending it frees its own pages only;
            # suspending the root after it frees the heap (nothing live maps it then).
            kid = self.lf("tree", "fork", tid, root).stdout.split()[0]
            self.tree_op("suspend", tid, kid, heap)
            self.tree_op("suspend", tid, root, heap)
            self.tree_op("resume", tid, root, heap)
            self.tree_op("resume", tid, kid, heap)
            d = self.tree_doc(tid)
            # Below the tree's RAM but within reach of eviction: the memory files (shared
            # RAM) stay charged however many nodes are suspended, so a budget below them is
            # refused (lib/budget PlanBudget); half the live nodes' own charge is evicted.
            shared = sum(n.get("shared_ram_bytes", 0) for n in d["nodes"].values())
            own = sum(n.get("ram_bytes", 0) for n in d["nodes"].values() if n["state"] == "live")
            low = max(1, shared + own // 2)
            self.tree_op("set-budget", tid, "", heap, "--max-ram", str(low), before=d)
            ev = [n for n, x in self.tree_doc(tid)["nodes"].items() if x["state"] == "suspended"]
            self.tree[-1]["note"] = f"eviction to 85% of --max-ram {low}: suspended {len(ev)} node(s)"
        finally:
            self.lf("tree", "prune", tid, name + "-root", check=False)
        self.notes.append(
            f"snapshot tree, {heap} MiB node (tree.csv): keyframe refresh of the whole heap "
            f"{self.tree[0]['ms']:.0f} ms, after {self.tree[1]['node_dirty_pages']} pages of divergence "
            f"{self.tree[1]['ms']:.0f} ms ({fmt_mb(self.tree[1]['node_keyframe_bytes'])} written); "
            f"suspend of the root (its fork suspended first) {self.tree[3]['ms']:.0f} ms freeing "
            f"{fmt_mb(self.tree[3]['ram_before'] - self.tree[3]['ram_after'])} of RAM for "
            f"{fmt_mb(self.tree[3]['disk_after'] - self.tree[3]['disk_before'])} more on disk, resume {self.tree[4]['ms']:.0f} ms; "
            f"eviction (set-budget below the tree's RAM) {self.tree[6]['ms']:.0f} ms.")

    # ---------- the whole run ----------

    def heap_config(self, heap):
        log(f"heap {heap} MiB")
        if "core" in self.only:
            self.core_rows(heap)
        if heap == self.cfg["target_heap"]:
            for sec, fn in (("tree", self.tree_rows), ("idle", self.idle_rows), ("confine", self.confinement_rows),
                            ("net", self.network_rows), ("repeat", self.repeat_rows), ("scale", self.scale_rows)):
                if sec in self.only:
                    fn(heap)
        if "share" in self.only:
            self.share_rows(heap)

    def core_rows(self, heap):
        m0 = self.quiet()
        src = self.create_source(heap, self.name(f"h{heap}", "src"))
        m1 = self.quiet()
        log(f"  source {src['id']} running, {fmt_mb(m0['MemAvailable'] - m1['MemAvailable'])} taken")
        snap = self.dump(src["id"])
        self.snap_row(heap, "memfiled", snap)
        log(f"  snapshot: dump {snap['dump']['wall_ms']:.0f} ms (frozen {snap['dump']['frozen_ms']:.0f}), "
            f"memfile {snap['memfile']['ms']:.0f} ms, {snap['memfile']['pages_moved']} pages moved, {snap['memfile']['pages_kept']} kept")
        self.lazyfork_rows(heap, src, snap, m0)
        if heap == self.cfg["target_heap"]:
            self.swrk_rows(heap, snap)
        dumped = self.dump(src["id"], memfile=False)
        self.snap_row(heap, "dumped (plain CRIU image)", dumped)
        self.copy_rates(heap, src, dumped, snap)
        self.plain_rows(heap, dumped, src)
        try:
            self.lazy_rows(heap, dumped)
        except Exception as e:  # noqa: BLE001 - the baseline may not work on every host
            msg = f"CRIU lazy-pages restore failed for heap {heap} MiB: {e}"
            log(msg)
            self.notes.append(msg)
            for rec in list(self.lazy):
                self.lazy_teardown(rec)
                self.lazy.remove(rec)
        if heap == self.cfg["target_heap"]:
            self.no_file_private(heap, src)
            self.huge_rows(heap, src)
            self.e2e_rows(heap, src)
            if heap == self.cfg["lineage_heap"]:
                self.lineage_rows(heap, src)
        elif heap == self.cfg["lineage_heap"]:
            self.lineage_rows(heap, src)
        pause = self.pause_ms(src)
        if pause is not None:
            self.notes.append(f"heap {heap} MiB: the longest pause the source's agent saw over all its dumps was "
                              f"{pause:.0f} ms (CRIU's frozen_ms per dump is in the snapshot table).")
        # The source goes last: GC drops its snapshots and memory files with it.
        ids = [r["id"] for r in self.lf_list() if (r.get("name") or "").startswith(self.name(f"h{heap}") + "-")]
        kids = [i for i in ids if i != src["id"]]
        if kids:
            self.delete(kids)
        self.delete([src["id"]])

    def budget_rows(self):
        """What deciding costs on big snapshot trees: lib/budget's BenchmarkPlan (PlanEvict,
        an 8-fork PlanAdd and a PlanResume on trees of 1,000 and 10,000 nodes, half live,
        RAM at the budget), run with `go test -bench`."""
        go = shutil.which("go") or "/usr/local/go/bin/go"
        times = "20x" if self.smoke else "2s"
        log(f"budget planning cost (go test -bench, {times} each)")
        r = self.run([go, "-C", REPO, "test", "-run", "^$", "-bench", "^BenchmarkPlan$", "-benchmem", "-benchtime", times,
                      "./lib/budget"], timeout=600, env=dict(os.environ, GOFLAGS="-buildvcs=false"))
        pat = re.compile(r"^BenchmarkPlan/op=(\w+)/nodes=(\d+)\S*\s+(\d+)\s+([\d.]+) ns/op\s+([\d.]+) suspended"
                         r"\s+(\d+) B/op\s+(\d+) allocs/op")
        for line in r.stdout.splitlines():
            m = pat.match(line)
            if m:
                self.budget.append(dict(op=m[1], nodes=int(m[2]), runs=int(m[3]), ms_per_plan=float(m[4]) / 1e6,
                                        suspended=int(float(m[5])), bytes_per_plan=int(m[6]), allocs_per_plan=int(m[7])))
        if len(self.budget) < 6:
            raise RuntimeError(f"budget benchmark: {len(self.budget)} rows parsed from: {r.stdout[-1500:]}")

    def run_all(self):
        self.collect_env()
        self.clean_stale()
        self.tmp.mkdir(mode=0o700, parents=True, exist_ok=True)
        log(f"{self.env['mode']} run, names {self.prefix}-*, results in {self.out}")
        for heap in self.cfg["heaps"]:
            self.heap_config(heap)
        if "budget" in self.only:
            self.budget_rows()
        self.env["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
        self.env["duration_s"] = round(now() - self.started)

    # ---------- output ----------

    def write(self):
        self.out.mkdir(parents=True, exist_ok=True)
        write_csv(self.out / "rows.csv", self.rows)
        write_csv(self.out / "forks.csv", self.forks)
        write_csv(self.out / "snapshots.csv", self.snaps)
        write_csv(self.out / "memfile_vs_copy.csv", self.copies)
        write_csv(self.out / "lineage.csv", self.lineage)
        write_csv(self.out / "budget.csv", self.budget)
        write_csv(self.out / "first_request.csv", self.first_req)
        write_csv(self.out / "tree.csv", self.tree)
        # env.json also keeps what summary.py needs to re-render summary.md from this directory.
        (self.out / "env.json").write_text(json.dumps(dict(self.env, cfg=self.cfg, notes=self.notes,
                                                           smoke=self.smoke), indent=2) + "\n")
        import summary  # noqa: E402 - local module
        (self.out / "summary.md").write_text(summary.render(self))


def tail(path, n=6):
    try:
        return " | ".join(Path(path).read_text().strip().splitlines()[-n:])
    except OSError:
        return "(no log)"


def fmt_ms(v):
    return "-" if v is None else f"{v:.0f} ms"


def fmt_mb(v):
    return "-" if v is None else f"{v / MiB:.2f} MiB"


def write_csv(path, rows):
    keys = []
    for r in rows:
        for k in r:
            if not k.startswith("_") and k not in keys:
                keys.append(k)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k in keys})


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, < 60 s, same code paths (CI)")
    ap.add_argument("--out", help="results directory (default bench/results, or a temp dir with --smoke)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--fork-memory", action="store_true",
                    help="only one fork's memory over time (fork_memory.py): fork_memory.{csv,png} in --out")
    ap.add_argument("--only", help="comma-separated parts to run: " + ",".join(SECTIONS) +
                    " (results in /tmp/lazyfork-bench-only unless --out; never bench/results or README)")
    a = ap.parse_args()
    only = None
    if a.only:
        only = [x.strip() for x in a.only.split(",") if x.strip()]
        bad = [x for x in only if x not in SECTIONS]
        if bad or not only:
            sys.exit(f"bench: --only {a.only}: unknown part {','.join(bad) or '(none)'}; the parts are {','.join(SECTIONS)}")
    out = Path(a.out) if a.out else (Path("/tmp/lazyfork-bench-smoke") if a.smoke else
                                     Path("/tmp/lazyfork-bench-only") if only else HERE / "results")
    if os.geteuid() != 0:
        sys.exit("bench: must run as root (containers, CRIU)")
    b = Bench(SMOKE if a.smoke else FULL, out, a.smoke, only)

    def on_signal(sig, _frame):
        raise Interrupted(f"signal {sig}")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # also when started with SIGINT ignored (&)
        signal.signal(sig, on_signal)
    failed = None
    if a.fork_memory:
        return fork_memory_main(b, out, a)
    try:
        b.run_all()
    except (Exception, KeyboardInterrupt, Interrupted) as e:  # noqa: BLE001
        failed = e
        log(f"FAILED: {type(e).__name__}: {e}")
    finally:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)  # finish cleaning up
        log("cleaning up")
        errs = b.stop_daemon() + b.cleanup()
        for e in errs:
            log(f"cleanup: {e}")
    if failed is not None:
        if b.rows:
            try:
                # Never over the results of the last good run.
                b.out = out if a.smoke or only else Path("/tmp/lazyfork-bench-partial")
                b.write()
                log(f"partial results in {b.out}")
            except Exception as e:  # noqa: BLE001
                log(f"could not write partial results: {e}")
        sys.exit(1)
    b.write()
    # The README's table of targets comes from a whole run only.
    if not a.smoke and not only and out == HERE / "results":
        import summary  # noqa: E402 - local module
        summary.write_readme(b, REPO / "README.md")
        log("README.md: targets table rewritten from this run")
    if not a.no_plots and not only:
        try:
            import plots
            plots.render(out)
        except ImportError as e:
            if not a.smoke:
                log(f"plots: {e}")
                sys.exit(1)
            log(f"plots skipped: {e}")
    log(f"done in {b.env['duration_s']} s: {out}/summary.md")
    if errs:
        sys.exit(1)


def fork_memory_main(b, out, a):
    import fork_memory
    failed = None
    try:
        samples, facts = fork_memory.run(b, 16 if a.smoke else 256, 4 if a.smoke else 30, 0.5)
        fork_memory.write(out, samples, facts)
    except (Exception, KeyboardInterrupt, Interrupted) as e:  # noqa: BLE001
        failed = e
        log(f"FAILED: {type(e).__name__}: {e}")
    finally:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        errs = b.cleanup()
        for e in errs:
            log(f"cleanup: {e}")
    if failed is not None or errs:
        sys.exit(1)
    if not a.no_plots:
        try:
            fork_memory.plot(out)
        except ImportError as e:
            log(f"plot: {e}: install python3-matplotlib (apt-get install python3-matplotlib) and run "
                f"/usr/bin/python3 bench/bench.py --fork-memory again")
            if not a.smoke:
                sys.exit(1)
    log(f"fork memory: {out}/fork_memory.csv, {out}/fork_memory.png")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
