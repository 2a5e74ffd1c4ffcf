#!/bin/bash
# make test-v2: run the project's privileged Go tests on a pure cgroup v2 machine.
#
# Boots Debian trixie's kernel in qemu with cgroup_no_v1=all and
# systemd.unified_cgroup_hierarchy=1, on a debootstrapped trixie root (CRIU 4.1 from
# Debian) shared read-only over virtiofs, and runs every package's compiled test binary
# inside it (scripts/v2/guest-init.sh), then the README demo, printing go test's ok/FAIL
# lines (the demo counted as one more) and a final
# "N passed, N failed". Exit code 0 only if every package passed.
#
# Nothing is installed on the host except qemu-system-x86 from the host's own release
# (--no-install-recommends, refused if it would upgrade anything). The kernel package is
# downloaded and unpacked privately, never installed. Cached under $LF_V2_CACHE:
#   kernel-<version>/   the unpacked kernel package, vmlinuz and an extracted vmlinux
#   root-<stamp>.tar.zst and root-<stamp>/   the guest root (debootstrap, ~80 s once)
#
# Measured on the project's 2-core Debian 12 VM (kvm_pvm, so TCG; python's sha256 ~20x
# slower in the guest than on the host): root build 80-210 s once, run preparation 27-72 s,
# boot to the tests ~25 s; on a quiet host lib/fork 41 min, cmd/lazyfork 70 min, lib/daemon
# 16 min, the demo 7 min, the whole suite over three hours (1.5-2x that while the host
# works on something else): far too slow for CI; with real KVM it is a few times faster.
#
# Settings (environment):
#   LF_V2_PKGS     packages to run, import paths or relative (lib/cgroup cmd/lazyfork);
#                  default: every package of the module, cgroup/runtime/fork/criu first
#   LF_V2_ACCEL    auto (default), kvm or tcg. auto uses TCG on a PVM host (kvm_pvm only
#                  runs PVM-enabled guest kernels; Debian's stops in its decompressor)
#   LF_V2_MEM, LF_V2_SMP   guest memory (MiB, 4096) and CPUs (2)
#   LF_V2_TIMEOUT  hard limit for the whole VM in seconds (18000: the whole suite fits)
#   LF_V2_PKG_TIMEOUT  per package, seconds (6000: cmd/lazyfork needs 70 min under TCG)
#   LF_V2_TEST_ARGS    extra test binary flags, e.g. "-test.run=TestX -test.v"
#   LF_V2_CGROUP_PARENT  LAZYFORK_CGROUP_PARENT for the tests (default empty: the product's
#                  default parent, /lazyfork on v2, while the tests run inside a systemd-like
#                  service group that holds processes); e.g. /lazyfork-test.slice for an
#                  empty group the guest makes
#   LF_V2_TIME_SCALE   the least LF_TEST_TIME_SCALE in the guest: the factor the tests'
#                  deadlines are stretched by (default 10 under TCG, 2 under KVM; raised to
#                  2.5 x the guest's sha256 seconds when it runs slower, at most 60; no test
#                  asserts a time)
#   LF_V2_ENV      extra VAR=value words for the tests
#   LF_V2_PATCH    a patch (-p1) applied to the snapshot of the checkout that is built and
#                  tested: try a fix in the VM without touching the working tree
#   LF_V2_DEMO=0   do not run the README demo (scripts/demo.sh) after the tests; LF_V2_DEMO_N
#                  its fork count (100)
#   LF_V2_KEEP=1   keep the run directory (logs are always copied to $LF_V2_CACHE/last)
#
# The binaries and test binaries are built from a snapshot of the working tree at
# $LF_V2_CACHE/run/src (a stable path, so Go's build cache keeps working), which the guest
# mounts at the same path: tests that find the repository through their source path work.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${LF_V2_CACHE:-/var/cache/lazyfork/v2}
suite=trixie
mirror=${LF_V2_MIRROR:-http://deb.debian.org/debian}
mem=${LF_V2_MEM:-4096}
smp=${LF_V2_SMP:-2}
vm_timeout=${LF_V2_TIMEOUT:-18000}
pkg_timeout=${LF_V2_PKG_TIMEOUT:-6000}
# What the guest root carries: CRIU from Debian, what the tests exec (python3 with pip for
# the SDK test, gcc for a hostile-library test, unshare/timeout/tar), kmod for overlay,
# iptables (CRIU runs iptables-restore when it restores a network namespace), jq (the
# how-it-works walkthrough).
root_pkgs=criu,python3,python3-pip,gcc,libc6-dev,kmod,iproute2,iptables,procps,psmisc,busybox-static,jq
root_rev=2 # bump when the root's recipe changes

log() { echo "test-v2: $*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }

[ "$(id -u)" = 0 ] || { log "needs root (debootstrap, virtiofsd, the privileged tests)"; exit 2; }
mkdir -p "$cache"
exec 9>"$cache/lock"
flock -n 9 || { log "another test-v2 holds $cache/lock; waiting"; flock 9; }

# --- qemu from the host's own release -------------------------------------------------
qemu=$(command -v qemu-system-x86_64 || true)
virtiofsd=/usr/lib/qemu/virtiofsd
if [ -z "$qemu" ] || [ ! -x "$virtiofsd" ]; then
	plan=$(apt-get -s install --no-install-recommends qemu-system-x86 2>&1) || { echo "$plan" >&2; exit 2; }
	# An upgrade reads "Inst pkg [installed] (new ...)"; a new package's line ends in its
	# architecture in brackets, "Inst pkg (1.0 Debian:12/oldstable [amd64])".
	if grep -qE '^Inst [^ ]+ \[' <<<"$plan"; then
		log "installing qemu-system-x86 would upgrade installed packages; install it yourself:"
		grep -E '^Inst [^ ]+ \[' <<<"$plan" >&2
		exit 2
	fi
	log "installing qemu-system-x86 from the host's release (--no-install-recommends)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86 >&2
	qemu=$(command -v qemu-system-x86_64)
fi
[ -x "$virtiofsd" ] || { log "$virtiofsd missing (qemu-system-common >= 8 dropped it: install the virtiofsd package and adapt)"; exit 2; }

# --- the guest kernel: Debian trixie's, downloaded and unpacked privately --------------
apt_dir=$cache/apt
apt_private=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o Dir::State::status=/dev/null
	-o APT::Sandbox::User=root)
kdir=$(ls -d "$cache"/kernel-*/ 2>/dev/null | sort -V | tail -1 || true)
kdir=${kdir%/}
if [ -z "$kdir" ] || [ ! -f "$kdir/vmlinux" ] || [ -n "${LF_V2_REFRESH_KERNEL:-}" ]; then
	t=$(now)
	mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs"
	echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" >"$apt_dir/sources.list"
	apt-get "${apt_private[@]}" update -qq >&2
	kpkg=$(apt-cache "${apt_private[@]}" depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
	[ -n "$kpkg" ] || { log "no linux-image-amd64 in $suite"; exit 2; }
	kver=${kpkg#linux-image-}
	rm -f "$apt_dir"/debs/*.deb
	(cd "$apt_dir/debs" && apt-get "${apt_private[@]}" download -qq "$kpkg" >&2)
	kdir=$cache/kernel-$kver
	rm -rf "$kdir.tmp" && mkdir -p "$kdir.tmp/pkg"
	dpkg-deb -x "$apt_dir"/debs/"$kpkg"_*.deb "$kdir.tmp/pkg"
	cp "$kdir.tmp/pkg/boot/vmlinuz-$kver" "$kdir.tmp/vmlinuz"
	python3 "$repo/scripts/v2/extract-vmlinux.py" "$kdir.tmp/vmlinuz" "$kdir.tmp/vmlinux" >&2
	echo "$kver" >"$kdir.tmp/version"
	rm -f "$apt_dir"/debs/*.deb
	rm -rf "$kdir" && mv "$kdir.tmp" "$kdir"
	log "kernel $kver unpacked in $(since "$t")s"
fi
kver=$(cat "$kdir/version")

# --- the guest root: debootstrap trixie once, cached as a tarball and a directory ------
stamp=$(echo "$suite $root_pkgs $kver $root_rev $(sha256sum "$repo/scripts/v2/init-stub.sh" | cut -c1-16)" | sha256sum | cut -c1-12)
root=$cache/root-$stamp
tarball=$root.tar.zst
if [ ! -f "$root/.complete" ]; then
	t=$(now)
	rm -rf --one-file-system "$root.tmp"
	if [ -f "$tarball" ]; then
		mkdir -p "$root.tmp"
		tar --zstd -C "$root.tmp" -xpf "$tarball"
		log "guest root unpacked from $tarball in $(since "$t")s"
	else
		log "building the guest root (debootstrap $suite minbase + $root_pkgs; about 80 s)"
		nice -n 10 debootstrap --variant=minbase --include="$root_pkgs" "$suite" "$root.tmp" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
			{ tail -20 "$cache/debootstrap.log" >&2; log "debootstrap failed (log: $cache/debootstrap.log)"; exit 2; }
		rm -f "$root.tmp"/var/cache/apt/archives/*.deb "$root.tmp"/var/lib/apt/lists/*_Packages
		mkdir -p "$root.tmp/usr/lib/modules" "$root.tmp/mnt/lazyfork-v2" "$root.tmp/work"
		cp -a "$kdir/pkg/usr/lib/modules/$kver" "$root.tmp/usr/lib/modules/"
		chroot "$root.tmp" depmod "$kver"
		install -m 0755 "$repo/scripts/v2/init-stub.sh" "$root.tmp/sbin/lazyfork-v2-init"
		echo lazyfork-v2 >"$root.tmp/etc/hostname"
		t2=$(now)
		tar --zstd -C "$root.tmp" -cpf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
		log "guest root built in $(since "$t")s (tarball $(du -h "$tarball" | cut -f1) in $(since "$t2")s)"
	fi
	touch "$root.tmp/.complete"
	rm -rf --one-file-system "$root" && mv "$root.tmp" "$root"
	# Older roots and tarballs are of no further use.
	for old in "$cache"/root-*; do
		case $old in "$root" | "$tarball") ;; *) rm -rf --one-file-system "$old" ;; esac
	done
fi

# --- the run: the checkout, binaries, compiled tests and the image store -------------
run=$cache/run
rm -rf --one-file-system "$run" "$cache"/run.* && mkdir -p "$run"
pids=()
cleanup() {
	local rc=$?
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [ -d "$run/result" ]; then
		rm -rf "$cache/last" && mkdir -p "$cache/last"
		cp -a "$run/result/." "$run"/*.log "$cache/last/" 2>/dev/null || true
	fi
	[ -n "${LF_V2_KEEP:-}" ] || rm -rf --one-file-system "$run"
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

t=$(now)
src=$run/src
mkdir -p "$src" "$run/tests" "$run/result"
# The checkout as it is now, minus .git and bin: what is built and tested.
tar -C "$repo" --exclude=./.git --exclude=./bin -cf - . | tar -C "$src" -xf -
if [ -n "${LF_V2_PATCH:-}" ]; then
	patch -s --forward --batch -p1 -d "$src" <"$LF_V2_PATCH" || { log "LF_V2_PATCH=$LF_V2_PATCH does not apply"; exit 2; }
	log "applied $LF_V2_PATCH to the snapshot"
fi
# The binaries, as make build makes them (its STAGES list).
mkdir -p "$src/bin"
stages=$(sed -n 's/^STAGES *:= *//p' "$src/Makefile")
(cd "$src" && nice -n 10 go build -o bin/lazyfork ./cmd/lazyfork && ln -sf lazyfork bin/lfork &&
	nice -n 10 go build -o bin/lazyfork-engine ./cmd/lazyfork-engine &&
	nice -n 10 go build -o bin/lazyfork-helper ./cmd/lazyfork-helper &&
	for s in $stages; do
		[ ! -d "$s" ] || nice -n 10 go build -o "bin/$s" "./$s" || exit 1
	done) >&2 || { log "building the binaries failed"; exit 1; }
# One file: the guest unpacks it to tmpfs (copying 8000 files over virtiofs under TCG is slow).
tar -C /var/lib/lazyfork -cf "$run/images.tar" images
cp "$repo/scripts/v2/guest-init.sh" "$run/guest-init.sh"

# Every package, those that touch cgroups, the runtime, fork, CRIU and the daemon first.
mod=$(cd "$src" && go list -m)
if [ -n "${LF_V2_PKGS:-}" ]; then
	want=$LF_V2_PKGS
else
	first="lib/cgroup lib/container lib/fork lib/criu lib/memfile lib/daemon cmd/lazyfork"
	want=$(for p in $first; do echo "$mod/$p"; done; cd "$src" && go list ./... | grep -v -x -F -f <(for p in $first; do echo "$mod/$p"; done))
fi
entries=""
testpkgs=()
for p in $want; do
	case $p in "$mod"/*) ;; *) p=$mod/${p#./} ;; esac # lib/cgroup = $mod/lib/cgroup
	info=$(cd "$src" && go list -f '{{.Dir}} {{if or .TestGoFiles .XTestGoFiles}}yes{{end}}' "$p")
	dir=${info%% *}
	if [ "${info#* }" = yes ]; then
		testpkgs+=("$p")
		entries+=" $p=$dir:$(basename "$p").test"
	else
		entries+=" $p=$dir:-"
	fi
done
(cd "$src" && nice -n 10 go test -c -o "$run/tests/" "${testpkgs[@]}") >&2 ||
	{ log "compiling the tests failed"; exit 1; }
cat >"$run/config" <<EOF
REPO='$src'
PKGS='$entries'
PKG_TIMEOUT='$pkg_timeout'
TEST_ARGS='${LF_V2_TEST_ARGS:-}'
EXTRA_ENV='${LF_V2_ENV:-}'
CGROUP_PARENT='${LF_V2_CGROUP_PARENT:-}'
TIME_SCALE='@TIME_SCALE@'
DEMO='${LF_V2_DEMO:-1}'
DEMO_N='${LF_V2_DEMO_N:-100}'
EOF
log "run prepared in $(since "$t")s: ${#testpkgs[@]} test binaries, checkout, binaries, image store"

# --- accelerator ----------------------------------------------------------------------
accel=${LF_V2_ACCEL:-auto}
if [ "$accel" = auto ]; then
	if [ -d /sys/module/kvm_pvm ]; then
		accel=tcg # see the header: PVM runs PVM-enabled kernels only
	elif [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
		accel=kvm
	else
		accel=tcg
	fi
fi
kernel_args="console=ttyS0 quiet panic=1 systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all"
kernel_args+=" rootfstype=virtiofs root=lfroot ro init=/sbin/lazyfork-v2-init"
case $accel in
kvm) accel_args=(-accel kvm -cpu host) kernel=$kdir/vmlinuz scale=2 ;;
tcg) accel_args=(-accel tcg,thread=multi -cpu max) kernel=$kdir/vmlinux scale=10 ;;
*) log "LF_V2_ACCEL=$accel: want auto, kvm or tcg"; exit 2 ;;
esac
scale=${LF_V2_TIME_SCALE:-$scale}
[[ $scale =~ ^[0-9]+(\.[0-9]+)?$ ]] || { log "LF_V2_TIME_SCALE=$scale: want a number"; exit 2; }
sed -i "s/@TIME_SCALE@/$scale/" "$run/config"

# --- boot -----------------------------------------------------------------------------
nice -n 10 "$virtiofsd" --socket-path="$run/root.sock" -o source="$root" -o cache=always \
	-o sandbox=chroot -o no_posix_lock -o log_level=err >"$run/virtiofsd-root.log" 2>&1 &
pids+=($!)
nice -n 10 "$virtiofsd" --socket-path="$run/run.sock" -o source="$run" -o cache=none \
	-o sandbox=chroot -o no_posix_lock -o log_level=err >"$run/virtiofsd-run.log" 2>&1 &
pids+=($!)
for s in root run; do
	for _ in $(seq 100); do [ -S "$run/$s.sock" ] && break; sleep 0.05; done
	[ -S "$run/$s.sock" ] || { log "virtiofsd ($s) did not start: $(cat "$run/virtiofsd-$s.log")"; exit 2; }
done
: >"$run/tests.log"
log "booting $kernel ($accel, ${mem} MiB, $smp CPUs; console log: $cache/last/console.log)"
tb=$(now)
nice -n 10 timeout -k 10 "$vm_timeout" "$qemu" "${accel_args[@]}" -machine q35 -m "$mem" -smp "$smp" \
	-object memory-backend-memfd,id=mem,size="${mem}M",share=on -numa node,memdev=mem \
	-chardev socket,id=vfsroot,path="$run/root.sock" -device vhost-user-fs-pci,chardev=vfsroot,tag=lfroot \
	-chardev socket,id=vfsrun,path="$run/run.sock" -device vhost-user-fs-pci,chardev=vfsrun,tag=lfrun \
	-kernel "$kernel" -append "$kernel_args" \
	-display none -monitor none -nodefaults -no-reboot \
	-serial file:"$run/console.log" -serial file:"$run/tests.log" >"$run/qemu.log" 2>&1 &
qpid=$!
pids+=($qpid)
tail -n +1 -f --pid=$qpid "$run/tests.log" &
pids+=($!)
qrc=0
wait $qpid || qrc=$?
sleep 0.3
log "VM ran $(since "$tb")s (qemu exit $qrc)"

if [ ! -f "$run/result/rc" ]; then
	[ $qrc = 124 ] && log "the VM hit LF_V2_TIMEOUT=${vm_timeout}s"
	log "no result from the VM; console log tail:"
	tail -n 40 "$run/console.log" >&2 || true
	cat "$run/qemu.log" >&2 || true
	exit 1
fi
rc=$(cat "$run/result/rc")
[ "$rc" = 0 ] || log "failures; logs per package in $cache/last/"
exit "$rc"
