local -a cands
cands=(${(f)"$(__lazyfork_candidates "$PREFIX" "${(@)words[1,CURRENT-1]}" | sort -u)"})
if (( ${#cands} )); then compadd -a cands; else _files; fi
