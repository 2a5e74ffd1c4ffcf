#!/usr/bin/env bash
# `make install` / `make uninstall`. Environment (the Makefile passes them):
#   PREFIX (/usr/local), DESTDIR (empty), BIN (the built binaries, ./bin), PYTHON (python3),
#   SYSTEMDUNITDIR ($PREFIX/lib/systemd/system), STAGES (the Makefile's list).
#
# install puts in $DESTDIR$PREFIX:
#   bin/lazyfork, bin/lfork -> lazyfork, bin/lazyfork-engine (lazyfork hands it what no daemon serves), bin/lazyfork-helper (lazyfork exec starts it),
#   bin/lf-* (the stage binaries that were built)
#   $SYSTEMDUNITDIR/lazyfork.service             (`lazyfork daemon run`)
#   share/bash-completion/completions/lazyfork   (+ lfork, lf-* -> lazyfork, for bash-completion's loader)
#   share/zsh/site-functions/_lazyfork
#   the Python SDK (./python) with `$PYTHON -m pip install`, if that pip exists, into that
#     Python's site directory under $PREFIX
#   share/lazyfork/install-manifest               every file, link and directory it created
# uninstall removes exactly what the manifest lists: the files and links, then the
# directories install created, if they are empty.
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
BIN=${BIN:-$PWD/bin}
PYTHON=${PYTHON:-python3}
SYSTEMDUNITDIR=${SYSTEMDUNITDIR:-$PREFIX/lib/systemd/system}
# The stage binaries: the Makefile passes its STAGES; those that were built are installed.
STAGES=${STAGES:-lf-dump lf-memfile lf-restore lf-overlay lf-cgroup lf-tree}
case $PREFIX in /*) ;; *) echo "install: PREFIX must be an absolute path, not $PREFIX" >&2; exit 1 ;; esac
PREFIX=$(realpath -m -s "$PREFIX")
SYSTEMDUNITDIR=$(realpath -m -s "$SYSTEMDUNITDIR")
[ -z "$DESTDIR" ] || DESTDIR=$(realpath -m -s "$DESTDIR")
[ "$DESTDIR" != / ] || DESTDIR=
manifest=$PREFIX/share/lazyfork/install-manifest # as installed; on disk at $DESTDIR$manifest
say() { echo "$1: $2" >&2; }

declare -A seen=()
built=()
entries=() # "f PATH", "l PATH", "d PATH"; PATH without $DESTDIR
note() { [ -n "${seen[$1]:-}" ] || { seen[$1]=1; entries+=("$1"); }; }
mkdirs() { # mkdir -p that notes each directory it creates
  local d=$1 missing=()
  while [ ! -d "$DESTDIR$d" ]; do missing=("$d" "${missing[@]}"); d=$(dirname "$d"); done
  for d in "${missing[@]}"; do mkdir -m 755 "$DESTDIR$d"; note "d $d"; done
}
put() { # mode source dest
  mkdirs "$(dirname "$3")"
  install -m "$1" "$2" "$DESTDIR$3.lf-new"
  mv -f "$DESTDIR$3.lf-new" "$DESTDIR$3"
  note "f $3"
}
link() { # target dest
  mkdirs "$(dirname "$2")"
  ln -sfn "$1" "$DESTDIR$2"
  note "l $2"
}

do_install() {
  [ -x "$BIN/lazyfork" ] || { say install "no $BIN/lazyfork: run make build first"; exit 1; }
  # A previous install's entries stay listed (its directories were created by it).
  if [ -f "$DESTDIR$manifest" ]; then
    while IFS= read -r e; do note "$e"; done <"$DESTDIR$manifest"
  fi
  local bindir=$PREFIX/bin s n=0
  [ -x "$BIN/lazyfork-engine" ] || { say install "no $BIN/lazyfork-engine (lazyfork runs what no daemon serves with it): run make build first"; exit 1; }
  [ -x "$BIN/lazyfork-helper" ] || { say install "no $BIN/lazyfork-helper (lazyfork exec starts it): run make build first"; exit 1; }
  put 755 "$BIN/lazyfork" "$bindir/lazyfork"
  put 755 "$BIN/lazyfork-engine" "$bindir/lazyfork-engine" # found next to lazyfork
  put 755 "$BIN/lazyfork-helper" "$bindir/lazyfork-helper" # found next to lazyfork
  link lazyfork "$bindir/lfork"
  built=()
  for s in $STAGES; do
    if [ -x "$BIN/$s" ]; then put 755 "$BIN/$s" "$bindir/$s"; built+=("$s"); n=$((n + 1)); fi
  done
  say install "lazyfork, lfork, lazyfork-engine, lazyfork-helper and $n stage binaries in $DESTDIR$bindir"

  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  sed "s|@BINDIR@|$bindir|g" packaging/lazyfork.service.in >"$tmp/lazyfork.service"
  put 644 "$tmp/lazyfork.service" "$SYSTEMDUNITDIR/lazyfork.service"
  say install "systemd unit $DESTDIR$SYSTEMDUNITDIR/lazyfork.service (systemctl daemon-reload && systemctl enable --now lazyfork)"

  { echo "# bash completion for lazyfork, lfork and the lf-* stages (LazyFork's make install)"
    cat packaging/completion/engine.sh
    sed "s|@COMMANDS@|lazyfork lfork ${built[*]}|" packaging/completion/bash.sh; } >"$tmp/lazyfork.bash"
  { echo "#compdef lazyfork lfork ${built[*]}"
    echo "# zsh completion for lazyfork, lfork and the lf-* stages (LazyFork's make install)"
    cat packaging/completion/engine.sh packaging/completion/zsh.sh; } >"$tmp/_lazyfork"
  local bc=$PREFIX/share/bash-completion/completions
  put 644 "$tmp/lazyfork.bash" "$bc/lazyfork"
  for s in lfork "${built[@]}"; do link lazyfork "$bc/$s"; done
  put 644 "$tmp/_lazyfork" "$PREFIX/share/zsh/site-functions/_lazyfork"
  say install "bash and zsh completion in $DESTDIR$bc and $DESTDIR$PREFIX/share/zsh/site-functions"

  if "$PYTHON" -m pip --version >/dev/null 2>&1; then
    local before=$tmp/dirs-before rec sp f d site onpath
    # The Python's own site directory under $PREFIX (Debian's python3: /usr/local/lib/python3.X/
    # dist-packages), else its posix_prefix one. Not `pip install --prefix`: on Debian's python3
    # that lands in $PREFIX/local/lib/python3.X/dist-packages, which is on no sys.path.
    site=$("$PYTHON" - "$PREFIX" <<'PY'
import site, sys, sysconfig
p = sys.argv[1].rstrip("/")
for d in site.getsitepackages():
    if d.startswith(p + "/lib/"):
        print(d)
        break
else:
    print(sysconfig.get_path("purelib", "posix_prefix", {"base": p, "platbase": p}))
PY
)
    onpath=$("$PYTHON" -c 'import sys; print(sys.argv[1] in sys.path)' "$site")
    (cd "$DESTDIR$PREFIX" 2>/dev/null && find . -type d 2>/dev/null | sed "s|^\.|$PREFIX|") | sort >"$before" || true
    # The SDK's in-tree build backend needs nothing from an index (offline).
    "$PYTHON" -m pip install -q --no-deps --no-index --no-build-isolation --disable-pip-version-check \
      --root-user-action=ignore --upgrade --target "$DESTDIR$site" ./python >&2
    rec=$(find "$DESTDIR$site" -maxdepth 2 -path '*/lazyfork-*.dist-info/RECORD' | head -1)
    [ -n "$rec" ] || { say install "pip ran but left no lazyfork-*.dist-info/RECORD in $DESTDIR$site"; exit 1; }
    sp=$(dirname "$(dirname "$rec")")
    while IFS=, read -r f _; do
      [ -n "$f" ] || continue
      f=$(realpath -m -s "$sp/$f")
      f=${f#"$DESTDIR"}
      note "f $f"
      d=$(dirname "$f")
      while [ "$d" != "$PREFIX" ] && [ "$d" != / ] && ! grep -qxF "$d" "$before"; do
        note "d $d"
        d=$(dirname "$d")
      done
    done <"$rec"
    say install "Python SDK (lazyfork $(awk -F' ' '/^Version:/{print $2}' "$(dirname "$rec")/METADATA")) in $DESTDIR$site"
    [ "$onpath" = True ] || say install "note: $site is not on $PYTHON's sys.path: add it to PYTHONPATH"
  else
    say install "skipped the Python SDK: $PYTHON has no pip (install it, or: pip install ./python)"
  fi

  mkdirs "$(dirname "$manifest")"
  note "f $manifest"
  printf '%s\n' "${entries[@]}" >"$DESTDIR$manifest.lf-new"
  mv -f "$DESTDIR$manifest.lf-new" "$DESTDIR$manifest"
  say install "$(grep -c '^[fl] ' "$DESTDIR$manifest") files and links, $(grep -c '^d ' "$DESTDIR$manifest") new directories; manifest $DESTDIR$manifest"
}

