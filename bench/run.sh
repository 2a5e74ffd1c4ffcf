#!/usr/bin/env bash
# LazyFork benchmark (issue 5). `make bench` runs it whole (< 15 min on 2 cores) and writes
# bench/results/{*.csv,*.png,summary.md}; `make bench-smoke` (--smoke) runs the same code
# paths with tiny sizes in < 60 s and writes to /tmp/lazyfork-bench-smoke. `--only a,b`
# runs parts of it (bench.py --help lists them; results in /tmp/lazyfork-bench-only).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
bin=${LAZYFORK_BIN:-$repo/bin}
smoke=0
partial=0
for a in "$@"; do [[ $a == --smoke ]] && smoke=1; [[ $a == --only* ]] && partial=1; done

die() { echo "bench: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "must run as root (containers and CRIU need it)"
command -v python3 >/dev/null || die "python3 not found (apt-get install python3)"
for b in lazyfork lazyfork-engine lazyfork-helper lf-dump lf-memfile lf-restore lf-overlay lf-cgroup; do
  [[ -x $bin/$b ]] || die "$bin/$b missing: run 'make build' first"
done
# The CRIU LazyFork runs (lib/criu.FindBinary): $LAZYFORK_CRIU, the private one of
# `make setup`, or the distribution's; the baselines run the same binary.
if [[ -z ${LAZYFORK_CRIU:-} ]]; then
  for c in /usr/local/lib/lazyfork/criu/bin/criu /usr/sbin/criu; do [[ -x $c ]] && { LAZYFORK_CRIU=$c; break; }; done
fi
[[ -x ${LAZYFORK_CRIU:-} ]] || die "criu not found: run 'make setup' (or set LAZYFORK_CRIU)"
export LAZYFORK_CRIU
"$bin/lazyfork" image list 2>/dev/null | grep -q '^lazyfork/debian:bookworm ' ||
  die "default image lazyfork/debian:bookworm missing: run 'make image'"

# Plots need matplotlib. apt installs it for the system python (/usr/bin/python3), which may
# not be the first python3 on PATH. The full run installs it; the smoke run only draws the
# plots when it is already there.
py=
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import matplotlib' 2>/dev/null; then py=$p; break; fi
done
if [[ -z $py && ( $smoke == 1 || $partial == 1 ) ]]; then
  echo "bench: matplotlib not installed; this run skips the plots" >&2
  py=python3
elif [[ -z $py ]]; then
  # Installed only if that changes nothing else on the host: a simulated install that would
  # upgrade any package (a newer suite in apt's sources pulls newer libraries) is refused,
  # and the run goes on without plots.
  upgrades=$(apt-get -s install --no-install-recommends python3-matplotlib 2>/dev/null |
    awk '/ upgraded, /{print $1; exit}')
  if [[ $upgrades == 0 ]]; then
    echo "bench: installing python3-matplotlib (apt-get, nothing upgraded) for the plots" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-matplotlib >/dev/null 2>&1 ||
      die "could not install python3-matplotlib with apt-get (try: apt-get install python3-matplotlib), then rerun"
    py=/usr/bin/python3
    "$py" -c 'import matplotlib' 2>/dev/null || die "python3-matplotlib installed but '$py -c \"import matplotlib\"' fails"
  else
    echo "bench: installing python3-matplotlib would upgrade ${upgrades:-some} host packages; this run skips the plots (install it from the host's own release to get them)" >&2
    py=python3
  fi
fi

export LAZYFORK_BIN=$bin
exec "$py" "$here/bench.py" "$@"
