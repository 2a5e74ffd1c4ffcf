#!/usr/bin/env python3
"""Run CRIU's zdtm static tests through LazyFork, three ways, one test at a time.

For every test the manifest (choose.py) selects:
  fork    a fresh container of the zdtm image starts the test (its pid 1 is a shell that
          runs `./TEST --pidfile=... --outfile=...` as `make TEST.pid` does, then sleeps);
          once the pid file is there, `lazyfork fork SRC --name FORK`; in the fork,
          SIGTERM the test and wait for its .out: PASS or FAIL.
  source  after that fork, the same check in the source container.
  plain   another fresh container, `lf-dump C | lf-restore -n 1 --rm` (a full CRIU
          copy, no lf-memfile) and the same check in the copy.
Each step has a deadline (--step-timeout) and each test a budget (--test-timeout); every
container is deleted after its test, and on SIGINT/SIGTERM.

  alone   first of all, the baseline: a fresh container starts the test and it is checked
          with nothing dumped (a test that does not start here is 'nostart' everywhere).
Results: a CSV (test,fork,plain,source,alone,cause,...) written as the run goes; md.py turns
it into docs/zdtm.md. Values: pass, fail (the test's own check failed), error (the
fork, dump or restore failed), timeout, nostart (the test did not start in a plain
container), skip (not selected; the reason is the cause), '-' (not reached).
"""
import argparse
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FIELDS = ["test", "fork", "plain", "source", "alone", "cause", "fork_error", "plain_error",
          "source_error", "alone_error", "criu_opts", "seconds"]
STATIC = "/zdtm/static"


class Deadline(Exception):
    pass


