#!/usr/bin/env bash
# Copy the small files (config.json, metrics.jsonl, summary.json, steps.jsonl) of the finished runs under RUNS
# into DEST, leaving out those already recorded under RECORDED (runs restore_runs.sh put back): what a sitting
# trained, and nothing twice. Never checkpoints or data.
# Usage: experiments/collect_new_runs.sh RUNS DEST [RECORDED]
#   e.g. experiments/collect_new_runs.sh runs/depth-long/runs docs/results/depth-long/runs docs/results/depth/runs
set -euo pipefail
if [ $# -lt 2 ]; then echo "usage: experiments/collect_new_runs.sh RUNS DEST [RECORDED]" >&2; exit 2; fi
runs=$1 dest=$2 recorded=${3:-}
if [ ! -d "$runs" ]; then echo "collect_new_runs.sh: $runs: no such folder" >&2; exit 2; fi
(cd "$runs" && find . -name summary.json -path '*/seed*/*') | while read -r f; do
    d=$(dirname "$f")
    if [[ -n "$recorded" && -e "$recorded/$d" ]]; then continue; fi
    mkdir -p "$dest/$d"
    for g in config.json metrics.jsonl summary.json steps.jsonl; do
        if [[ -f "$runs/$d/$g" ]]; then cp "$runs/$d/$g" "$dest/$d/"; fi
    done
done
