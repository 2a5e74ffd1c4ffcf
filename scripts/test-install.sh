#!/usr/bin/env bash
# Tests `make install` and `make uninstall` into a temporary DESTDIR: the files appear (binaries
# run, the lfork link, the systemd unit names the daemon's socket and state directories, the
# bash completion completes commands, subcommands and flags, the Python SDK imports from where
# it went), the manifest lists exactly what was installed, and uninstall removes all of it
# while a file that install did not put there stays. Then once more with a Python without pip
# (the SDK is skipped with a message). Run as: bash scripts/test-install.sh [PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH

prefix=${1:-/usr/local}
python=${PYTHON:-python3}
dest=$(mktemp -d /tmp/lazyfork-test-install.XXXXXX)
scratch=$(mktemp -d /tmp/lazyfork-test-install-scratch.XXXXXX)
trap 'rm -rf "$dest" "$scratch"' EXIT
fails=0
ok() { echo "test-install: PASS $*"; }
bad() { echo "test-install: FAIL $*"; fails=$((fails + 1)); }
t() { local what=$1; shift; if "$@" >/dev/null 2>&1; then ok "$what"; else bad "$what"; fi; }

make -s build
# A file that is not LazyFork's, in a directory install also uses: uninstall must keep both.
mkdir -p "$dest$prefix/bin"
echo keep >"$dest$prefix/bin/not-lazyfork"

