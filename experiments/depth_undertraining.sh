#!/usr/bin/env bash
# The depth study's undertraining question (docs/depth.md): is Pre-LN's loss growing with depth at 400 updates
# the curse of depth or too few updates? The depth study's model, corpus and recipe (gpt-mini width, pydocs bytes,
# 128-byte windows, 16 a batch, lr 1e-3 cosine to 1e-4, no clipping), seeds 1 and 2, two runs side by side:
#   1. PreLN and PostLN at 4 and 16 layers with 4x the tokens: 1,600 updates (warm-up 40 as before) -> OUT/long
#   2. PreLN at 16 layers, 400 updates: lr 3e-4, 1e-3, 3e-3 with warm-up 40 -> OUT/lr, and warm-up 160 at lr 1e-3
#      -> OUT/warmup (lr 1e-3 with warm-up 40 is the depth study's own run)
# Every run lives in OUT/runs (finished runs kept, runs cut short resumed), so it can be run over several sittings.
# Usage: experiments/depth_undertraining.sh [OUT]   (default runs/depth-long)
#   RECORDED=docs/results/depth puts the depth study's recorded runs back first (its lr-1e-3 runs are not trained
#   again); afterwards: experiments/collect_new_runs.sh OUT/runs docs/results/depth-long/runs docs/results/depth/runs
#   and experiments/collect_runs.sh OUT/long docs/results/depth-long/long (OUT/lr, OUT/warmup likewise)
set -euo pipefail
out=${1:-runs/depth-long}
data=${DATA:-../shared/data/pydocs}
skiplab=${SKIPLAB:-skiplab}
common=(--model "gpt-mini(context=128)" --corpus pydocs --data-dir "$data" --tokenizer bytes --batch-size 16
        --min-lr 1e-4 --clip-norm 0 --eval-every 100 --valid-tokens 50000 --device cpu --seeds 2 --jobs 2)
mkdir -p "$out"
out=$(cd "$out" && pwd)
"$(dirname "$0")/restore_runs.sh" "${RECORDED:-}" "$out"
"$skiplab" sweep lm "${common[@]}" --runs "$out/runs" --connections PreLN,PostLN --depths 4,16 --lrs 1e-3 \
    --max-steps 1600 --warmup 40 --out "$out/long"
"$skiplab" sweep lm "${common[@]}" --runs "$out/runs" --connections PreLN --depths 16 --lrs 3e-4,1e-3,3e-3 \
    --max-steps 400 --warmup 40 --out "$out/lr"
"$skiplab" sweep lm "${common[@]}" --runs "$out/runs" --connections PreLN --depths 16 --lrs 1e-3 \
    --max-steps 400 --warmup 160 --out "$out/warmup"
