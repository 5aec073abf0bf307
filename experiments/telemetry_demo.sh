#!/usr/bin/env bash
# Per-step telemetry on a short run: PreLN and PostLN gpt-mini (4 layers) on pydocs at a high peak lr (3e-3, warm-up
# 20), a line of steps.jsonl every update and TensorBoard event files; the compare table (loss spikes, largest
# gradient norm) and skiplab curves with the per-update loss and gradient-norm row.
# Usage: experiments/telemetry_demo.sh OUT [DEST]    (DEST: where the small files and the figure go)
set -euo pipefail
out=$1 dest=${2:-}
skiplab compare lm --model gpt-mini --connections PreLN,PostLN --seeds 1 --corpus pydocs \
    --data-dir ../shared/data/pydocs --batch-size 8 --max-steps 300 --warmup 20 --lr 3e-3 --eval-every 100 \
    --valid-tokens 50000 --log-every 1 --logger tensorboard --out "$out"
skiplab curves "$out/PreLN/seed1" "$out/PostLN/seed1" --labels PreLN,PostLN --out "$out/telemetry.png" --overwrite
if [[ -n $dest ]]; then
    experiments/collect_runs.sh "$out" "$dest"
    cp "$out/telemetry.png" "$dest/"
    for r in PreLN PostLN; do
        cp "$out/$r/seed1/steps.jsonl" "$dest/$r/seed1/"
        mkdir -p "$dest/$r/seed1/tensorboard" && cp "$out/$r/seed1/tensorboard/"* "$dest/$r/seed1/tensorboard/"
    done
fi
