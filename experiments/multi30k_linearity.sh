#!/usr/bin/env bash
# The layer non-linearity probe (Tables 6-7 of the depth-wise LSTM paper in miniature) on the Multi30k runs of
# experiments/multi30k_table1.sh: each layer of the averaged (last 5 checkpoints) PostLN Transformer and
# depth-wise LSTM model in turn replaced by a linear map (least-squares start, then STEPS updates on the
# task loss), test2016 BLEU with beam 4. The two models are probed side by side, one thread each.
# Usage: experiments/multi30k_linearity.sh [RUNS] [STEPS]   (defaults: runs/table1 50)
set -euo pipefail
runs=${1:-runs/table1}
steps=${2:-50}
skiplab=${SKIPLAB:-skiplab}
for run in "$runs/transformer-small_connection=PostLN_/seed1" "$runs/dwlstm-small/seed1"; do
    [[ -f "$run/avg5.pt" ]] || "$skiplab" average --checkpoint "$run" --last 5 --out "$run/avg5.pt"
    OMP_NUM_THREADS=1 "$skiplab" analyze linearity "$run/avg5.pt" --steps "$steps" --overwrite \
        --layers encoder.0,encoder.1,encoder.2,decoder.0,decoder.1,decoder.2 > "$run/linearity.log" 2>&1 &
done
wait
