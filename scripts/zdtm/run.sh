#!/bin/bash
# Run the zdtm harness (see run.py) on this tree's bin/, one test at a time, niced.
#   scripts/zdtm/run.sh                      all selected tests -> bench/results/zdtm.csv, docs/zdtm.md
#   scripts/zdtm/run.sh --only 'socket|maps' a quick run -> $ZDTM_WORK/quick.csv, quick.md
#   scripts/zdtm/run.sh --limit 10           the first 10 selected tests, likewise
# Other options go to run.py (--step-timeout, --test-timeout, --privileged).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
. "$HERE/env.sh"

if [ ! -f "$ZDTM_WORK/manifest.json" ] || ! "$LF" image list 2>/dev/null | grep -q "${ZDTM_IMAGE#*/}"; then
	bash "$HERE/build.sh"
fi

quick=0 suffix= mode="confined as \`lazyfork create\` does by default"
for a in "$@"; do
	case $a in
	--only|--only=*|--limit|--limit=*) quick=1 ;;
	--privileged) suffix=-privileged mode="created with \`--privileged\`" ;;
	esac
done
if [ $quick = 1 ]; then
	csv=$ZDTM_WORK/quick$suffix.csv md=$ZDTM_WORK/quick$suffix.md
else
	csv=$REPO/bench/results/zdtm$suffix.csv md=$REPO/docs/zdtm$suffix.md
fi
# bin/ is shared and rebuilt by others at any time: this run uses a copy taken now.
pin=$(mktemp -d "$ZDTM_WORK/bin.XXXXXX")
trap 'rm -rf "$pin"' EXIT
cp -a "$LF_BIN"/. "$pin"/
built=$(date -u -r "$LF_BIN/lazyfork" '+%H:%M UTC')
export LF_BIN=$pin
dirty=$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo ", uncommitted changes in the tree" || true)
export ZDTM_META="$(date -u '+%Y-%m-%d %H:%M UTC'), LazyFork $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null) (bin/ built $built$dirty, copied at the start), \
CRIU $("$("$HERE/criu-path.sh")" --version 2>/dev/null | sed -n 's/^Version: //p') (tests of CRIU ${ZDTM_CRIU_REF:-v4.2}), \
kernel $(uname -r), containers $mode"
nice -n 10 python3 "$HERE/run.py" --csv "$csv" "$@"
python3 "$HERE/md.py" "$csv" "$ZDTM_WORK/manifest.json" >"$md"
echo "results: $csv, $md" >&2
