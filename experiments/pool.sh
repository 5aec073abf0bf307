#!/usr/bin/env bash
# The pool table (docs/designs.md#the-designs-side-by-side): every design on one small model, corpus and recipe,
# in blocks (block k = seed k of every design, PreLN first, each block on one machine), two runs of a block side by
# side, one thread each. gpt-mini (d 128, 4 layers, 4 heads, FFN 512, rotary, tied output) on pydocs bytes in
# 128-byte windows, 16 a batch, 600 updates (1.2M bytes), AdamW lr 1e-3, warm-up 60, cosine to 1e-4, clipping at
# 1.0, per-step telemetry; the final model's test bits per byte. A block cut short resumes where it stopped.
# Usage: experiments/pool.sh [OUT] [SEEDS]      (default runs/pool, 5)
#   RECORDED=docs/results/lm/pool puts the recorded runs' small files back into OUT first (they are not trained
#   again); afterwards: experiments/collect_runs.sh OUT docs/results/lm/pool
#   DESIGNS=... a subset (PreLN, the baseline, first); DEVICE=cuda and JOBS=N train a block on a GPU, N runs side by
#   side (bf16 autocast, skiplab's default on CUDA; the block's PreLN is trained there too)
set -euo pipefail
out=${1:-runs/pool}
seeds=${2:-5}
designs=${DESIGNS:-PreLN,PostLN,PeriLN,SandwichLN,DeepNorm,Admin,MixLN,LNS,LayerScale,ReZero,PreDyT,HC,mHC,PreLN+ValueRes,PreLN+UNet,2rSkip+LN,SAS}
data=${DATA:-../shared/data/pydocs}
skiplab=${SKIPLAB:-skiplab}
mkdir -p "$out"
"$(dirname "$0")/restore_runs.sh" "${RECORDED:-}" "$out"
"$skiplab" compare lm --model "gpt-mini(context=128)" --corpus pydocs --data-dir "$data" --tokenizer bytes \
    --batch-size 16 --max-steps "${STEPS:-600}" --warmup 60 --lr 1e-3 --min-lr 1e-4 --eval-every 100 \
    --valid-tokens 50000 --device "${DEVICE:-cpu}" --connections "$designs" --seeds "$seeds" --jobs "${JOBS:-2}" \
    --out "$out"
