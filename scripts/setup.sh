#!/usr/bin/env bash
# Installs everything LazyFork needs on a Debian/Ubuntu host, idempotently:
# CRIU >= 4.1 (from Debian trixie, pinned, when the distro's is older), debootstrap,
# python3 (examples, tests), and builds the binaries.
set -euo pipefail
cd "$(dirname "$0")/.."

need_root() { [ "$(id -u)" = 0 ] || { echo "setup: must run as root (try: sudo $0)" >&2; exit 1; }; }
need_root

criu_ok() {
  command -v criu >/dev/null 2>&1 || return 1
  v=$(criu --version 2>/dev/null | awk '/^Version:/{print $2}')
  [ -n "$v" ] || return 1
  dpkg --compare-versions "$v" ge 4.1
}

apt_updated=
apt_update() { [ -n "$apt_updated" ] || { apt-get update -qq >&2; apt_updated=1; }; }

pkgs=()
for p in debootstrap python3 busybox-static util-linux procps; do
  dpkg -s "$p" >/dev/null 2>&1 || pkgs+=("$p")
done
if [ ${#pkgs[@]} -gt 0 ]; then
  apt_update
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >&2
fi

if ! criu_ok; then
  . /etc/os-release
  if [ "${VERSION_CODENAME:-}" = bookworm ]; then
    # Bookworm's criu 3.17 fails on current kernels; take criu from trixie, pinned low so
    # nothing else is upgraded from there unless criu needs it.
    mirror=$(grep -rhE '^[[:space:]]*(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
      | grep -oE 'https?://[^ ]+/debian/?' | grep -v security | head -1 || true)
    mirror=${mirror:-http://deb.debian.org/debian}
    if [ ! -f /etc/apt/sources.list.d/lazyfork-trixie.list ]; then
      echo "deb $mirror trixie main" > /etc/apt/sources.list.d/lazyfork-trixie.list
      printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n' > /etc/apt/preferences.d/lazyfork-trixie
      apt_updated=
    fi
    apt_update
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t trixie criu >&2
  else
    apt_update
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq criu >&2
  fi
  criu_ok || { echo "setup: criu >= 4.1 could not be installed; install it by hand" >&2; exit 1; }
fi
echo "setup: criu $(criu --version | awk '/^Version:/{print $2}') ok" >&2