make -s install PREFIX="$prefix" DESTDIR="$dest" PYTHON="$python"
root=$dest$prefix
b=$root/bin
t "bin/lazyfork runs (--help)" "$b/lazyfork" --help
t "bin/lfork -> lazyfork" test "$(readlink "$b/lfork")" = lazyfork
t "bin/lazyfork-engine is next to lazyfork (lazyfork hands it what no daemon serves)" "$b/lazyfork-engine" --help
t "bin/lazyfork-helper is next to lazyfork (lazyfork exec starts it)" test -x "$b/lazyfork-helper"
stages=$(make -s -f - <<<'include Makefile
print-stages: ; @echo $(STAGES)' print-stages)
for s in $stages; do
  [ -x "bin/$s" ] || continue
  t "bin/$s runs (--help)" "$b/$s" --help
  t "bash completion is linked for $s" test "$(readlink "$root/share/bash-completion/completions/$s")" = lazyfork
done
unit=$root/lib/systemd/system/lazyfork.service
t "systemd unit runs $prefix/bin/lazyfork daemon run" grep -qx "ExecStart=$prefix/bin/lazyfork daemon run" "$unit"
t "systemd unit: socket /run/lazyfork/lazyfork.sock, state /var/lib/lazyfork and /dev/shm/lazyfork" \
  sh -c "grep -qx 'Environment=LAZYFORK_SOCKET=/run/lazyfork/lazyfork.sock' '$unit' && grep -qx 'Environment=LAZYFORK_ROOT=/var/lib/lazyfork' '$unit' && grep -qx 'Environment=LAZYFORK_RUN=/dev/shm/lazyfork' '$unit'"
t "systemd unit: containers outlive the daemon (KillMode=process, Delegate=yes)" \
  sh -c "grep -qx KillMode=process '$unit' && grep -qx Delegate=yes '$unit'"
if command -v systemd-analyze >/dev/null; then
  # verify wants ExecStart's binary at its real path: check a copy that points into DESTDIR.
  sed "s|^ExecStart=$prefix/bin/|ExecStart=$b/|" "$unit" >"$scratch/lazyfork.service"
  if out=$(systemd-analyze verify "$scratch/lazyfork.service" 2>&1); then ok "systemd-analyze verify lazyfork.service"; else bad "systemd-analyze verify: $out"; fi
fi

# bash completion, as bash-completion would load it (commands come from the installed binary).
comp=$root/share/bash-completion/completions/lazyfork
t "bash completion file and its lfork, lf-* links" sh -c "test -f '$comp' && test \"\$(readlink '$root/share/bash-completion/completions/lfork')\" = lazyfork"
complete_line() { # words...; the last is the one being completed; prints the candidates
  PATH="$b:$PATH" bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _lazyfork; printf "%s\n" "${COMPREPLY[@]}"' _ "$comp" "$@"
}
comp_has() { # "wanted candidates" words...; the last word is the one being completed
  local want=$1 got w
  shift
  got=$(complete_line "$@" | sort -u)
  for w in $want; do
    grep -qx -- "$w" <<<"$got" || { bad "bash completion of '$*': no $w in: $(echo $got)"; return; }
  done
  ok "bash completion of '$*' -> $(echo $got | cut -c1-80)"
}
comp_has "create fork daemon image tree" lazyfork ''
comp_has "run start status stop clean" lazyfork daemon ''
comp_has "pull list ls rm" lfork image ''
comp_has "--name --help --root" lazyfork fork counter --
comp_has "--exit" lf-dump --
comp_has "delete" lazyfork de
# Container names and ids where a command takes a <container>, from `lazyfork list` (a stand-in
# that prints the table in lazyfork's format and hands everything else to the installed binary).
mkdir -p "$scratch/stub"
cat >"$scratch/stub/lazyfork" <<STUB
#!/bin/sh
[ "\$1" = list ] || exec "$b/lazyfork" "\$@"
printf ' id             name   state     parent   depth      pid procs      memory\n'
printf ' %s\n' '─────────────────────────────────────────'
printf ' 0a1b2c3d4e5f   counter running   -            0     4242     1      1.0 MB\n'
printf ' 1 total                                                            1.0 MB\n'
STUB
chmod +x "$scratch/stub/lazyfork"
b_real=$b
b=$scratch/stub:$b
comp_has "counter 0a1b2c3d4e5f" lazyfork attach ''
comp_has "counter" lf-dump c
b=$b_real
if command -v zsh >/dev/null; then
  zc=$root/share/zsh/site-functions/_lazyfork
  t "zsh completion parses (zsh -n)" zsh -n "$zc"
  # The autoloaded function's body, with compadd and _files stubbed to print what they get.
  got=$(PATH="$b:$PATH" F=$zc zsh -f -c '
    compadd() { [[ $1 == -a ]] && print -rl -- ${(P)2}; }
    _files() { print FILES; }
    _lazyfork() { eval "$(<$F)" }
    words=(lazyfork daemon ""); CURRENT=3; PREFIX=""; _lazyfork | paste -sd" " -
    words=(lf-dump --); CURRENT=2; PREFIX=--; _lazyfork | paste -sd" " -' 2>&1)
  if grep -q 'clean run start status stop' <<<"$got" && grep -q -- '--exit' <<<"$got"; then
    ok "zsh completion: 'lazyfork daemon ' and 'lf-dump --' -> $(echo $got | cut -c1-80)"
  else
    bad "zsh completion: $got"
  fi
else
  t "zsh completion file (no zsh here to parse it)" test -s "$root/share/zsh/site-functions/_lazyfork"
fi

# The Python SDK.
manifest=$root/share/lazyfork/install-manifest
rec=$(grep -E '^f .*/lazyfork-[^/]*\.dist-info/RECORD$' "$manifest" | cut -d' ' -f2- || true)
if "$python" -m pip --version >/dev/null 2>&1; then
  site=$(dirname "$(dirname "$rec")")
  t "Python SDK imports from $site" env PYTHONPATH="$dest$site" "$python" -c \
    "import lazyfork.client, sys; assert lazyfork.client.__file__.startswith(sys.argv[1]), lazyfork.client.__file__" "$dest$site"
else
  t "no pip in $python: SDK skipped" test -z "$rec"
fi

# The manifest lists exactly what is there: every path under DESTDIR but the file and the
# directories this test made before install.
pre=$(p=$prefix/bin; while [ "$p" != / ]; do echo "$p"; p=$(dirname "$p"); done; echo "$prefix/bin/not-lazyfork")
listed=$(awk '{print $2}' "$manifest" | sort)
present=$(cd "$dest" && find . -mindepth 1 | sed 's|^\.||' | grep -vxF "$pre" | sort)
if [ "$listed" = "$present" ]; then
  ok "manifest lists every installed file, link and new directory ($(grep -c '^[fl] ' "$manifest") files and links, $(grep -c '^d ' "$manifest") directories)"
else
  bad "manifest differs from what is installed: only listed [$(comm -23 <(echo "$listed") <(echo "$present") | paste -sd' ' -)], only present [$(comm -13 <(echo "$listed") <(echo "$present") | paste -sd' ' -)]"
fi

make -s uninstall PREFIX="$prefix" DESTDIR="$dest"
left=$(cd "$dest" && find . -mindepth 1 | sed 's|^\.||' | sort)
want=$(printf '%s\n' "$prefix/bin/not-lazyfork" "$prefix/bin" "$prefix" | while read -r p; do while [ "$p" != / ]; do echo "$p"; p=$(dirname "$p"); done; done | sort -u)
if [ "$left" = "$want" ]; then
  ok "uninstall removed everything install put there; kept $prefix/bin/not-lazyfork and its directories"
else
  bad "after uninstall: left [$(echo $left)], expected [$(echo $want)]"
fi
rm -rf "${dest:?}"/*

# Once more with a Python that has no pip: everything else, and the SDK skipped with a message.
nopip=$(make -s install PREFIX="$prefix" DESTDIR="$dest" PYTHON=/bin/false 2>&1)
if grep -q 'skipped the Python SDK' <<<"$nopip" && [ -x "$dest$prefix/bin/lazyfork" ] && ! grep -q dist-info "$dest$prefix/share/lazyfork/install-manifest"; then
  ok "without pip: installed the rest, said: $(grep 'skipped the Python SDK' <<<"$nopip")"
else
  bad "without pip: $nopip"
fi
make -s uninstall PREFIX="$prefix" DESTDIR="$dest"
t "without pip: uninstall leaves DESTDIR empty" test -z "$(find "$dest" -mindepth 1)"

if [ "$fails" = 0 ]; then echo "test-install: PASS (PREFIX=$prefix, DESTDIR=$dest)"; else echo "test-install: FAIL ($fails)"; exit 1; fi
