#!/usr/bin/env bash
# Why PreDyT stalls at the unigram level in the pool (docs/designs.md, "Failures, not findings"): seed 1 of the
# pool's PreDyT(alpha0=llm) and PreDyT (alpha0 0.5) runs, trained again with a checkpoint every 10 updates, and
# PreDyT(alpha0=0.1) beside them (a smaller alpha keeps alpha*x inside tanh's linear range for a larger stream), and
# PreDyT(alpha0=llm) at a peak lr of 3e-4 instead of 1e-3 (slower growth of the weights in the warm-up);
# then `skiplab analyze saturation` reads every checkpoint: the share of each DyT layer's inputs with |alpha*x| > 2
# and the mean tanh'(alpha*x). The recipe is the pool's (experiments/pool.sh); evaluating every 10 updates on
# 10,000 validation tokens does not change the training (the weights at update 200 equal the pool run's, bit for bit).
# Usage: experiments/dyt_stall.sh [OUT] [DEST]   (default runs/dyt-stall, docs/results/lm/dyt-stall); ~5 min a run on
#   one core of a 2-core CPU; a run cut short resumes.
set -euo pipefail
out=${1:-runs/dyt-stall}
dest=${2:-docs/results/lm/dyt-stall}
data=${DATA:-../shared/data/pydocs}
skiplab=${SKIPLAB:-skiplab}
mkdir -p "$out"
if [[ ! -d "$out/prepared" ]]; then
    "$skiplab" prepare lm --corpus pydocs --data-dir "$data" --tokenizer bytes --out "$out/prepared"
fi
names=()
for run in "PreDyT(alpha0=llm)|1e-3" "PreDyT|1e-3" "PreDyT(alpha0=0.1)|1e-3" "PreDyT(alpha0=llm)|3e-4"; do
    spec=${run%|*} lr=${run#*|}
    name=$(echo "$spec" | tr -c 'A-Za-z0-9.=\n' '_')
    if [[ $lr != 1e-3 ]]; then name="${name}lr$lr"; fi
    names+=("$name")
    resume=()
    if [[ -f "$out/$name/last.pt" ]]; then resume=(--resume); fi
    if [[ ! -f "$out/$name/summary.json" ]]; then
        "$skiplab" train lm --model "gpt-mini(context=128,connection=$spec)" --corpus pydocs --data-dir "$out/prepared" \
            --tokenizer bytes --batch-size 16 --max-steps 600 --warmup 60 --lr "$lr" --min-lr 1e-4 --eval-every 10 \
            --valid-tokens 10000 --keep-checkpoints 60 --seed 1 --out "$out/$name" "${resume[@]}"
    fi
done
rest=("${names[@]:1}")
"$skiplab" analyze saturation "$out/${names[0]}" --compare "${rest[@]/#/$out/}" --examples 50 --overwrite
for name in "${names[@]}"; do
    mkdir -p "$dest/$name"
    cp "$out/$name"/{config.json,metrics.jsonl,summary.json} "$dest/$name/"
    cp "$out/$name"/analysis/saturation.{json,md,png} "$dest/$name/"
done
cp "$out/${names[0]}/analysis/saturation_compare.png" "$dest/saturation.png"