do_uninstall() {
  [ -f "$DESTDIR$manifest" ] || { say uninstall "nothing to do: no $DESTDIR$manifest"; exit 0; }
  local kind p files=0 dirs=0 kept=() list
  list=$(cat "$DESTDIR$manifest") # it lists itself
  while read -r kind p; do
    case $kind in
      f | l)
        case $p in "$PREFIX"/*) ;; *) say uninstall "skipping $p: outside $PREFIX"; continue ;; esac
        if [ -e "$DESTDIR$p" ] || [ -L "$DESTDIR$p" ]; then rm -f "$DESTDIR$p"; files=$((files + 1)); fi
        ;;
    esac
  done <<<"$list"
  # Directories, deepest first, only if install created them and they are now empty.
  while read -r p; do
    [ -d "$DESTDIR$p" ] || continue
    if rmdir "$DESTDIR$p" 2>/dev/null; then dirs=$((dirs + 1)); else kept+=("$p"); fi
  done < <(awk '$1 == "d" {print length($2) " " $2}' <<<"$list" | sort -rn | cut -d' ' -f2-)
  say uninstall "removed $files files and links, $dirs directories from $DESTDIR$PREFIX"
  [ ${#kept[@]} -eq 0 ] || say uninstall "kept (not empty, holding files install did not put there): ${kept[*]}"
}

case ${1:-} in
  install) do_install ;;
  uninstall) do_uninstall ;;
  *) echo "usage: $0 install|uninstall" >&2; exit 2 ;;
esac
