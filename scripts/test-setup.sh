#!/usr/bin/env bash
# `make test-setup`: runs scripts/setup.sh in a clean Debian bookworm minbase root, as on a new
# user's machine, and checks that
#   - it only ADDED packages, each at its candidate version from the root's own release
#     (nothing upgraded, downgraded or removed), and left /etc/os-release, apt's sources, pins
#     and keys, and python3 (the release's 3.11) alone;
#   - the CRIU LazyFork picks there (/usr/local/lib/lazyfork/criu/bin/criu) runs --version and
#     check, and dumps and restores a python3 holding TCP and UDP sockets inside the root;
#   - a second run changes nothing (dpkg list, files under /usr/local/lib/lazyfork) and says
#     criu is ok;
#   - LazyFork installed into the root (packaging/install.sh, what `make install` runs) finds
#     that CRIU (`lazyfork doctor`), and its uninstall leaves /usr/local as it was;
#   - the host itself did not change (dpkg list, /etc/os-release, /etc/apt).
# It prints PASS/FAIL per check and a summary with the numbers, and exits 1 on any FAIL.
#
# The debootstrap result is cached as a tarball under /var/cache/lazyfork/ (rebuilt when older
# than $LAZYFORK_TEST_SETUP_CACHE_DAYS days, default 7, or with LAZYFORK_TEST_SETUP_REFRESH=1):
# the first run spends 1-3 minutes in debootstrap, later runs unpack the root in seconds.
#
# The chroot's mounts (the root bound onto itself, /proc, /sys, /dev, /dev/pts; debootstrap's
# own) live in a private mount namespace, so they vanish with its last process even if this
# script is killed; they are also unmounted on exit. The work directory under /var/tmp is
# removed at the end, on failure too, after checking /proc/self/mountinfo for leftovers; only
# the cache tarball stays. A second concurrent run is refused (flock on the cache directory).
set -euo pipefail

suite=${LAZYFORK_TEST_SETUP_SUITE:-bookworm}
cache_dir=/var/cache/lazyfork
cache_days=${LAZYFORK_TEST_SETUP_CACHE_DAYS:-7}
src=$(cd "$(dirname "$0")/.." && pwd)

if [ -z "${LF_TEST_SETUP_ROOT:-}" ]; then
  # Outer part, in the host's mount namespace: lock, make the work directory, run the inner
  # part in a private mount namespace, then check that no mount is left and remove the work
  # directory whatever happened.
  [ "$(id -u)" = 0 ] || { echo "test-setup: must run as root" >&2; exit 1; }
  mkdir -p "$cache_dir"
  exec 9<"$cache_dir"
  flock -n 9 || { echo "test-setup: another test-setup is running (lock on $cache_dir); refusing to run a second one at once" >&2; exit 1; }
  if ! command -v debootstrap >/dev/null; then # before the host's state is recorded
    echo "test-setup: installing debootstrap from the host's release" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-upgrade debootstrap >&2
  fi
  start=$(date +%s)
  work=$(mktemp -d /var/tmp/lazyfork-test-setup.XXXXXX)
  cleanup() {
    local rc=$? left
    left=$(awk -v w="$work" 'index($5, w) == 1 {print $5}' /proc/self/mountinfo)
    if [ -n "$left" ]; then
      echo "test-setup: FAIL: mounts left under $work (not removing it):" >&2
      echo "$left" >&2
      exit 1
    fi
    rm -rf --one-file-system "$work"
    [ ! -e "$work" ] || { echo "test-setup: FAIL: could not remove $work" >&2; exit 1; }
    echo "test-setup: no mount left under $work (/proc/self/mountinfo); removed it; $(($(date +%s) - start)) s in all" >&2
    exit "$rc"
  }
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  host_state() { dpkg-query -W -f '${Package} ${Version}\n'; cat /etc/os-release; find /etc/apt -type f -print0 | sort -z | xargs -0r sha256sum; }
  host_before=$(host_state)
  set +e
  LF_TEST_SETUP_ROOT=$work/root unshare --mount --propagation private -- bash "$0" "$@" 9<&-
  rc=$?
  set -e
  if [ "$(host_state)" = "$host_before" ]; then
    echo "test-setup: host untouched: same dpkg list, /etc/os-release and /etc/apt as before the test" >&2
  else
    echo "test-setup: FAIL: the host changed during the test (another apt run at the same time?):" >&2
    diff <(echo "$host_before") <(host_state) | grep '^[<>]' | head -20 >&2 || true
    rc=1
  fi
  exit "$rc"
