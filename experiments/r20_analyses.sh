#!/usr/bin/env bash
# The papers' looks inside trained PreAct-ResNet-20s on Fashion-MNIST: per-block gradient norms of 1xSkip,
# 2xSkip+LN and 2rSkip+LN (Fig. 3 of the rSkip+LN paper in miniature), the SAS gates per block (Fig. 3 of
# the SAS paper), the learned x : F ratio of 2rSkip+LN (Section 4.3 of the rSkip+LN paper) and activations.
# Usage: experiments/r20_analyses.sh [OUT]   (default: runs/r20-analysis; trains the runs if absent)
set -euo pipefail
out=${1:-runs/r20-analysis}
skiplab=${SKIPLAB:-skiplab}
"$skiplab" compare image --model preact-resnet20 --dataset fashion-mnist \
    --connections 1xSkip,2xSkip+LN,2rSkip+LN,SAS --seeds 1 --epochs 6 --train-subset 2000 --test-subset 2000 \
    --device cpu --out "$out"
run() { echo "$out/$1/seed1"; }
"$skiplab" analyze gradients "$(run 1xSkip)" --compare "$(run 2xSkip+LN)" "$(run 2rSkip+LN)" --examples 10000 --overwrite
"$skiplab" analyze gates "$(run SAS)" --examples 10000 --overwrite
"$skiplab" analyze ratios "$(run 2rSkip+LN)" --examples 10000 --overwrite
"$skiplab" analyze activations "$(run 2xSkip+LN)" --compare "$(run 1xSkip)" --examples 2000 --overwrite
