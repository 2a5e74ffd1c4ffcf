#!/usr/bin/env bash
# Builds the platform wheel, installs it into a fresh prefix with pip, and checks that
# `lazyfork` and every stage tool are on that prefix's PATH and run, and that the SDK
# imports; then removes everything it made.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
whl=$(bash scripts/wheel.sh "$tmp/dist" | tail -1)
python3 -m pip install -q --root-user-action=ignore --no-deps --no-index --prefix "$tmp/prefix" "$whl"
export PATH="$tmp/prefix/bin:$PATH"
fail=0
for b in lazyfork lazyfork-engine lf-dump lf-memfile lf-restore lf-overlay lf-cgroup lf-tree lf-inspect; do
  if [ "$(command -v "$b")" != "$tmp/prefix/bin/$b" ] || ! "$b" --help >/dev/null 2>&1; then
    echo "test-wheel: $b is not on PATH from the wheel or does not run" >&2; fail=1
  fi
done
# lazyfork exec starts the helper found next to lazyfork; run alone it says so and exits 2.
rc=0; "$tmp/prefix/bin/lazyfork-helper" 2>/dev/null || rc=$?
if [ "$(command -v lazyfork-helper)" != "$tmp/prefix/bin/lazyfork-helper" ] || [ $rc != 2 ]; then
  echo "test-wheel: lazyfork-helper is not next to lazyfork from the wheel or does not run" >&2; fail=1
fi
site=$(find "$tmp/prefix" -type d -name site-packages | head -1)
PYTHONPATH=$site python3 -c 'import lazyfork.client, lazyfork.hook' || { echo "test-wheel: the SDK does not import" >&2; fail=1; }
size=$(du -h "$whl" | cut -f1)
[ $fail = 0 ] && echo "test-wheel: PASS ($(basename "$whl"), $size: lazyfork, lazyfork-engine, lazyfork-helper, 7 stage tools, SDK)" || { echo "test-wheel: FAIL" >&2; exit 1; }
