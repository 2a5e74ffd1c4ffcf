#!/bin/bash
# Run the zdtm harness (see run.py) on this tree's bin/, one test at a time, niced.
#   scripts/zdtm/run.sh                      all selected tests -> bench/results/zdtm.csv, docs/zdtm.md
#   scripts/zdtm/run.sh --only 'socket|maps' a quick run -> $ZDTM_WORK/quick.csv, quick.md
#   scripts/zdtm/run.sh --limit 10           the first 10 selected tests, likewise
#   scripts/zdtm/run.sh --only X --merge     a quick run whose rows then replace those tests'
#                                            rows of the full results (merge.py)
# Other options go to run.py (--step-timeout, --test-timeout, --privileged).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
. "$HERE/env.sh"

# grep reads all of its input (no -q): under pipefail, a writer cut off by SIGPIPE would
# fail the test and rebuild everything.
if [ ! -f "$ZDTM_WORK/manifest.json" ] || ! "$LF" image list 2>/dev/null | grep -F "${ZDTM_IMAGE#*/}" >/dev/null; then
	bash "$HERE/build.sh"
fi

quick=0 merge=0 suffix= mode="confined as \`lazyfork create\` does by default" args=()
for a in "$@"; do
	case $a in
	--only|--only=*|--limit|--limit=*) quick=1 ;;
	--privileged) suffix=-privileged mode="created with \`--privileged\`" ;;
	esac
	# --merge: a quick run's rows replace those tests' rows of the full results (merge.py).
	if [ "$a" = --merge ]; then merge=1; else args+=("$a"); fi
done
set -- "${args[@]}"
full_csv=$REPO/bench/results/zdtm$suffix.csv full_md=$REPO/docs/zdtm$suffix.md
if [ $merge = 1 ] && { [ $quick = 0 ] || [ ! -f "$full_csv" ]; }; then
	echo "run.sh: --merge needs --only or --limit and an earlier full run ($full_csv)" >&2
	exit 2
fi
if [ $quick = 1 ]; then
	csv=$ZDTM_WORK/quick$suffix.csv md=$ZDTM_WORK/quick$suffix.md
else
	csv=$full_csv md=$full_md
fi
# bin/ is shared and rebuilt by others at any time: this run uses a copy taken now.
pin=$(mktemp -d "$ZDTM_WORK/bin.XXXXXX")
trap 'rm -rf "$pin"' EXIT
cp -a "$LF_BIN"/. "$pin"/
built=$(date -u -r "$LF_BIN/lazyfork" '+%H:%M UTC')
export LF_BIN=$pin
# The harness's own results (an earlier run's, not yet committed) change nothing that runs.
dirty=$(git -C "$REPO" status --porcelain --untracked-files=no -- . ':!bench/results/zdtm*' ':!docs/zdtm*' 2>/dev/null | grep . >/dev/null && echo ", uncommitted changes in the tree" || true)
# The product's commit: the last one that changed anything but the harness and its results.
# It names what ran even after the branch's harness commits are rebased onto main.
product=$(git -C "$REPO" log -1 --format=%h -- . ':!scripts/zdtm' ':!bench/results/zdtm*' ':!docs/zdtm*' 2>/dev/null)
export ZDTM_META="$(date -u '+%Y-%m-%d %H:%M UTC'), LazyFork $product (tree at $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null); bin/ built $built$dirty, copied at the start), \
CRIU $("$("$HERE/criu-path.sh")" --version 2>/dev/null | sed -n 's/^Version: //p') (tests of CRIU ${ZDTM_CRIU_REF:-v4.2}), \
kernel $(uname -r), containers $mode"
# run.py deletes the current test's containers on a signal, with the pinned bin/: the
# signal is passed on and run.py waited for, so the EXIT trap never removes the pin first.
nice -n 10 python3 "$HERE/run.py" --csv "$csv" "$@" &
run=$!
trap 'kill -TERM "$run" 2>/dev/null || true' INT TERM HUP
while kill -0 "$run" 2>/dev/null; do
	wait "$run" || true
done
rc=0
wait "$run" || rc=$?
trap - INT TERM HUP
[ "$rc" = 0 ] || exit "$rc"
python3 "$HERE/md.py" "$csv" "$ZDTM_WORK/manifest.json" >"$md"
echo "results: $csv, $md" >&2
if [ $quick = 0 ]; then
	rm -f "${full_csv%.csv}.runs.json" # a full run's rows are all its own
elif [ $merge = 1 ]; then
	python3 "$HERE/merge.py" "$csv" "$full_csv" "$full_md"
	python3 "$HERE/md.py" "$full_csv" "$ZDTM_WORK/manifest.json" >"$full_md.new"
	mv "$full_md.new" "$full_md"
	echo "merged into: $full_csv, $full_md" >&2
fi