fi

# Inner part: in a private mount namespace.
root=$LF_TEST_SETUP_ROOT
# Nothing but stdio goes into the root: a descriptor inherited from whoever started this (job
# runners leak some, e.g. a /dev/null on fd 10) would reach the processes dumped there, on a
# mount the chroot cannot see ("Can't lookup mount=N for fd=10"). 255 is bash's script.
for fd in /proc/$$/fd/*; do
  fd=${fd##*/}
  if [ "$fd" -gt 2 ] && [ "$fd" -lt 250 ]; then eval "exec $fd>&-"; fi
done
work=$(dirname "$root")
arch=$(dpkg --print-architecture)
t0=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}'; }
say() { echo "test-setup: $*" >&2; }

pids=()
mounted=()
inner_cleanup() {
  local p m i
  for p in "${pids[@]}"; do [ "$p" -gt 1 ] 2>/dev/null && kill -9 "$p" 2>/dev/null || true; done
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    m=${mounted[$i]}
    umount "$m" 2>/dev/null || umount -l "$m" || true
  done
  # debootstrap's own /proc and /sys mounts, if it was interrupted
  awk -v r="$root" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m" || true; done
}
trap inner_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap '[[ $- != *e* ]] || echo "test-setup: FAIL: stopped at line $LINENO ($BASH_COMMAND)" >&2' ERR

# 1. The clean root: debootstrap's result, cached.
mirror=$(grep -rhE '^[[:space:]]*(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
  | grep -oE 'https?://[^ ]+/debian/?' | grep -v security | head -1 || true)
mirror=${mirror:-http://deb.debian.org/debian}
mirror=${mirror%/}
if command -v zstd >/dev/null; then comp=(--zstd) ext=tar.zst; else comp=(--gzip) ext=tar.gz; fi
tarball=$cache_dir/debootstrap-$suite-minbase-$arch.$ext
mkdir -p "$root"
if [ -f "$tarball" ] && [ -z "${LAZYFORK_TEST_SETUP_REFRESH:-}" ] && [ -n "$(find "$tarball" -mtime -"$cache_days")" ]; then
  t=$(date +%s.%N)
  tar "${comp[@]}" -xpf "$tarball" --numeric-owner --xattrs -C "$root"
  say "clean $suite root unpacked from the cache $tarball ($(du -h "$tarball" | cut -f1), made $(date -r "$tarball" -u '+%F %H:%M UTC')) in $(since "$t") s"
else
  t=$(date +%s.%N)
  say "debootstrap --variant=minbase $suite from $mirror (first run, or the cache is older than $cache_days days; a few minutes)"
  debootstrap --variant=minbase --arch="$arch" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; say "FAIL: debootstrap"; exit 1; }
  say "debootstrap took $(since "$t") s"
  # debootstrap leaves the host's resolv.conf and hostname in the root; the cache is the root as is.
  rm -f "$cache_dir"/debootstrap-"$suite"-minbase-"$arch".tar.*.tmp
  tar "${comp[@]}" -cpf "$tarball.tmp" --numeric-owner --xattrs -C "$root" .
  mv "$tarball.tmp" "$tarball"
  say "cached as $tarball ($(du -h "$tarball" | cut -f1)); later runs unpack it in seconds"
fi
# Name resolution for apt inside the root, as the host has it. No daemon may start from the
# chroot (policy-rc.d, outside /etc/apt; standard for chroots).
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"

# The checkout's scripts/ (all setup.sh reads) where a user's checkout would be.
mkdir -p "$root/root/lazyfork"
cp -a "$src/scripts" "$root/root/lazyfork/"
# For `make install` in the root (step 7): the built binaries, packaging/, python/.
have_bin=
if [ -x "$src/bin/lazyfork" ]; then
  have_bin=1
  cp -a "$src/bin" "$src/packaging" "$src/python" "$root/root/lazyfork/"
fi

# The root is a mount point of its own (CRIU needs the parent of /dev in the mount tree it
# reads from /proc/self/mountinfo in the chroot: "No parent found for mountpoint ... (@./dev)").
mount --bind "$root" "$root"
mounted+=("$root")
for m in proc sys dev dev/pts; do
  mount --bind "/$m" "$root/$m"
  mounted+=("$root/$m")
