# Completion candidates for lazyfork, lfork and the lf-* stages, read from kong's `--help` of
# the command line typed so far, so they follow the installed binary (commands, subcommands,
# aliases, flags; container names where the command takes a <container>). Shared by the bash
# and zsh completions that `make install` writes; bash and zsh syntax.
__lazyfork_candidates() { # $1: the word being completed; $2: the program; $3...: the words between
  local cur=$1 prog=$2 w skip= help typed cmds
  local -a lfw
  lfw=()
  shift 2
  for w in "$@"; do
    if [ -n "$skip" ]; then skip=; continue; fi
    case $w in
      =) skip=1 ;;            # bash splits --flag=value at '='
      -*) ;;
      *) lfw+=("$w") ;;
    esac
  done
  help=$("$prog" "${lfw[@]}" --help 2>/dev/null) || true
  case $cur in
    -*)
      printf '%s\n' "$help" | awk '
        /^Flags:/ { sec = 1; next }
        /^[^ ]/ { sec = 0; next }
        sec && match($0, /^  -[a-zA-Z], --[a-zA-Z0-9-]+/) {
          s = substr($0, RSTART + 2, RLENGTH - 2); split(s, p, ", "); print p[1]; print p[2]; next }
        sec && match($0, /^      --[a-zA-Z0-9-]+/) { print substr($0, RSTART + 6, RLENGTH - 6) }'
      ;;
    *)
      typed="${lfw[*]}"
      cmds=$(printf '%s\n' "$help" | awk -v typed="$typed" '
        /^Commands:/ { sec = 1; next }
        /^[^ ]/ { sec = 0; next }
        sec && /^  [a-z]/ {
          n = 0; alias = ""
          for (i = 1; i <= NF; i++) {
            if ($i ~ /^\(/) { alias = $i; gsub(/[()]/, "", alias); break }
            if ($i ~ /^[<\[]/) break
            w[++n] = $i
          }
          m = split(typed, t, " ")
          if (n <= m) next
          for (i = 1; i <= m; i++) if (w[i] != t[i]) next
          print w[m + 1]
          if (alias != "" && n == m + 1) { k = split(alias, a, ","); for (j = 1; j <= k; j++) print a[j] }
        }')
      if [ -n "$cmds" ]; then
        printf '%s\n' "$cmds"
      elif printf '%s\n' "$help" | grep -q '^Usage: .*<container'; then
        # `lazyfork list`: a header, a rule, a row per container (id, name, ...), a total.
        lazyfork list 2>/dev/null | sed '1,2d;$d' | awk 'NF > 1 { print $2; print $1 }'
      fi
      ;;
  esac
}
