#!/usr/bin/env bash
# make paper-tables of an older commit beside this checkout's HEAD, alternating (old, new, old, new, ...), each in a
# fresh copy of its tree with empty results/ and reports/ folders; prints user + system CPU seconds and wall seconds
# of each run and the new/old ratio per round. The last round's folders stay in WORKDIR/{old,new}/{results,reports}:
# scripts/compare-results.py compares them field by field (when the old commit is meant to give the same results).
#   usage: scripts/paper-tables-beside.sh OLD_COMMIT [ROUNDS=3] [WORKDIR=mktemp]
# Both trees run with this checkout's .venv; commit what you want measured (HEAD, not the working tree, is copied).
set -euo pipefail
old=${1:?usage: $0 OLD_COMMIT [ROUNDS] [WORKDIR]}
rounds=${2:-3}
root=$(git rev-parse --show-toplevel)
work=${3:-$(mktemp -d /tmp/paper-tables-beside.XXXXXX)}
venv=$(cd "$root/.venv" && pwd -P)
stamp=$(cd "$root" && ls .venv/.torch-* | head -1)  # make -o: never (re)install into the shared venv
for side in old new; do
    rev=$([ $side = old ] && echo "$old" || echo HEAD)
    mkdir -p "$work/$side" && git -C "$root" archive "$rev" | tar -x -C "$work/$side" && ln -sfn "$venv" "$work/$side/.venv"
done
echo "old $(git -C "$root" rev-parse --short "$old"), new $(git -C "$root" rev-parse --short HEAD), $rounds rounds, in $work"
run() {  # side -> "cpu wall"
    local dir=$work/$1
    rm -rf "$dir/results" "$dir/reports"
    mkdir -p "$dir/results" "$dir/reports"
    (cd "$dir" && PYTHONPATH=$dir /usr/bin/time -f "%U %S %e" -o "$work/$1.time" \
        make --no-print-directory -o "$stamp" paper-tables >"$work/$1.log" 2>&1) || { tail "$work/$1.log"; exit 1; }
    awk '{printf "%.1f %.1f", $1 + $2, $3}' "$work/$1.time"
}
for i in $(seq "$rounds"); do
    read -r oc ow <<<"$(run old)"; [ -n "${ow:-}" ] || exit 1
    read -r nc nw <<<"$(run new)"; [ -n "${nw:-}" ] || exit 1
    echo "round $i (load $(cut -d' ' -f1-3 /proc/loadavg)): old $oc CPU s, $ow s wall; new $nc CPU s, $nw s wall;" \
         "new/old CPU $(awk "BEGIN {printf \"%.2f\", $nc / $oc}"), wall $(awk "BEGIN {printf \"%.2f\", $nw / $ow}")"
done
