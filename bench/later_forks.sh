#!/bin/bash
# What the forks made a while after a running container's first fork cost, builds side by side.
#
#     bench/later_forks.sh [-w SECONDS] [-k ROUNDS] OLD/bin NEW/bin ...
#
# Each round, for each build in turn: a daemon of that build, a fresh 256 MiB agent
# (bench/agent.py), its first fork (the swap), SECONDS of nothing (default 8), ten more
# forks, 6 s of their workload; then the forks' page tables (VmPTE) and memory charge,
# medians. On a host whose fresh huge pages are slow the first fork's memory files start
# in 4 KiB pages and are made huge pages in the background (lib/fork collapseLater): the
# forks made after map the heap without page tables. A measurement, never a target: run
# it alone.
set -euo pipefail
wait_s=8 rounds=1
while getopts "w:k:" o; do
	case $o in
	w) wait_s=$OPTARG ;;
	k) rounds=$OPTARG ;;
	*) echo "usage: $0 [-w SECONDS] [-k ROUNDS] BIN_DIR..." >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: $0 [-w SECONDS] [-k ROUNDS] BIN_DIR..." >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
agent=$(python3 -c "import sys; sys.path.insert(0, '$here'); from trace_repeat import AGENT; print(AGENT)")
daemon=
cleanup() {
	if [ -n "$daemon" ]; then
		lazyfork list -q 2>/dev/null | xargs -r lazyfork rm >/dev/null 2>&1 || true
		kill "$daemon" 2>/dev/null || true
		wait "$daemon" 2>/dev/null || true
		daemon=
	fi
}
trap cleanup EXIT
for r in $(seq "$rounds"); do
	for bin in "$@"; do
		export LAZYFORK_SOCKET=/tmp/lf-later-$$.sock PATH=$bin:$PATH
		lazyfork daemon run >"/tmp/lf-later-$$.log" 2>&1 &
		daemon=$!
		for _ in $(seq 50); do lazyfork daemon status >/dev/null 2>&1 && break; sleep 0.1; done
		lazyfork create lazyfork/debian:bookworm --name later-src -- python3 -c "$agent" 256 >/dev/null
		for _ in $(seq 120); do
			[ -n "$(lazyfork exec later-src -- cat /tmp/lf-ready 2>/dev/null)" ] && break
			sleep 0.5
		done
		lazyfork fork later-src --name later-0 --json >/dev/null
		sleep "$wait_s"
		lazyfork fork later-src -n 10 --json >/dev/null
		sleep 6
		lazyfork list --json | python3 -c '
import json, statistics, sys
pte, mem = [], []
for r in json.load(sys.stdin):
    if r.get("name") in ("later-src", "later-0"):
        continue
    with open("/proc/%d/status" % r["pid"]) as f:
        pte.append(int(next(l for l in f if l.startswith("VmPTE")).split()[1]))
    mem.append(r["memory_bytes"] / 1e6)
print("round %s %s: %d forks made %s s after the first: VmPTE p50 %.0f kB, memory p50 %.3f MB" % (
    sys.argv[1], sys.argv[2], len(pte), sys.argv[3], statistics.median(pte), statistics.median(mem)))
' "$r" "$bin" "$wait_s"
		cleanup
	done
done
