#!/usr/bin/env bash
# transformer-small on Multi30k en->de with PostLN and 2rSkip+LN: train, score test2016 (average of the
# last 5 checkpoints, beam 4), paired bootstrap between the two systems, learning curves.
# Usage: experiments/multi30k_en_de.sh [DATA_DIR] [STEPS] [OUT]    (defaults: ../shared/data/multi30k 3000 runs)
# A run that is already there is continued (--resume), so the script can be stopped and started again.
set -euo pipefail
data=${1:-../shared/data/multi30k}
steps=${2:-3000}
out=${3:-runs}
skiplab=${SKIPLAB:-skiplab}

for spec in PostLN 2rSkip+LN; do
    run="$out/m30k-$(echo "${spec%%+*}" | tr 'A-Z' 'a-z')"     # runs/m30k-postln, runs/m30k-2rskip
    if [[ -f "$run/last.pt" ]]; then
        "$skiplab" train mt --resume --out "$run" --max-steps "$steps"
    else
        "$skiplab" train mt --model transformer-small --connection "$spec" --corpus multi30k --data-dir "$data" \
            --src en --tgt de --max-steps "$steps" --warmup 800 --save-every 250 --out "$run"
    fi
    "$skiplab" eval mt --checkpoint "$run" --split test --average 5 --beam 4 | tee "$run/test.avg5.json"
done
"$skiplab" bootstrap "$data/test_2016_flickr.de.gz" "$out/m30k-postln/test.beam4.avg5.hyp" \
    "$out/m30k-2rskip/test.beam4.avg5.hyp" | tee "$out/m30k-bootstrap.json"
"$skiplab" curves "$out/m30k-postln" "$out/m30k-2rskip" --title "transformer-small, Multi30k en-de" \
    --out "$out/m30k-curves.png" --overwrite
