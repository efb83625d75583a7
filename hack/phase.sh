#!/usr/bin/env bash
# The wall time of each phase of `make demo` and `make test`, so every run's log shows where the time went.
#   hack/phase.sh NAME CMD...   runs CMD; appends NAME, its start (seconds since the epoch), its duration and
#                               its exit code to $DTJOB_PHASE_LOG (nothing is written when that is unset)
#   hack/phase.sh report        prints the phases logged so far, in the order they started, with the
#                               offset of each from the first (phases built side by side overlap)
set -euo pipefail
log=${DTJOB_PHASE_LOG:-}

if [[ ${1:-} == report ]]; then
  [[ -n $log && -s $log ]] || exit 0
  sort -n -k2,2 "$log" | awk '
    NR == 1 { first = $2 }
    { end = $2 + $3; if (end > last) last = end
      printf "  %-22s +%5.1f min  %6.1f min%s\n", $1, ($2 - first) / 60, $3 / 60, ($4 == 0 ? "" : "  (failed: exit " $4 ")") }
    END { printf "  %-22s          %6.1f min wall\n", "total", (last - first) / 60 }' |
    { echo "[phases] name, start, duration:"; cat; }
  exit 0
fi

name=${1:?usage: $0 NAME CMD... | report}
shift
[[ $# -gt 0 ]] || { echo "usage: $0 NAME CMD..." >&2; exit 2; }
[[ -n $log ]] || exec "$@"
mkdir -p "$(dirname "$log")"
start=$(date +%s)
rc=0
"$@" || rc=$?
printf '%s %s %s %s\n' "$name" "$start" "$(($(date +%s) - start))" "$rc" >> "$log"
exit "$rc"