class Runner:
    def __init__(self, args):
        self.a = args
        self.bin = args.bin
        self.lf = os.path.join(self.bin, "lazyfork")
        self.live = set()  # containers of the current test, deleted whatever happens
        self.proc = None   # the child running now (killed with its group on a signal)
        self.deadline = None

    # --- processes ----------------------------------------------------------------
    def run(self, argv, timeout=None, stdin=None, shell=False):
        """Run argv in its own process group; (rc, stdout, stderr). rc None: timed out."""
        t = self.a.step_timeout if timeout is None else timeout
        if self.deadline is not None:
            t = min(t, max(1.0, self.deadline - time.monotonic()))
        p = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, shell=shell)
        self.proc = p
        try:
            out, err = p.communicate(stdin, timeout=t)
            return p.returncode, out, err
        except subprocess.TimeoutExpired:
            self.stop(p)
            out, err = p.communicate()
            return None, out, err + "\n(timed out after %.0f s)" % t
        finally:
            self.proc = None

    @staticmethod
    def stop(p):
        """SIGTERM the group we started (a killed fork must thaw its source), then KILL."""
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                return
            try:
                p.wait(wait)
                return
            except subprocess.TimeoutExpired:
                pass

    def lazyfork(self, *args, timeout=None):
        return self.run([self.lf] + list(args), timeout=timeout)

    # --- containers ---------------------------------------------------------------
    def create(self, name, t):
        argv = t["argv"]
        cmd = ("cd %s && ./%s %s >%s.start 2>&1; echo $? >%s.rc; exec sleep infinity"
               % (STATIC, argv[0][2:], " ".join(argv[1:]), t["test"], t["test"]))
        extra = ["--privileged"] if self.a.privileged else []
        self.live.add(name)
        rc, out, err = self.lazyfork("create", self.a.image, "--name", name, *extra, "--",
                                     "/bin/sh", "-c", cmd)
        if rc != 0:
            raise StepError("create", err)

    def wait_started(self, name, t):
        n = t["test"]
        script = (
            'cd %s; i=0; while [ $i -lt %d ]; do '
            '[ -s %s.pid ] && { cat %s.pid; exit 0; }; '
            'if [ -e %s.rc ]; then sleep 0.2; [ -s %s.pid ] && { cat %s.pid; exit 0; }; '
            'echo "start failed (exit $(cat %s.rc))"; cat %s.start %s.out.inprogress %s.out 2>/dev/null | tail -n 5; exit 1; fi; '
            'sleep 0.1; i=$((i+1)); done; echo "no pid file after %d s"; exit 1'
            % (STATIC, t["timeout"] * 10, n, n, n, n, n, n, n, n, n, t["timeout"]))
        rc, out, err = self.lazyfork("exec", name, "--", "/bin/sh", "-c", script,
                                     timeout=t["timeout"] + 10)
        if rc != 0 or not out.strip().isdigit():
            raise StepError("start", (out + "\n" + err).strip())
        return int(out.strip())

    def check(self, name, t, pid):
        """SIGTERM the test in container name, wait for its .out; (result, error line)."""
        n = t["test"]
        script = (
            'cd %s; kill -TERM %d || echo "kill failed"; i=0; while [ $i -lt 300 ]; do '
            'st=$(sed "s/.*) //" /proc/%d/stat 2>/dev/null | cut -d" " -f1); '
            'if [ -e %s.out ] && { [ -z "$st" ] || [ "$st" = Z ]; }; then break; fi; '
            'if [ ! -e %s.out ] && { [ -z "$st" ] || [ "$st" = Z ]; } && [ $i -gt 20 ]; then break; fi; '
            'sleep 0.1; i=$((i+1)); done; '
            'if [ -e %s.out ]; then cat %s.out; else echo "NO-OUT (state ${st:-gone})"; tail -n 5 %s.out.inprogress 2>/dev/null; fi'
            % (STATIC, pid, pid, n, n, n, n, n))
        rc, out, err = self.lazyfork("exec", name, "--", "/bin/sh", "-c", script, timeout=40)
        if rc is None:
            return "timeout", "check: " + first_error(err)
        lines = [l.strip() for l in out.splitlines() if l.strip()]
        if lines and "PASS" in lines[-1].split():
            return "pass", ""
        if rc != 0 and not lines:
            return "error", "check: " + first_error(err)
        why = [l for l in lines if re.search(r"FAIL|ERR|fail|error|NO-OUT", l)]
        return "fail", first_error(why[0] if why else (lines[-1] if lines else "no output"))

    def delete(self, names):
        names = [n for n in names if n]
        if not names:
            return
        rc, out, err = self.run([self.lf, "delete"] + names, timeout=60)
        if rc != 0:
            # One may never have existed (a failed create or fork): delete one by one.
            for n in names:
                self.run([self.lf, "delete", n], timeout=60)
        for n in names:
            self.live.discard(n)

    def cleanup(self):
        if self.live:
            self.deadline = None
            self.delete(sorted(self.live))

    # --- one test -----------------------------------------------------------------
    def test(self, idx, t):
        r = {k: "-" for k in FIELDS}
        r.update(test=t["test"], cause="", fork_error="", plain_error="", source_error="",
                 alone_error="", criu_opts=" ".join(t["criu_opts"]))
        start = time.monotonic()
        self.deadline = start + self.a.test_timeout
        tag = "zt%d" % idx
        src, fork, plain, copy = tag + "-src", tag + "-fork", tag + "-plain", None
        alone = tag + "-alone"
        try:
            # (0) alone: the baseline, the test in a container nothing dumps
            try:
                self.create(alone, t)
                pid = self.wait_started(alone, t)
            except StepError as e:
                for path in ("fork", "plain", "source", "alone"):
                    r[path] = "nostart" if e.step == "start" else "error"
                    r[path + "_error"] = start_error(e)
                return r
            r["alone"], r["alone_error"] = self.check(alone, t, pid)
            self.delete([alone])
            # (a) fork and (c) source
            try:
                self.create(src, t)
                pid = self.wait_started(src, t)
            except StepError as e:
                r["fork"] = r["plain"] = r["source"] = "nostart" if e.step == "start" else "error"
                r["fork_error"] = r["plain_error"] = r["source_error"] = start_error(e)
                return r
            self.live.add(fork)
            rc, out, err = self.lazyfork("fork", src, "--name", fork)
            if rc == 0:
                r["fork"], r["fork_error"] = self.check(fork, t, pid)
            else:
                r["fork"] = "timeout" if rc is None else "error"
                r["fork_error"] = first_error(err)
            r["source"], r["source_error"] = self.check(src, t, pid)
            self.delete([src, fork])
            # (b) plain CRIU copy
            if time.monotonic() > self.deadline:
                r["plain"] = "timeout"
                r["plain_error"] = "test budget of %d s used up" % self.a.test_timeout
                return r
            try:
                self.create(plain, t)
                pid = self.wait_started(plain, t)
            except StepError as e:
                r["plain"] = "nostart"
                r["plain_error"] = start_error(e)
                return r
            pipe = "set -o pipefail; %s %s | %s -n 1 --rm" % (
                os.path.join(self.bin, "lf-dump"), plain, os.path.join(self.bin, "lf-restore"))
            rc, out, err = self.run(["/bin/bash", "-c", pipe])
            for line in out.splitlines():
                try:
                    copy = json.loads(line).get("id") or copy
                except ValueError:
                    pass
            if copy:
                self.live.add(copy)
            if rc == 0 and copy:
                r["plain"], r["plain_error"] = self.check(copy, t, pid)
            else:
                r["plain"] = "timeout" if rc is None else "error"
                r["plain_error"] = first_error(err)
            return r
        finally:
            self.cleanup()
            r["seconds"] = "%.1f" % (time.monotonic() - start)
            r["cause"] = cause(r)


class StepError(Exception):
    def __init__(self, step, text):
        super().__init__("%s: %s" % (step, text))
        self.step, self.text = step, text


