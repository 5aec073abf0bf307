#!/usr/bin/env bash
# gpt-small on pydocs (UTF-8 bytes), every design with the same steps, tokens and seeds (1 and 2): the four designs
# of the papers (PreLN, PostLN, 2rSkip+LN, SAS) and the modern ones (DeepNorm, PeriLN, MixLN, LNS, HC(n=4), mHC(n=4))
# (docs/language-models.md and docs/designs.md, Results). The two seeds of a design train side by side, one thread
# each; a finished run is kept, one cut short resumes; then `compare lm` scores the test split and writes the table
# (test bits per byte, mean ± std, Welch p against the first design) and the curves of the designs given.
# Usage: experiments/lm_pydocs.sh [DESIGNS] [OUT]   (default: the ten designs above, runs/lm-pydocs)
#   RECORDED=docs/results/lm/pydocs puts the small files of runs recorded there (config, metrics, summary) back
#   into OUT first, so that their designs are not trained again and join the table; after a call, copy OUT's
#   small files there with: experiments/collect_runs.sh OUT docs/results/lm/pydocs
set -euo pipefail
designs=${1:-PreLN,PostLN,2rSkip+LN,SAS,DeepNorm,PeriLN,MixLN,LNS,HC,mHC}
out=${2:-runs/lm-pydocs}
data=${DATA:-../shared/data/pydocs}
skiplab=${SKIPLAB:-skiplab}
common=(--model gpt-small --corpus pydocs --data-dir "$data" --tokenizer bytes --batch-size 16
        --max-steps "${STEPS:-1200}" --warmup 100 --lr 1e-3 --min-lr 1e-4 --eval-every 100 --valid-tokens 100000
        --device cpu)
mkdir -p "$out"
out=$(cd "$out" && pwd)
"$(dirname "$0")/restore_runs.sh" "${RECORDED:-}" "$out"
train() {  # DESIGN SEED
    local dir="$out/$1/seed$2"
    if [ -f "$dir/summary.json" ]; then return 0; fi
    if [ -f "$dir/last.pt" ]; then
        OMP_NUM_THREADS=1 "$skiplab" train lm --resume --out "$dir"
    else
        OMP_NUM_THREADS=1 "$skiplab" train lm "${common[@]}" --connection "$1" --seed "$2" --out "$dir"
    fi
}
for d in ${designs//,/ }; do
    train "$d" 1 >> "$out/$d.seed1.log" 2>&1 &
    train "$d" 2 >> "$out/$d.seed2.log" 2>&1 &
    wait
done
"$skiplab" compare lm "${common[@]}" --connections "$designs" --seeds 2 --out "$out"
