#!/usr/bin/env bash
# The inverse of collect_runs.sh: put the small files of runs recorded in RECORDED (config.json, metrics.jsonl,
# summary.json of every */seed*/ run) back into OUT, never replacing a file there, so that those runs count as
# done and are not trained again. Nothing happens when RECORDED is empty or absent. A run OUT holds cut short (its
# config.json without summary.json) that the record holds finished is refused (one line, nothing copied): the two
# would make one run of two halves.
# Usage: experiments/restore_runs.sh RECORDED OUT
set -euo pipefail
if [ $# -ne 2 ]; then echo "usage: experiments/restore_runs.sh RECORDED OUT" >&2; exit 2; fi
recorded=${1:-} out=$2
if [ -z "$recorded" ] || [ ! -d "$recorded" ]; then exit 0; fi
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: the copy runs inside RECORDED
runs=()
while IFS= read -r f; do runs+=("$(dirname "$f")"); done < <(cd "$recorded" && find . -name summary.json -path '*/seed*/*' | sort)
for d in ${runs[@]+"${runs[@]}"}; do  # checked before anything is copied
    if [ -f "$out/$d/config.json" ] && [ ! -f "$out/$d/summary.json" ]; then
        echo "restore_runs.sh: $out/${d#./} holds a run cut short that $recorded records finished: move one aside" >&2
        exit 2
    fi
done
for d in ${runs[@]+"${runs[@]}"}; do
    mkdir -p "$out/$d"
    (cd "$recorded" && cp -n "$d"/config.json "$d"/metrics.jsonl "$d"/summary.json "$out/$d/")
done
