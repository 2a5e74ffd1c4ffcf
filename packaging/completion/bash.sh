_lazyfork() {
  local cur=${COMP_WORDS[COMP_CWORD]} IFS=$'\n'
  COMPREPLY=($(compgen -W "$(__lazyfork_candidates "$cur" "${COMP_WORDS[@]:0:COMP_CWORD}" | sort -u)" -- "$cur"))
  [ ${#COMPREPLY[@]} -gt 0 ] || COMPREPLY=($(compgen -f -- "$cur"))
}
complete -F _lazyfork @COMMANDS@