def start_error(e):
    """'start: start failed (exit 1): <the test's own first error line>'."""
    lines = [l.strip() for l in e.text.splitlines() if l.strip()]
    if e.step == "start" and lines:
        why = [l for l in lines[1:] if re.search(r"(?i)err|fail|can't|denied|not permitted", l)]
        return "start: %s%s" % (lines[0], (": " + first_error(why[0])) if why else "")
    return "%s: %s" % (e.step, first_error(e.text))


def first_error(text):
    """The first line naming the failure: CRIU's 'Error (...)' line, else a lazyfork or
    lf-* error line, else the last line; log paths and timestamps dropped."""
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    pick = None
    for pat in (r"Error \(", r"^(lazyfork|lf-\w+):", r"(?i)error|fail"):
        for l in lines:
            if re.search(pat, l):
                pick = l
                break
        if pick:
            break
    if pick is None:
        pick = lines[-1] if lines else ""
    pick = re.sub(r"\s*\(log: [^)]*\)", "", pick)
    pick = re.sub(r"^\(\d+\.\d+\)\s*", "", pick)
    # Who said it and about which container/snapshot: the same cause reads the same in
    # the fork, the plain copy and every test.
    pick = re.sub(r"^(lazyfork|lf-\w+): ((swap|dump|restore) \S+|fork \w+ from \w+)(: (fork \w+ from \w+|dump \S+))?: ", "", pick)
    pick = re.sub(r"^\d\d:\d\d:\d\d\.\d+:\s+\d+:\s*", "", pick)  # the test's log prefix
    pick = re.sub(r"\s+", " ", pick)
    return pick[:300]


def cause(r):
    """One short cause for the table: each distinct error once, prefixed by the paths
    (fork, plain, source) that failed with it."""
    groups = []
    for path in ("fork", "plain", "source", "alone"):
        if r[path] in ("pass", "-", "skip"):
            continue
        err = r[path + "_error"] or r[path]
        for g in groups:
            if g[1] == err:
                g[0].append(path)
                break
        else:
            groups.append(([path], err))
    return "; ".join("%s: %s" % ("+".join(p), e) for p, e in groups)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", default=os.path.join(os.environ.get("ZDTM_WORK", "/var/tmp/lazyfork-zdtm"), "manifest.json"))
    ap.add_argument("--image", default=os.environ.get("ZDTM_IMAGE", "lazyfork/zdtm:v4.2"))
    ap.add_argument("--bin", default=os.environ.get("LF_BIN", os.path.join(HERE, "..", "..", "bin")))
    ap.add_argument("--csv", required=True)
    ap.add_argument("--only", help="regular expression: run only tests whose name matches (re.search)")
    ap.add_argument("--limit", type=int, default=0, help="run at most N selected tests")
    ap.add_argument("--step-timeout", type=float, default=30)
    ap.add_argument("--test-timeout", type=float, default=90)
    ap.add_argument("--privileged", action="store_true", help="create the containers with --privileged")
    a = ap.parse_args()
    a.bin = os.path.abspath(a.bin)

    rows = json.load(open(a.manifest))
    if a.only:
        rows = [t for t in rows if re.search(a.only, t["test"])]
    runner = Runner(a)

    def on_signal(sig, frame):
        # Once: a signal to the whole group reaches this process twice (run.sh passes
        # its own on), and a second exit would cut the first cleanup short.
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        if runner.proc is not None:
            Runner.stop(runner.proc)
        runner.cleanup()
        print("\ninterrupted; containers of the current test deleted", file=sys.stderr)
        sys.exit(130)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    # Leftovers of an earlier, killed run (names zt<N>-...; this root is the harness's own).
    rc, out, err = runner.lazyfork("list", "--json", timeout=30)
    try:
        old = [c.get("name") or c.get("id") for c in json.loads(out or "[]")
               if re.match(r"zt\d+-", c.get("name") or "")]
    except ValueError:
        old = []
    if old:
        print("deleting leftovers: %s" % " ".join(old), file=sys.stderr)
        runner.delete(old)

    os.makedirs(os.path.dirname(os.path.abspath(a.csv)), exist_ok=True)
    tmp = a.csv + ".partial"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        ran = 0
        for i, t in enumerate(rows):
            if t["skip"]:
                r = {k: "skip" if k in ("fork", "plain", "source", "alone") else "" for k in FIELDS}
                r.update(test=t["test"], cause=t["skip"], criu_opts=" ".join(t["criu_opts"]))
                w.writerow(r)
                continue
            if a.limit and ran >= a.limit:
                break
            ran += 1
            r = runner.test(i, t)
            w.writerow(r)
            f.flush()
            print("%-32s fork=%-7s plain=%-7s source=%-7s alone=%-7s %5ss %s" % (
                t["test"], r["fork"], r["plain"], r["source"], r["alone"], r["seconds"], r["cause"][:140]),
                flush=True)
    os.replace(tmp, a.csv)


if __name__ == "__main__":
    main()
