#!/usr/bin/env bash
# The README demo: start a counter container, look inside, fork it, watch the twin
# continue the count, then clean up.
set -euo pipefail
cd "$(dirname "$0")/.."
lf=${LAZYFORK:-$PWD/bin/lazyfork}
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
name=demo-counter-$$
cleanup() { "$lf" delete "$name" ${twin:+"$twin"} >/dev/null 2>&1 || true; }
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
trap - EXIT
