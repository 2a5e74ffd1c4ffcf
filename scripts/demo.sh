#!/usr/bin/env bash
# The README demo: start a counter container, look inside, fork it, watch the twin
# continue the count; then what LazyFork is for: a container holding a 256 MiB heap forked
# 100 times, beside what 100 plain CRIU restores of it cost (measured on $PLAIN of them,
# then multiplied: 100 full copies would not fit many machines). It ends by deleting
# everything it made. DEMO_N and PLAIN change the counts.
set -euo pipefail
cd "$(dirname "$0")/.."
lf=${LAZYFORK:-$PWD/bin/lazyfork}
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
name=demo-counter-$$
big=demo-big-$$
n=${DEMO_N:-100}
plain=${PLAIN:-3}
bin=$(dirname "$lf")
made=()
cleanup() {
  "$lf" delete "$name" ${twin:+"$twin"} "$big" "${made[@]}" >/dev/null 2>&1 || true
  "$lf" gc >/dev/null 2>&1 || true
}
trap cleanup EXIT

step lazyfork create lazyfork/debian:bookworm --name "$name" -- python3 -c '...counter...'
"$lf" create lazyfork/debian:bookworm --name "$name" -- \
  python3 -c 'import itertools, time; [print(i, flush=True) or time.sleep(1) for i in itertools.count()]'
sleep 3
step lazyfork attach --no-follow "$name"
"$lf" attach --no-follow "$name"
step lazyfork exec "$name" -- hostname
"$lf" exec "$name" -- hostname
step lazyfork exec "$name" -- ps -e
"$lf" exec "$name" -- ps -e
if "$lf" fork --help >/dev/null 2>&1; then
  twin=$name-twin
  step lazyfork fork "$name" --name "$twin"
  "$lf" fork "$name" --name "$twin"
  sleep 2
  step lazyfork attach --no-follow "$twin"
  "$lf" attach --no-follow "$twin" | tail -4
fi
step lazyfork freeze "$name"; "$lf" freeze "$name" >/dev/null
a=$("$lf" attach --no-follow "$name" | tail -1); sleep 2
b=$("$lf" attach --no-follow "$name" | tail -1)
echo "frozen: last line $a, two seconds later $b"
step lazyfork thaw "$name"; "$lf" thaw "$name" >/dev/null
sleep 2; echo "thawed: last line $("$lf" attach --no-follow "$name" | tail -1)"
step lazyfork list
"$lf" list
step lazyfork delete "$name" ${twin:+"$twin"}
"$lf" delete "$name" ${twin:+"$twin"}

# ---- 100 forks of a 256 MiB heap, beside plain CRIU restores ----
ms() { date +%s%3N; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
mem_of() { # total memory_bytes of the given container ids (lazyfork list --json)
  "$lf" list --json | python3 -c 'import json, sys; ids = set(sys.argv[1:]); print(sum(c["memory_bytes"] for c in json.load(sys.stdin) if c["id"] in ids))' "$@"
}
step lazyfork create lazyfork/debian:bookworm --name "$big" -- python3 -c '...256 MiB heap, counting...'
"$lf" create lazyfork/debian:bookworm --name "$big" -- python3 -c '
import itertools, time
heap = bytearray(256 << 20)
heap[::4096] = b"\x01" * (64 << 10)  # every page holds data
for i in itertools.count():
    print(i, flush=True); time.sleep(1)' >/dev/null
until "$lf" attach --no-follow "$big" | grep -q .; do sleep 0.2; done
big_id=$("$bin/lf-tree" get "$big" | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')

# Plain CRIU first, while the source still holds its heap as its own memory (its first
# fork moves it onto the memory files).
step "lf-dump $big | lf-restore -n $plain    # no lf-memfile: plain CRIU restores, each a full copy"
t2=$(ms)
mapfile -t copies < <("$bin/lf-dump" "$big" 2>/dev/null | "$bin/lf-restore" -n "$plain" 2>/dev/null | python3 -c 'import json, sys; [print(json.loads(l)["id"]) for l in sys.stdin if l.strip()]')
t3=$(ms)
made+=("${copies[@]}")
sleep 1
copy_bytes=$(mem_of "${copies[@]}")
per_copy=$((copy_bytes / ${#copies[@]}))
per_copy_ms=$(((t3 - t2) / ${#copies[@]}))
echo "${#copies[@]} plain copies in $((t3 - t2)) ms, $(mib "$copy_bytes") together"
"$lf" delete "${copies[@]}" >/dev/null
made=()
"$lf" gc

step lazyfork fork "$big" -n "$n"
t0=$(ms)
mapfile -t forks < <("$lf" fork "$big" -n "$n" --json | python3 -c 'import json, sys; [print(json.loads(l)["id"]) for l in sys.stdin if l.strip()]')
t1=$(ms)
made+=("${forks[@]}")
echo "${#forks[@]} forks in $((t1 - t0)) ms"
step lazyfork list
"$lf" list | { head -4; echo "..."; tail -2; }
sleep 1
fork_bytes=$(mem_of "${forks[@]}")
big_bytes=$(mem_of "$big_id")
family_bytes=$("$lf" stats "$big" --json | python3 -c 'import json, sys; print(json.load(sys.stdin).get("family_bytes", 0))')
total=$((big_bytes + fork_bytes + family_bytes))

printf '\n%-40s %12s %12s\n' "" "memory" "time"
printf '%-40s %12s %12s\n' "memory files on tmpfs (once, shared)" "$(mib "$family_bytes")" "-"
printf '%-40s %12s %12s\n' "source ($big), now mapping them" "$(mib "$big_bytes")" "-"
printf '%-40s %12s %9s ms\n' "$n LazyFork forks (measured)" "$(mib "$fork_bytes")" "$((t1 - t0))"
printf '%-40s %12s %9s ms\n' "LazyFork: source + $n forks + files" "$(mib "$total")" "$((t1 - t0))"
printf '%-40s %12s %9s ms\n' "one plain CRIU restore (measured)" "$(mib "$per_copy")" "$per_copy_ms"
printf '%-40s %12s %9s ms\n' "$n plain CRIU restores (x$n)" "$(mib $((per_copy * n)))" "$((per_copy_ms * n))"
echo "(plain restores: $plain measured, dump included, multiplied by $n; $n full copies would need $(mib $((per_copy * n))) of RAM)"

step lazyfork delete "$big" "<$n forks>"
"$lf" delete "$big" "${made[@]}" >/dev/null
"$lf" gc
trap - EXIT
