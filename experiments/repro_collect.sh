#!/usr/bin/env bash
# Copy what `skiplab reproduce` wrote for some tables into the repository, small files only: each table's
# table.md/csv/json and figures, and for every run a table uses its config.json, metrics.jsonl, summary.json,
# cached scores and probes, test translations and test captions (never checkpoints or data).
# Usage: experiments/repro_collect.sh OUT SCALE DEST TABLE [TABLE ...]
#   e.g. experiments/repro_collect.sh runs/repro cpu docs/results/repro 000-table1 001-table6
set -euo pipefail
out=$1 scale=$2 dest=$3
shift 3
for t in "$@"; do
    mkdir -p "$dest/$scale/$t"
    cp "$out/$scale/$t"/table.{md,csv,json} "$dest/$scale/$t/"
    cp "$out/$scale/$t"/*.png "$dest/$scale/$t/" 2>/dev/null || true
    python3 - "$out/$scale/$t/table.json" <<'PY' | while read -r run; do
import json, sys
for cell in json.load(open(sys.argv[1]))["cells"]:
    for run in cell.get("runs") or []:
        print(run)
PY
        rel=${run#"$out/$scale/"}
        for f in config.json metrics.jsonl summary.json score.*.json probe.*.json test.*.hyp test.*.captions.json; do
            for g in "$run"/$f; do
                if [[ -f "$g" ]]; then mkdir -p "$dest/$scale/$rel" && cp "$g" "$dest/$scale/$rel/"; fi
            done
        done
    done
done
