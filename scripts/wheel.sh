#!/usr/bin/env bash
# Builds the platform wheel: the Python SDK plus statically linked lazyfork and stage
# binaries as scripts, so `pip install dist/lazyfork-*.whl` puts them on PATH.
# Usage: scripts/wheel.sh [OUT_DIR]   (default dist/)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
out=${1:-dist}
bins=$(mktemp -d)
trap 'rm -rf "$bins"' EXIT
CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$bins/lazyfork" ./cmd/lazyfork
CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$bins/lazyfork-engine" ./cmd/lazyfork-engine
CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$bins/lazyfork-helper" ./cmd/lazyfork-helper
for s in lf-dump lf-memfile lf-restore lf-overlay lf-cgroup lf-tree lf-inspect; do
  [ -d "$s" ] && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$bins/$s" "./$s"
done
mkdir -p "$out"
LAZYFORK_WHEEL_BIN=$bins PIP_ROOT_USER_ACTION=ignore python3 -m pip wheel -q --no-deps --no-build-isolation -w "$out" ./python >&2
ls "$out"/lazyfork-*-linux_*.whl
