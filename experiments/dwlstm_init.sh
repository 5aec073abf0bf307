#!/usr/bin/env bash
# The depth-wise LSTM's initialisation question (003 Table 1 at cpu scale; docs/reproducing.md): the Multi30k
# miniature of reproduce's cpu scale (1,000 updates of 4,096 tokens, warm-up 800, test2016), four more runs of two
# seeds each, trained two at a time, one thread each (a run cut short resumes, a finished one is kept):
#   control    transformer-small(connection=PreLN,init=lipschitz), the miniature's schedule (inverse_sqrt, peak 5e-4):
#              does the pre-norm Transformer with the authors' initialisation also train slowly?
#   vaswani    dwlstm-small (the authors' initialisation) with --schedule vaswani: lr = d^-0.5 min(s^-0.5, s w^-1.5),
#              the schedule of the authors' toolkit (and of Vaswani et al.), peak 2.2e-3 at d 256, w 800
#   xvaswani   transformer-small(connection=PreLN) (Xavier) with --schedule vaswani: the baseline under that schedule
# Then each run's test2016 score: the average of its last 5 checkpoints, beam 4 (reproduce's 003 Table 1 scoring), and
# its last checkpoint alone (score.test.beam4.last.json), and
# OUT/table.md beside the recorded 003 Table 1 runs (experiments/dwlstm_init_table.py; paired bootstrap against PreLN).
# Usage: experiments/dwlstm_init.sh [OUT] [GROUPS]   (default runs/dwlstm-init, "vaswani control xvaswani")
set -euo pipefail
out=${1:-runs/dwlstm-init}
groups=${2:-vaswani control xvaswani}
data=${DATA:-../shared/data/multi30k}
skiplab=${SKIPLAB:-skiplab}
common=(--corpus multi30k --data-dir "$data" --src en --tgt de --vocab-size 8000 --max-tokens 4096 --max-steps 1000
        --warmup 800 --save-every 100 --keep-checkpoints 10 --device cpu)
declare -A args=(
    [control]="--model transformer-small(connection=PreLN,init=lipschitz) --schedule inverse_sqrt --lr 5e-4"
    [vaswani]="--model dwlstm-small --schedule vaswani"
    [xvaswani]="--model transformer-small(connection=PreLN) --schedule vaswani"
)
mkdir -p "$out"
train() {  # GROUP SEED
    local dir="$out/$1/seed$2"
    if [ ! -f "$dir/summary.json" ]; then
        if [ -f "$dir/last.pt" ]; then
            OMP_NUM_THREADS=1 "$skiplab" train mt --resume --out "$dir"
        else
            # shellcheck disable=SC2086
            OMP_NUM_THREADS=1 "$skiplab" train mt "${common[@]}" ${args[$1]} --seed "$2" --out "$dir"
        fi
    fi
    if [ ! -f "$dir/score.test.beam4.avg5.json" ]; then
        OMP_NUM_THREADS=1 "$skiplab" eval mt --checkpoint "$dir" --average 5 --beam 4 --device cpu > "$dir/score.tmp"
        mv "$dir/score.tmp" "$dir/score.test.beam4.avg5.json"
    fi
    if [ ! -f "$dir/score.test.beam4.last.json" ]; then  # the last checkpoint alone, beside the average
        OMP_NUM_THREADS=1 "$skiplab" eval mt --checkpoint "$dir" --beam 4 --device cpu > "$dir/score.tmp"
        mv "$dir/score.tmp" "$dir/score.test.beam4.last.json"
    fi
}
for seed in 1 2; do
    for g in $groups; do
        train "$g" "$seed" > "$out/$g.seed$seed.log" 2>&1 &
        if [ "$(jobs -rp | wc -l)" -ge 2 ]; then wait -n; fi
    done
done
wait
"${PYTHON:-python}" "$(dirname "$0")/dwlstm_init_table.py" "$out"