done

# The mirror this host reaches may be a frozen snapshot whose suites' Release files are past
# their Valid-Until; the host then says Acquire::Check-Valid-Until "false" in its apt.conf.d.
# The root gets the same setting through $APT_CONFIG, a file outside /etc/apt, so that
# /etc/apt stays exactly debootstrap's (signatures are still checked).
apt_env=()
if [ "$(apt-config dump Acquire::Check-Valid-Until 2>/dev/null | awk '{print $2}')" = '"false";' ]; then
  echo 'Acquire::Check-Valid-Until "false";' >"$root/root/lazyfork/apt-valid-until.conf"
  apt_env=(APT_CONFIG=/root/lazyfork/apt-valid-until.conf)
  say "the host's apt has Acquire::Check-Valid-Until \"false\" (its mirror is a snapshot); apt in the root gets the same through APT_CONFIG, not /etc/apt"
fi
in_root() { chroot "$root" /usr/bin/env -i HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 "${apt_env[@]}" \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
snapshot() { # $1: directory for the record
  mkdir -p "$1"
  in_root dpkg-query -W -f '${Package} ${Version}\n' | sort >"$1/dpkg"
  cat "$root/etc/os-release" >"$1/os-release"
  (cd "$root/etc/apt" && find . \( -type f -o -type l \) -print0 | sort -z | xargs -0r sha256sum) >"$1/apt"
  if [ -d "$root/usr/local/lib/lazyfork" ]; then
    (cd "$root/usr/local/lib/lazyfork" && find . -printf '%y %m %s %T@ %p %l\n' | sort -k5 \
      && find . -type f -print0 | sort -z | xargs -0r sha256sum) >"$1/private"
  else
    : >"$1/private"
  fi
}
snapshot "$work/before"
say "root: $(grep PRETTY_NAME "$root/etc/os-release" | cut -d= -f2), $(wc -l <"$work/before/dpkg") packages; apt sources: $(cd "$root/etc/apt" && ls -d sources.list* preferences* 2>/dev/null | tr '\n' ' ')"

# 2. The set-up, as a user runs it.
show_log() { # setup.sh's own lines and apt's errors; all of it when it failed
  if [ "$2" = 0 ]; then grep -E '^(setup:|E:|W:)' "$1" | sed 's/^/  | /' >&2 || true; else sed 's/^/  | /' "$1" >&2; fi
}
run_setup() { # LOG: setup.sh in the root, its output in LOG (shown); sets rc and secs
  local t
  t=$(date +%s.%N)
  set +e
  in_root bash /root/lazyfork/scripts/setup.sh >"$1" 2>&1
  rc=$?
  set -e
  secs=$(since "$t")
  show_log "$1" "$rc"
}
say "running scripts/setup.sh in the root (kernel $(uname -r))"
run_setup "$work/setup1.log"
setup_rc=$rc setup_time=$secs
snapshot "$work/after"

fails=()
oks=()
check() { # $1: ok?(0/1) $2: text
  if [ "$1" = 0 ]; then oks+=("$2"); echo "test-setup: PASS $2" >&2; else fails+=("$2"); echo "test-setup: FAIL $2" >&2; fi
}
check "$setup_rc" "setup.sh exited $setup_rc (${setup_time} s)"

# 3. Packages: only added, each at its release's candidate from $suite.
join -a1 -a2 -e - -o 0,1.2,2.2 "$work/before/dpkg" "$work/after/dpkg" >"$work/dpkg.joined"
added=$(awk '$2 == "-" {print $1}' "$work/dpkg.joined")
removed=$(awk '$3 == "-" {print $1 " " $2}' "$work/dpkg.joined")
changed=$(awk '$2 != "-" && $3 != "-" && $2 != $3 {print $1 " " $2 " -> " $3}' "$work/dpkg.joined")
n_added=$(printf '%s' "$added" | grep -c . || true)
check "$([ -z "$removed" ] && echo 0 || echo 1)" "no package removed${removed:+: $(echo $removed)}"
check "$([ -z "$changed" ] && echo 0 || echo 1)" "no package upgraded or downgraded${changed:+: $(echo "$changed" | paste -sd, -)}"
bad_origin=
if [ -n "$added" ]; then
  # For each added package: installed version == candidate, and that version's origin line
  # in the version table is the $suite release (not another suite, not /var/lib/dpkg/status only).
  # shellcheck disable=SC2086
  bad_origin=$(in_root apt-cache policy $added | awk -v suite="$suite" '
    /^[^ ]/ { pkg = $1; sub(/:$/, "", pkg); next }
    /^  Installed:/ { inst[pkg] = $2; next }
    /^  Candidate:/ { cand[pkg] = $2; next }
    /^ (\*\*\*|   ) [^ ]/ { cur = ($1 == "***") ? $2 : ""; next }
    /^        [0-9]+ / { if (cur != "" && $0 ~ (" " suite "/")) ok[pkg] = 1; next }
    END { for (p in inst) if (inst[p] != cand[p] || !ok[p]) print p " installed " inst[p] " candidate " cand[p] (ok[p] ? "" : ", not from " suite) }')
fi
check "$([ -z "$bad_origin" ] && echo 0 || echo 1)" "every added package is its $suite candidate${bad_origin:+: $(echo "$bad_origin" | paste -sd';' -)}"
added_kib=0
if [ -n "$added" ]; then
  # shellcheck disable=SC2086
  added_kib=$(in_root dpkg-query -W -f '${Installed-Size}\n' $added | awk '{s += $1} END {print s + 0}')
fi

# 4. The release stays the release.
check "$(cmp -s "$work/before/os-release" "$work/after/os-release" && echo 0 || echo 1)" "/etc/os-release unchanged ($(grep PRETTY_NAME "$work/after/os-release" | cut -d= -f2))"
apt_diff=$(diff "$work/before/apt" "$work/after/apt" | grep '^[<>]' || true)
apt_bad=$(printf '%s\n' "$apt_diff" | grep -E '\./(sources\.list|preferences|trusted\.gpg|keyrings)' || true)
check "$([ -z "$apt_bad" ] && echo 0 || echo 1)" "no apt source, pin or key added or changed under /etc/apt${apt_bad:+: $(echo "$apt_bad" | paste -sd';' -)}"
[ -z "$apt_diff" ] || say "note: other files under /etc/apt changed: $(echo "$apt_diff" | paste -sd';' -)"
py_pkg=$(awk '$1 == "python3" {print $2}' "$work/after/dpkg")
# The release's python3: the version whose origin is $suite (not merely the candidate, which
# a pin to another suite would change).
py_rel=$(in_root apt-cache policy python3 | awk -v suite="$suite" '
  /^ (\*\*\*|   ) [^ ]/ { v = ($1 == "***") ? $2 : $1; next }
  /^        [0-9]+ / && $0 ~ (" " suite "/") { print v; exit }')
py_run=$(in_root python3 --version 2>&1 || true)
py_mm=$(echo "$py_rel" | grep -oE '^[0-9]+\.[0-9]+' || true)
check "$([ -n "$py_pkg" ] && [ "$py_pkg" = "$py_rel" ] && [[ "$py_run" == "Python $py_mm."* ]] && echo 0 || echo 1)" \
  "python3 is the release's: package ${py_pkg:-none} ($suite has ${py_rel:-none}), /usr/bin/python3 says '$py_run'"

# 5. The CRIU LazyFork would pick there (lib/criu.FindBinary with $LAZYFORK_CRIU unset: the
# private one from the set-up if it is there, else the distribution's).
criu=/usr/local/lib/lazyfork/criu/bin/criu
if [ ! -x "$root$criu" ] && [ -x "$root/usr/sbin/criu" ]; then criu=/usr/sbin/criu; fi
criu_v=$(in_root "$criu" --version 2>&1 || true)
check "$(echo "$criu_v" | grep -q '^Version: ' && echo 0 || echo 1)" "$criu --version: $(echo "$criu_v" | paste -sd' ' -)"
criu_target=$(readlink "$root/usr/local/lib/lazyfork/criu" || true)
set +e
criu_check=$(in_root "$criu" check 2>&1)
criu_check_rc=$?
set -e
check "$criu_check_rc" "$criu check in the chroot: $(echo "$criu_check" | tail -3 | paste -sd' ' -)"
# A real dump and restore inside the root, of a process holding a listening TCP socket and a
# UDP socket (CRIU 4.1 cannot dump inet sockets on kernels >= 6.16).
mkdir -p "$root/tmp/lf-dump"
cat >"$root/tmp/lf-sock.py" <<'EOF'
import os, socket, time
os.closerange(3, 4096)  # nothing inherited from outside the root (make's, this script's)
t = socket.socket(socket.AF_INET, socket.SOCK_STREAM); t.bind(("127.0.0.1", 0)); t.listen()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0))
open("/tmp/lf-sock.pid.tmp", "w").write(str(os.getpid())); os.rename("/tmp/lf-sock.pid.tmp", "/tmp/lf-sock.pid")
while True: time.sleep(1)
EOF
# Its parent is a subshell of this script that reaps it after the dump (pid 1 of this VM
# reaps no orphans, and a zombie would keep its pid from the restore). Its fds are opened
# inside the root (a host /dev/null would be a file on a mount the chroot cannot see, which
# CRIU refuses).
(setsid chroot "$root" /bin/sh -c 'exec /usr/bin/python3 /tmp/lf-sock.py </dev/null >/dev/null 2>&1' </dev/null >/dev/null 2>&1 &
  wait) 2>/dev/null &
holder=$!
pids+=("$holder")
for _ in $(seq 100); do [ -s "$root/tmp/lf-sock.pid" ] && break; sleep 0.1; done
pid=$(cat "$root/tmp/lf-sock.pid" 2>/dev/null || echo 0)
pids+=("$pid")
set +e
dump_out=$(in_root "$criu" dump -t "$pid" -D /tmp/lf-dump -o dump.log -v4 2>&1)
dump_rc=$?
[ "$dump_rc" = 0 ] || kill -9 "$pid" 2>/dev/null # a failed dump leaves it running
wait "$holder"
set -e
inet=$(grep -ciE 'inet|tcp|udp' "$root/tmp/lf-dump/dump.log" 2>/dev/null || true)
if [ "$dump_rc" = 0 ] && [ "$pid" -gt 1 ] && ! kill -0 "$pid" 2>/dev/null && [ -s "$root/tmp/lf-dump/pstree.img" ] && [ "${inet:-0}" -gt 0 ]; then
  check 0 "criu dump of a python3 holding a TCP listener and a UDP socket in the chroot (pid $pid, $(du -sh "$root/tmp/lf-dump" | cut -f1) of images, $inet inet/tcp/udp lines in dump.log)"
else
  check 1 "criu dump of a python3 holding TCP and UDP sockets in the chroot (rc $dump_rc): $dump_out $(grep -E 'Error' "$root/tmp/lf-dump/dump.log" 2>/dev/null | tail -3 | paste -sd' ' -)"
fi
if [ "$dump_rc" = 0 ]; then
  # In the foreground, in the background of this shell: criu stays the restored process's
  # parent and reaps it when it is killed.
  in_root "$criu" restore -D /tmp/lf-dump -o restore.log >"$work/restore.out" 2>&1 &
  rpid=$!
  pids+=("$rpid")
  for _ in $(seq 50); do [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$root" ] && break; kill -0 "$rpid" 2>/dev/null || break; sleep 0.1; done
  if [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$root" ]; then
    check 0 "criu restore of it in the chroot (pid $pid back, $(ls -l "/proc/$pid/fd" 2>/dev/null | grep -c 'socket:') sockets open)"
  else
    check 1 "criu restore of it in the chroot: $(cat "$work/restore.out") $(grep -E 'Error' "$root/tmp/lf-dump/restore.log" 2>/dev/null | tail -3 | paste -sd' ' -)"
  fi
  kill -9 "$pid" 2>/dev/null || true
  set +e; wait "$rpid" 2>/dev/null; set -e
fi
rm -rf "$root/tmp/lf-dump" "$root/tmp/lf-sock.py" "$root/tmp/lf-sock.pid"
private_bytes=$(du -sb "$root/usr/local/lib/lazyfork" 2>/dev/null | cut -f1 || true)
private_bytes=${private_bytes:-0}

# 6. A second run changes nothing and says criu is ok.
run_setup "$work/setup2.log"
setup2_rc=$rc setup2_time=$secs
snapshot "$work/again"
check "$setup2_rc" "second setup.sh exited $setup2_rc (${setup2_time} s)"
check "$(cmp -s "$work/after/dpkg" "$work/again/dpkg" && echo 0 || echo 1)" "second run: same dpkg list $(diff "$work/after/dpkg" "$work/again/dpkg" | grep '^[<>]' | paste -sd';' - || true)"
check "$(cmp -s "$work/after/private" "$work/again/private" && echo 0 || echo 1)" "second run: same files under /usr/local/lib/lazyfork (names, modes, sizes, mtimes, sha256)"
check "$(cmp -s "$work/after/apt" "$work/again/apt" && cmp -s "$work/after/os-release" "$work/again/os-release" && echo 0 || echo 1)" "second run: /etc/apt and /etc/os-release unchanged"
check "$(grep -qE '^setup: criu [0-9.]+.* ok' "$work/setup2.log" && echo 0 || echo 1)" "second run says: $(grep -E 'criu' "$work/setup2.log" | tail -1)"

# 7. LazyFork installed into the root (packaging/install.sh, what `make install` runs; the root
# has no make or Go): `lazyfork doctor` there names the CRIU the product picks and test-dumps
# TCP and UDP sockets with it; uninstall leaves /usr/local as it was.
if [ -n "$have_bin" ]; then
  (cd "$root/usr/local" && find . -printf '%y %p %l\n' | sort) >"$work/local-before"
  set +e
  in_root bash /root/lazyfork/packaging/install.sh install >"$work/install.log" 2>&1 </dev/null
  install_rc=$?
  set -e
  check "$install_rc" "packaging/install.sh install in the root: $(grep -E 'stage binaries|skipped|Python SDK|manifest' "$work/install.log" | sed 's/^install: //' | paste -sd';' -)"
  set +e
  doctor=$(in_root /usr/local/bin/lazyfork doctor 2>&1 </dev/null)
  set -e
  printf '%s\n' "$doctor" | grep -E '^(ok|FAIL|fail|warn|WARN) +criu' | sed 's/^/  | doctor: /' >&2 || true
  check "$(grep -qE "^ok +criu +[0-9][0-9.-]* at $criu " <<<"$doctor" && echo 0 || echo 1)" \
    "lazyfork doctor in the root picks $criu: $(grep -E '^[a-zA-Z]+ +criu ' <<<"$doctor" | head -1 | tr -s ' ')"
  check "$(grep -qE '^ok +criu sockets' <<<"$doctor" && echo 0 || echo 1)" \
    "lazyfork doctor in the root: $(grep -E '^[a-zA-Z]+ +criu sockets' <<<"$doctor" | tr -s ' ' || echo 'no criu sockets line')"
  set +e
  in_root bash /root/lazyfork/packaging/install.sh uninstall >>"$work/install.log" 2>&1 </dev/null
  uninstall_rc=$?
  set -e
  (cd "$root/usr/local" && find . -printf '%y %p %l\n' | sort) >"$work/local-after"
  check "$([ "$uninstall_rc" = 0 ] && cmp -s "$work/local-before" "$work/local-after" && echo 0 || echo 1)" \
    "packaging/install.sh uninstall in the root leaves /usr/local as before install $(diff "$work/local-before" "$work/local-after" | grep '^[<>]' | head -5 | paste -sd';' - || true)"
else
  say "note: no $src/bin/lazyfork (run make build): skipped installing LazyFork into the root"
fi

# Summary.
echo
echo "=== test-setup summary ($suite minbase root, kernel $(uname -r)) ==="
echo "set-up time (first run):  ${setup_time} s"
echo "packages added:           $n_added: $(echo $added)"
echo "dpkg Installed-Size sum:  ${added_kib} KiB ($(awk -v k="$added_kib" 'BEGIN{printf "%.1f", k/1024}') MiB)"
echo "private CRIU prefix:      $private_bytes bytes ($(awk -v b="$private_bytes" 'BEGIN{printf "%.1f", b/1048576}') MiB) in /usr/local/lib/lazyfork -> ${criu_target:-none}"
echo "CRIU picked:              $criu ($(echo "$criu_v" | awk '/^Version:/{print $2}'))"
echo "second-run time:          ${setup2_time} s"
echo "test-setup total time:    $(since "$t0") s (chroot part; excludes removing the root)"
echo "checks: ${#oks[@]} passed, ${#fails[@]} failed"
for f in "${fails[@]}"; do echo "  FAIL: $f"; done
if [ ${#fails[@]} -eq 0 ]; then echo "test-setup: PASS"; else echo "test-setup: FAIL"; exit 1; fi
