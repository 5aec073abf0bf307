#!/usr/bin/env bash
# Copy the small files of a comparison or sweep into the repository: its table.md/csv, compare.json (a sweep's
# sweep.md/csv/json) and figures,
# and for every run its config.json, metrics.jsonl and summary.json (never checkpoints, tokenizers or data).
# Usage: experiments/collect_runs.sh OUT DEST      e.g. experiments/collect_runs.sh runs/lm-pydocs docs/results/lm/pydocs
set -euo pipefail
if [ $# -ne 2 ]; then echo "usage: experiments/collect_runs.sh OUT DEST" >&2; exit 2; fi
out=$1 dest=$2
if [ ! -d "$out" ]; then echo "collect_runs.sh: $out: no such folder" >&2; exit 2; fi
mkdir -p "$dest"
for f in "$out"/table.md "$out"/table.csv "$out"/compare.json "$out"/sweep.md "$out"/sweep.csv "$out"/sweep.json "$out"/*.png; do
    if [[ -f "$f" ]]; then cp "$f" "$dest/"; fi
done
(cd "$out" && find . -name summary.json -path '*/seed*/*') | while read -r f; do
    d=$(dirname "$f")
    mkdir -p "$dest/$d"
    for g in config.json metrics.jsonl summary.json; do
        if [[ -f "$out/$d/$g" ]]; then cp "$out/$d/$g" "$dest/$d/"; fi
    done
done
