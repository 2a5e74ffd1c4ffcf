#!/usr/bin/env python3
"""Choose the zdtm static tests the harness runs and how each is started.

Reads CRIU's test/zdtm/static (built by build.sh) and writes a JSON manifest: for every
test of the Makefile's TST list, its command line (what `make -n TEST.pid` runs), its
.desc (flags, flavor, CRIU options it asks for) and, if it is skipped, why.

Selection (zdtm.py's own rules for `zdtm.py run -a`, then what a container that shares
the host's network namespace and cgroup tree cannot give):
  noauto        manual-run-only tests (zdtm.py -a skips them)
  crfail        tests whose dump is expected to fail
  arch          tests for another architecture
  feature       tests needing a CRIU feature `criu check --feature` denies here
  checkskip     tests whose TEST.checkskip script fails on this host
  network       tests that need a network namespace of their own, net devices or
                iptables/nft/ip (LazyFork containers share the host's network
                namespace, and the image has no iptables or iproute2)
  cgroups       tests that need zdtm's own cgroup hierarchies (zdtm_mount_cgroups)
                and --manage-cgroups
  host-global   tests that change state of the whole host (binfmt_misc)
Everything else runs, whatever its flavor: a LazyFork container already gives the test
its own pid, mount, uts and ipc namespaces, so 'ns'-only tests run there as in zdtm's
'h' flavor (without ZDTM_NEWNS).

usage: choose.py STATIC_DIR CRIU_BINARY OUT.json
"""
import json
import os
import re
import subprocess
import sys

NETWORK = {
    "netns", "netns-dev", "netns_sub", "netns_sub_veth", "netns_sub_sysctl", "netns-nf",
    "netns-nft", "netns-nft-ipt", "tun", "tun_ns", "bridge", "macvlan", "sit", "cr_veth",
    "cr_veth02", "netns_lock_iptables", "netns_lock_nftables", "net_lock_socket_iptables",
    "net_lock_socket_iptables6", "net_lock_socket_nftables", "net_lock_socket_nftables6",
    "socket-tcp-ipt-nfconntrack", "socket-tcp-nft-nfconntrack", "socket-tcp-closed",
    "socket-tcp-closed-last-ack", "socket-tcp6-closed", "socket-tcp4v6-closed",
    "socket-tcp-reseted", "socket-tcp-syn-sent",
}
HOST_GLOBAL = {"binfmt_misc"}


def tests_of(static):
    """The Makefile's TST list, as make expands it on this machine."""
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "-f", "Makefile", "-f", "-", "zdtm-list"],
        cwd=static, input="zdtm-list:\n\t@echo $(TST)\n", capture_output=True, text=True,
        check=True).stdout
    return out.split()


def commands_of(static, tests):
    """The commands `make TEST.pid` would run (one make -n for all of them)."""
    out = subprocess.run(["make", "-n", "-s", "-k", "--no-print-directory"] +
                         [t + ".pid" for t in tests], cwd=static, capture_output=True,
                         text=True).stdout
    cmds = {}
    for line in out.splitlines():
        if line.startswith("./"):
            argv = line.split()
            cmds.setdefault(argv[0][2:], argv)
    return cmds


def main():
    static, criu, out = sys.argv[1:4]
    arch = os.uname().machine
    features = {}

    def feature(f):
        if f not in features:
            r = subprocess.run([criu, "check", "--no-default-config", "-v0", "--feature", f],
                               capture_output=True, timeout=60)
            features[f] = r.returncode == 0
        return features[f]

    rows = []
    tests = tests_of(static)
    cmds = commands_of(static, tests)
    for t in tests:
        p = os.path.join(static, t + ".desc")
        desc = {}
        if os.path.exists(p):
            with open(p) as f:
                desc = eval(f.read(), {"os": os})  # zdtm.py reads them the same way
        flags = desc.get("flags", "").split()
        opts = " ".join(desc.get(k, "") for k in ("opts", "dopts", "ropts")).split()
        skip = ""
        if not os.access(os.path.join(static, t), os.X_OK):
            skip = "build: no binary"
        elif "noauto" in flags:
            skip = "noauto: manual run only"
        elif "crfail" in flags:
            skip = "crfail: dump expected to fail"
        elif desc.get("arch", arch) != arch:
            skip = "arch: %s only" % desc["arch"]
        elif t in NETWORK:
            skip = "network: needs its own network namespace, net devices or iptables"
        elif any(o.startswith("--manage-cgroups") for o in opts):
            skip = "cgroups: needs zdtm's cgroup hierarchies and --manage-cgroups"
        elif t in HOST_GLOBAL:
            skip = "host-global: changes state of the whole host"
        else:
            for f in desc.get("feature", "").split():
                if not feature(f):
                    skip = "feature: criu check --feature %s fails" % f
                    break
        if not skip and os.path.exists(os.path.join(static, t + ".checkskip")):
            r = subprocess.run(["./" + t + ".checkskip"], cwd=static, capture_output=True,
                               timeout=60)
            if r.returncode != 0:
                skip = "checkskip: %s.checkskip fails on this host" % t
        rows.append({
            "test": t,
            "argv": cmds.get(t) or ["./" + t, "--pidfile=%s.pid" % t, "--outfile=%s.out" % t],
            "suid": "suid" in flags,
            "flags": flags,
            "flavor": desc.get("flavor", "h ns uns"),
            "criu_opts": opts,
            "timeout": int(desc.get("timeout") or 30),
            "skip": skip,
        })
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)
    n = sum(1 for r in rows if not r["skip"])
    reasons = {}
    for r in rows:
        if r["skip"]:
            k = re.split(r"[:]", r["skip"])[0]
            reasons[k] = reasons.get(k, 0) + 1
    print("%d tests, %d selected, skipped: %s" % (len(rows), n, reasons))


if __name__ == "__main__":
    main()
