#!/usr/bin/env bash
# Copy what `skiplab reproduce` wrote for some tables into the repository, small files only: each table's
# table.md/csv/json and figures, and for every run a table uses its config.json, metrics.jsonl, summary.json,
# cached scores and probes, test translations and test captions (never checkpoints or data).
# Usage: experiments/repro_collect.sh OUT SCALE DEST TABLE [TABLE ...]
#   e.g. experiments/repro_collect.sh runs/repro cpu docs/results/repro 000-table1 001-table6
#   AS=NAME files them under DEST/NAME instead of DEST/SCALE: a scale's tables trained elsewhere than the machine
#   the scale is sized for say so in their folder, e.g. the LLaMA miniatures that trained on an H100:
#     AS=h100-cpu-scale experiments/repro_collect.sh runs/repro-h100 cpu docs/results/repro mixln-table1 lns-table1 peri-table1
set -euo pipefail
out=$1 scale=$2 dest=$3
shift 3
as=${AS:-$scale}
for t in "$@"; do
    mkdir -p "$dest/$as/$t"
    cp "$out/$scale/$t"/table.{md,csv,json} "$dest/$as/$t/"
    cp "$out/$scale/$t"/*.png "$dest/$as/$t/" 2>/dev/null || true
    python3 - "$out/$scale/$t/table.json" <<'PY' | while read -r run; do
import json, sys
for cell in json.load(open(sys.argv[1]))["cells"]:
    for run in cell.get("runs") or []:
        print(run)
PY
        rel=${run#"$out/$scale/"}
        for f in config.json metrics.jsonl summary.json score.*.json probe.*.json test.*.hyp test.*.captions.json; do
            for g in "$run"/$f; do
                if [[ -f "$g" ]]; then mkdir -p "$dest/$as/$rel" && cp "$g" "$dest/$as/$rel/"; fi
            done
        done
    done
done
