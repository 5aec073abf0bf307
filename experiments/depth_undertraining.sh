#!/usr/bin/env bash
# The depth study's undertraining question (docs/depth.md): is Pre-LN's loss growing with depth at 400 updates
# the curse of depth or too few updates? The depth study's model, corpus and recipe (gpt-mini width, pydocs bytes,
# 128-byte windows, 16 a batch, lr 1e-3 cosine to 1e-4, no clipping), SEEDS seeds (default 3), two runs side by side,
# every run trained here (none restored from another machine or code), the cheapest sweeps first:
#   1. PreLN and PostLN at 4 and 16 layers, 400 updates, warm-up 40 (the study's own runs)  -> OUT/short
#   2. PreLN at 16 layers, 400 updates: lr 3e-4, 1e-3, 3e-3 with warm-up 40                  -> OUT/lr
#      and warm-up 160 at lr 1e-3                                                              -> OUT/warmup
#   3. PreLN and PostLN at 4 and 16 layers with 4x the tokens: 1,600 updates (warm-up 40)     -> OUT/long
# Every run lives in OUT/runs, keyed by its config (sweeps that need the same run share it; finished runs kept, runs
# cut short resumed), so it can be run over several sittings. Run every sitting from one checkout at one commit (a
# git worktree at a fixed commit, with PYTHONPATH pointing at it) and on one kind of machine: each sweep's header
# names the kind and every code version its runs trained with.
# Usage: experiments/depth_undertraining.sh [OUT]   (default runs/depth-long3; ~8.5 core-hours on a 2-core EPYC)
#   afterwards: experiments/collect_runs.sh OUT/short docs/results/depth-long3/short (lr, warmup, long likewise) and
#   experiments/collect_runs.sh OUT/runs docs/results/depth-long3/runs (every run's small files)
#   RECORDED=docs/results/depth-long3/runs puts runs recorded there back into OUT/runs first (scored, so not trained
#   again): a sitting on a fresh machine of the same kind goes on where the last recorded one stopped.
#   SWEEPS=long,short runs only those sweeps, in that order (default short,lr,warmup,long): the 1,600-update one
#   first where a sitting may not reach the end (docs/results/depth-long3-xeon: ~100 min wall on a 2-core Xeon).
set -euo pipefail
out=${1:-runs/depth-long3}
data=${DATA:-../shared/data/pydocs}
skiplab=${SKIPLAB:-skiplab}
common=(--model "gpt-mini(context=128)" --corpus pydocs --data-dir "$data" --tokenizer bytes --batch-size 16
        --min-lr 1e-4 --clip-norm 0 --eval-every 100 --valid-tokens 50000 --device "${DEVICE:-cpu}"
        --seeds "${SEEDS:-3}" --jobs "${JOBS:-2}")
sweep() {
    case $1 in
    short) "$skiplab" sweep lm "${common[@]}" --runs "$out/runs" --connections PreLN,PostLN --depths 4,16 --lrs 1e-3 \
               --max-steps 400 --warmup 40 --out "$out/short" ;;
    lr) "$skiplab" sweep lm "${common[@]}" --runs "$out/runs" --connections PreLN --depths 16 --lrs 3e-4,1e-3,3e-3 \
            --max-steps 400 --warmup 40 --out "$out/lr" ;;
    warmup) "$skiplab" sweep lm "${common[@]}" --runs "$out/runs" --connections PreLN --depths 16 --lrs 1e-3 \
                --max-steps 400 --warmup 160 --out "$out/warmup" ;;
    long) "$skiplab" sweep lm "${common[@]}" --runs "$out/runs" --connections PreLN,PostLN --depths 4,16 --lrs 1e-3 \
              --max-steps 1600 --warmup 40 --out "$out/long" ;;
    esac
}
known=(short lr warmup long)  # sweep()'s cases, the cheapest first: the default order
IFS=, read -ra sweeps <<< "${SWEEPS:-$(IFS=,; echo "${known[*]}")}"
for s in "${sweeps[@]}"; do  # every name checked before anything runs
    if [[ " ${known[*]} " != *" $s "* ]]; then
        echo "depth_undertraining.sh: unknown sweep '$s' in SWEEPS ($(IFS=,; echo "${known[*]}" | sed 's/,/, /g'))" >&2
        exit 2
    fi
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
"$(dirname "$0")/restore_runs.sh" "${RECORDED:-}" "$out/runs"
for s in "${sweeps[@]}"; do
    sweep "$s"
done
