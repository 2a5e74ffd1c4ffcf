#!/usr/bin/env bash
# Installs what LazyFork needs on a Debian/Ubuntu host, idempotently, and changes nothing else:
# every package it installs comes from the host's own release, nothing is upgraded, and no
# apt source or pin is added.
#
# CRIU: the distribution's package when it is new enough (>= 4.2 on kernels >= 6.16, where
# CRIU 4.1 cannot dump any inet socket; >= 4.1 otherwise). Otherwise Debian sid's criu and the
# few libraries it needs (its own glibc and loader included) are unpacked into a private
# prefix, $LAZYFORK_CRIU_PREFIX (default /usr/local/lib/lazyfork/criu), and the binary is
# pointed at them with patchelf. The host's libraries stay as they are. LazyFork runs that
# binary by its path (see `lazyfork doctor`), never whatever `criu` is first on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "setup: must run as root (try: sudo $0)" >&2; exit 1; }

prefix=${LAZYFORK_CRIU_PREFIX:-/usr/local/lib/lazyfork/criu}
suite=${LAZYFORK_CRIU_SUITE:-sid}
arch=$(dpkg --print-architecture)

apt_updated=
apt_update() { [ -n "$apt_updated" ] || { apt-get update -qq >&2; apt_updated=1; }; }
install_pkgs() { # packages from the host's own release, no Recommends, nothing upgraded
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  apt_update
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-upgrade "${missing[@]}" >&2
}

# iptables: CRIU runs iptables-restore when it restores a network namespace (every
# container has its own by default). jq: docs/how-it-works.md's walkthrough (run by its
# test) reads the stages' JSON with it.
install_pkgs debootstrap python3 busybox-static util-linux procps iptables jq

# The CRIU version this kernel needs.
kver=$(uname -r | grep -oE '^[0-9]+\.[0-9]+')
need=4.1
if dpkg --compare-versions "$kver" ge 6.16; then need=4.2; fi

version_of() { "$1" --version 2>/dev/null | awk '/^Version:/{print $2}'; }
good() { local v; v=$(version_of "$1") && [ -n "$v" ] && dpkg --compare-versions "$v" ge "$need"; }

if good "$prefix/bin/criu"; then
  echo "setup: criu $(version_of "$prefix/bin/criu") ok ($prefix/bin/criu, private)" >&2
  exit 0
fi
if [ -x /usr/sbin/criu ] && good /usr/sbin/criu; then
  echo "setup: criu $(version_of /usr/sbin/criu) ok (/usr/sbin/criu, distribution)" >&2
  exit 0
fi
apt_update
cand=$(apt-cache policy criu 2>/dev/null | awk '/Candidate:/{print $2}')
if [ -n "$cand" ] && [ "$cand" != "(none)" ] && dpkg --compare-versions "$cand" ge "$need"; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-upgrade criu >&2
  good /usr/sbin/criu || { echo "setup: the distribution's criu $cand does not run; see \`lazyfork doctor\`" >&2; exit 1; }
  echo "setup: criu $cand ok (/usr/sbin/criu, distribution)" >&2
  exit 0
fi

# Private CRIU from Debian $suite. apt reads a private sources list, lists and cache: the
# host's apt state, sources and pins are not touched.
start=$(date +%s)
echo "setup: the distribution has criu ${cand:-none}, this kernel ($(uname -r)) needs >= $need: unpacking Debian $suite's criu into $prefix" >&2
# Runtime libraries of criu that the host's release has (same sonames), and patchelf.
install_pkgs patchelf libprotobuf-c1 libnftables1 libbsd0 libuuid1 "$(dpkg -s libgnutls30t64 >/dev/null 2>&1 && echo libgnutls30t64 || echo libgnutls30)"
mirror=$(grep -rhE '^[[:space:]]*(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
  | grep -oE 'https?://[^ ]+/debian/?' | grep -v security | head -1 || true)
mirror=${mirror:-http://deb.debian.org/debian}
work=$(mktemp -d /var/tmp/lazyfork-criu.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs" "$work/root"
echo "deb ${mirror%/} $suite main" >"$work/sources.list"
apt_private=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o Dir::State::status=/dev/null
  -o "APT::Architecture=$arch" -o APT::Sandbox::User=root
  # A mirror snapshot's sid Release may be past its Valid-Until date; signatures are still
  # checked. Only this private download is affected, not the host's apt.
  -o Acquire::Check-Valid-Until=false)
apt-get "${apt_private[@]}" update -qq >&2
# criu, the libraries whose host versions are too old or missing, and glibc with its loader
# (sid's criu needs GLIBC_2.38; bookworm has 2.36).
(cd "$work/debs" && apt-get "${apt_private[@]}" download -qq criu libcompel1 libnet9 libnl-3-200 libc6 >&2)
v=$(dpkg-deb -f "$work"/debs/criu_*.deb Version)
dpkg --compare-versions "$v" ge "$need" || { echo "setup: Debian $suite has criu $v, older than $need: set LAZYFORK_CRIU_SUITE" >&2; exit 1; }
for d in "$work"/debs/*.deb; do dpkg-deb -x "$d" "$work/root"; done
dest="$prefix-$v"
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp/bin" "$dest.tmp/lib"
cp -a "$work/root/usr/sbin/criu" "$dest.tmp/bin/"
cp -a "$work"/root/usr/lib/*-linux-gnu*/*.so* "$dest.tmp/lib/"
loader=$(cd "$dest.tmp/lib" && ls ld-linux*.so.* | head -1)
# The final paths: patchelf before the rename, so the interpreter path names $dest.
patchelf --set-interpreter "$dest/lib/$loader" --force-rpath --set-rpath "$dest/lib" "$dest.tmp/bin/criu"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
ln -sfn "$(basename "$dest")" "$prefix.tmp" && mv -T "$prefix.tmp" "$prefix"
good "$prefix/bin/criu" || { echo "setup: the private criu in $dest does not run; see $dest" >&2; exit 1; }
echo "setup: criu $v ok ($prefix/bin/criu, private, $(du -sh "$dest" | cut -f1), $(($(date +%s) - start)) s)" >&2
