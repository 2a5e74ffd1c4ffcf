# Shared settings of the zdtm harness (sourced by build.sh and run.sh).
# The harness keeps its own LazyFork state root so its containers, images and snapshots
# never mix with other users of the host (and `lazyfork list` there shows only ours).
: "${REPO:=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
export ZDTM_WORK=${ZDTM_WORK:-/var/tmp/lazyfork-zdtm}
export LAZYFORK_ROOT=${ZDTM_LAZYFORK_ROOT:-/var/lib/lazyfork-zdtm}
export LAZYFORK_RUN=${ZDTM_LAZYFORK_RUN:-/dev/shm/lazyfork-zdtm}
export LAZYFORK_LOCAL=1 # never through a daemon: the binaries of this tree do the work
export ZDTM_IMAGE=${ZDTM_IMAGE:-lazyfork/zdtm:${ZDTM_CRIU_REF:-v4.2}}
export LF_BIN=${LF_BIN:-$REPO/bin}
LF=$LF_BIN/lazyfork
for d in "$LAZYFORK_ROOT" "$LAZYFORK_RUN"; do
	[ -d "$d" ] || mkdir -m 0700 -p "$d"
done
