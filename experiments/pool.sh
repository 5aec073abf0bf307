#!/usr/bin/env bash
# The pool tables (docs/designs.md#the-designs-side-by-side): every design on one small model, corpus and recipe,
# in blocks (block k = seed k of every design, PreLN first), two runs of a block side by side, one thread each.
# gpt-mini (d 128, 4 layers, 4 heads, FFN 512, rotary, tied output) on pydocs bytes in 128-byte windows, 16 a batch,
# 600 updates (1.2M bytes), AdamW lr 1e-3, warm-up 60, cosine to 1e-4, clipping at 1.0, per-step telemetry; the final
# model's test bits per byte. A block cut short resumes where it stopped.
# One table pools blocks of one kind of machine (a CPU model with its kernel set in fp32, or a GPU model with its
# precision): compare refuses blocks of two kinds, so each kind has its own OUT and its own table.
# Usage: experiments/pool.sh [OUT] [SEEDS] [compare's own options...]  (default runs/pool-cpu, 8; SEEDS: N for
#   1..N, or A-B; e.g. --baseline-updates 1.25,1.5)
#   The CPU table, docs/results/lm/pool-cpu: blocks 1-3 trained on an AMD EPYC with AVX-512 kernels (fp32); more
#   blocks join them only from that kind of machine (>= 8 in all), e.g.
#     RECORDED=docs/results/lm/pool-cpu experiments/pool.sh runs/pool-cpu 8
#   (RECORDED puts the recorded runs' small files back into OUT first; they are not trained again); afterwards:
#     experiments/collect_runs.sh runs/pool-cpu docs/results/lm/pool-cpu
#   The H100 table at the same scale, docs/results/lm/pool-h100-cpu-scale: blocks 4-5 on an NVIDIA H100 (bf16
#   autocast, skiplab's default on CUDA), DEVICE=cuda JOBS=8 and SEEDS 4-5:
#     DEVICE=cuda JOBS=8 RECORDED=docs/results/lm/pool-h100-cpu-scale experiments/pool.sh runs/pool-h100 4-5
#   DESIGNS=... a subset (PreLN, the baseline, first). RECORDED may name several folders, separated by ':' (runs of
#   the same recipe and kind of machine recorded in another table count as done here too).
set -euo pipefail
out=${1:-runs/pool-cpu}
seeds=${2:-8}
designs=${DESIGNS:-PreLN,PostLN,PeriLN,SandwichLN,DeepNorm,Admin,MixLN,LNS,LayerScale,ReZero,PreDyT,PreDyT(alpha0=llm),HC,mHC,PreLN+ValueRes,PreLN+UNet,2rSkip+LN,SAS}
data=${DATA:-../shared/data/pydocs}
skiplab=${SKIPLAB:-skiplab}
mkdir -p "$out"
IFS=: read -ra recorded <<< "${RECORDED:-}"  # one folder, or several separated by ':'
for r in "${recorded[@]}"; do "$(dirname "$0")/restore_runs.sh" "$r" "$out"; done
"$skiplab" compare lm --model "gpt-mini(context=128)" --corpus pydocs --data-dir "$data" --tokenizer bytes \
    --batch-size 16 --max-steps "${STEPS:-600}" --warmup 60 --lr 1e-3 --min-lr 1e-4 --eval-every 100 \
    --valid-tokens 50000 --device "${DEVICE:-cpu}" --connections "$designs" --seeds "$seeds" --jobs "${JOBS:-2}" \
    --out "$out" "${@:3}"
