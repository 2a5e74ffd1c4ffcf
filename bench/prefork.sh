#!/bin/bash
# A pre-forking server (a master and 4 workers sharing a 64 MiB heap copy-on-write, as
# gunicorn or multiprocessing leave it) is forked once; prints and appends to
# bench/results/prefork.csv: the snapshot's memory files (allocated bytes) and the fork's
# charge (its cgroup's memory usage, `lazyfork list --json` memory_bytes) a few seconds in.
#   bench/prefork.sh [BIN_DIR] [LABEL]
# State roots come from LAZYFORK_ROOT/LAZYFORK_RUN (the image lazyfork/debian:bookworm
# must be in the store).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${1:-$HERE/../bin}
LABEL=${2:-$(git -C "$HERE" rev-parse --short HEAD)}
export LAZYFORK_LOCAL=1
LF=$BIN/lazyfork
name=pf-$$
cleanup() { "$LF" delete "$name" "$name-f" >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$LF" create lazyfork/debian:bookworm --name "$name" -- python3 -c '
import os, time
buf = bytearray(64 << 20)
pat = bytes(range(1, 256)) * 17
for off in range(0, 64 << 20, 4096):
    buf[off:off + 4096] = pat[:4096]
for i in range(4):
    if os.fork() == 0:
        break
while True:
    time.sleep(1)
' >/dev/null
procs() { "$LF" list --json | python3 -c "import json,sys; print([c['procs'] for c in json.load(sys.stdin) if c['name']=='$1'][0])"; }
mem() { "$LF" list --json | python3 -c "import json,sys; print([c['memory_bytes'] for c in json.load(sys.stdin) if c['name']=='$1'][0])"; }
for _ in $(seq 100); do [ "$(procs "$name")" -ge 5 ] && break; sleep 0.2; done
sleep 2
src_mem=$(mem "$name")
"$LF" fork "$name" --name "$name-f" >/dev/null
sleep 3
fork_mem=$(mem "$name-f")
# The fork's memory directory holds the family's files (container.json mem_dir).
id=$("$LF" list --json | python3 -c "import json,sys; print([c['id'] for c in json.load(sys.stdin) if c['name']=='$name-f'][0])")
fam=$(python3 -c "import json; print(json.load(open('${LAZYFORK_ROOT:-/var/lib/lazyfork}/containers/$id/container.json'))['mem_dir'])")
files=$(du -B1 -s "$fam" | cut -f1)
printf 'label,memory_files_bytes,fork_charge_bytes,source_bytes\n%s,%s,%s,%s\n' "$LABEL" "$files" "$fork_mem" "$src_mem" >&2
csv=$HERE/results/prefork.csv
[ -f "$csv" ] || echo "label,memory_files_bytes,fork_charge_bytes,source_bytes" >"$csv"
echo "$LABEL,$files,$fork_mem,$src_mem" >>"$csv"
