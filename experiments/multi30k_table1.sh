#!/usr/bin/env bash
# The depth-wise LSTM paper's Table 1 in miniature, on Multi30k en->de: transformer-small with PostLN and
# with PreLN against dwlstm-small, one seed, the same budget in updates and tokens.
#   1. the three trainings, side by side (one thread each; a run that is there is continued with --resume)
#   2. compare mt over the three: it finds the finished runs, scores test2016 with the average of the last
#      5 checkpoints and beam 4, and writes the table (BLEU, parameters, seconds per update) and curves
#   3. paired bootstrap of dwlstm-small against each Transformer
# Usage: experiments/multi30k_table1.sh [DATA_DIR] [STEPS] [OUT]   (defaults: ../shared/data/multi30k 1000 runs/table1)
set -euo pipefail
data=${1:-../shared/data/multi30k}
steps=${2:-1000}
out=${3:-runs/table1}
skiplab=${SKIPLAB:-skiplab}
models=("transformer-small(connection=PostLN)" "transformer-small(connection=PreLN)" "dwlstm-small")
common=(--corpus multi30k --data-dir "$data" --src en --tgt de --max-steps "$steps" --warmup 800 --save-every 100
        --keep-checkpoints 5 --seed 1 --device cpu)

dir() { echo "$out/$(echo "$1" | sed 's/[^A-Za-z0-9+.=_-]/_/g')/seed1"; }   # compare's layout
for m in "${models[@]}"; do
    run=$(dir "$m")
    mkdir -p "$(dirname "$run")"
    if [[ -f "$run/summary.json" ]]; then continue; fi
    if [[ -f "$run/last.pt" ]]; then args=(--resume --max-steps "$steps" --out "$run")
    else args=(--model "$m" "${common[@]}" --out "$run"); fi
    OMP_NUM_THREADS=1 "$skiplab" train mt "${args[@]}" > "$run.log" 2>&1 &
done
wait
IFS=,; "$skiplab" compare mt --models "${models[*]}" "${common[@]}" --seeds 1 --out "$out"; unset IFS
ref="$data/test_2016_flickr.de.gz"
for m in "${models[@]:0:2}"; do
    "$skiplab" bootstrap "$ref" "$(dir dwlstm-small)/test.beam4.avg5.hyp" "$(dir "$m")/test.beam4.avg5.hyp" \
        | tee "$(dirname "$(dir "$m")")/bootstrap-vs-dwlstm.json"
done
