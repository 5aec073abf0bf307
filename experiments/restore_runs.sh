#!/usr/bin/env bash
# The inverse of collect_runs.sh: put the small files of runs recorded in RECORDED (config.json, metrics.jsonl,
# summary.json of every */seed*/ run) back into OUT, never replacing a file there, so that those runs count as
# done and are not trained again. Nothing happens when RECORDED is empty or absent.
# Usage: experiments/restore_runs.sh RECORDED OUT
set -euo pipefail
recorded=${1:-} out=$2
if [ -z "$recorded" ] || [ ! -d "$recorded" ]; then exit 0; fi
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: the copy runs inside RECORDED
(cd "$recorded" && find . -name summary.json -path '*/seed*/*' | while read -r f; do
    d=$(dirname "$f"); mkdir -p "$out/$d"; cp -n "$d"/config.json "$d"/metrics.jsonl "$d"/summary.json "$out/$d/"
done)
