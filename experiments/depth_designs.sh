#!/usr/bin/env bash
# The designs that mix or scale across depth (docs/designs.md, "Across depth"), in the pool's block design
# (experiments/pool.sh: gpt-mini, 4 layers, pydocs bytes, 600 updates, one thread a run, two side by side), on one
# kind of machine, each table its own OUT:
#   1. the new designs beside PreLN, Peri-LN and HC (Block AttnRes with S = 2 sub-layers at the pool's 4 layers)
#        -> OUT/designs
#   2. Attention Residuals' claim, compute-matched: PreLN at 1x, 1.25x and 1.5x the updates against Block AttnRes,
#      MUDD and DenseFormer at 1x; each design's effective-compute multiplier read off PreLN's three lengths
#      (compare --baseline-updates; effective.md)                                   -> OUT/compute
# Usage: experiments/depth_designs.sh [OUT] [SEEDS]   (default runs/depth-designs, 5; resumable, block by block)
#   afterwards: experiments/collect_runs.sh OUT/designs docs/results/lm/depth-designs-<kind>, likewise OUT/compute
#   Recorded: both tables, 5 blocks, on a 2-core Intel Xeon with AVX-512 kernels (docs/results/lm/depth-designs-xeon,
#   its README has the commands). On the AVX2 EPYC, block 1 of the first table (docs/results/lm/depth-designs-cpu-avx2;
#   its PreLN, PeriLN and HC are the pool's runs, same recipe and kind) can be carried on, on that kind only, with
#     RECORDED=docs/results/lm/depth-designs-cpu-avx2:docs/results/lm/pool-cpu-avx2 experiments/depth_designs.sh
set -euo pipefail
out=${1:-runs/depth-designs}
seeds=${2:-5}
here=$(dirname "$0")
DESIGNS=${DESIGNS:-PreLN,PeriLN,HC,PreLN+DenseFormer,PreLN+MUDD,PreLN+AttnRes(block=2),PreLN+AttnRes,PreLN+Scalars,LAuReL(form=lr),nGPT,Keel} \
    "$here/pool.sh" "$out/designs" "$seeds"
DESIGNS=${COMPUTE_DESIGNS:-PreLN,PreLN+AttnRes(block=2),PreLN+MUDD,PreLN+DenseFormer} \
    "$here/pool.sh" "$out/compute" "$seeds" --baseline-updates 1.25,1.5
