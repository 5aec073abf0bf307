#!/usr/bin/env bash
# The doors end to end: GPT-2's tokenizer, the pydocs corpus tokenised once into shards, a GPT-2-shaped model
# (PreLN, learned positions, gelu, tied output) trained on the shards, evaluated in bits per byte and word-level
# perplexity, exported to a Hugging Face folder and checked there (experiments/gpt2_check.py: the logits of
# GPT2LMHeadModel.from_pretrained against the run's, and the folder's tokenizer against the run's), then the
# folder imported back as a run and analysed (analyze redundancy), its evaluation and analysis against the run's.
# Usage: experiments/gpt2_pydocs.sh OUT [GPT2_DIR] [DEST]   (cut short, it goes on where it stopped; DEST: where
# the small files go, e.g. docs/results/lm/gpt2-pydocs)
set -euo pipefail
out=$1 gpt2=${2:-$1/gpt2} dest=${3:-}
experiments/gpt2_tokenizer.sh "$gpt2"
tok=tiktoken:gpt2:$gpt2/gpt2.tiktoken
if [[ ! -d $out/prepared ]]; then
    /usr/bin/time -f "prepare: %e s" skiplab prepare lm --corpus pydocs --data-dir ../shared/data/pydocs \
        --tokenizer "$tok" --out "$out/prepared"
fi
resume=()
if [[ -f $out/run/last.pt ]]; then resume=(--resume); fi
skiplab train lm --model "gpt2-small(d_model=128,heads=4,layers=4,ffn_dim=512,context=256)" --corpus pydocs \
    --tokenizer "$tok" --data-dir "$out/prepared" --batch-size 8 --max-steps 300 --warmup 30 --lr 1e-3 \
    --min-lr 1e-4 --eval-every 100 --valid-tokens 20000 --seed 1 --out "$out/run" "${resume[@]}"
skiplab eval lm --checkpoint "$out/run" --split test > "$out/eval_test.json"
cat "$out/eval_test.json"
skiplab export hf "$out/run" --out "$out/hf" --overwrite
python experiments/gpt2_check.py "$out/run" "$out/hf" | tee "$out/hf_check.json"
skiplab import hf "$out/hf" --out "$out/imported" --corpus pydocs --data-dir ../shared/data/pydocs --overwrite
skiplab eval lm --checkpoint "$out/imported" --split test > "$out/eval_imported.json"
skiplab analyze redundancy "$out/run" --examples 64 --overwrite
skiplab analyze redundancy "$out/imported" --examples 64 --overwrite
python experiments/gpt2_check.py "$out/run" "$out/hf" "$out/imported" | tee "$out/hf_check.json"
if [[ -n $dest ]]; then
    mkdir -p "$dest/run" "$dest/hf" "$dest/imported"
    cp "$out"/eval_test.json "$out"/eval_imported.json "$out"/hf_check.json "$out/prepared/prepared.json" "$dest/"
    cp "$out"/run/{config.json,metrics.jsonl,summary.json} "$out"/run/analysis/redundancy.{json,md} "$dest/run/"
    cp "$out"/hf/{config.json,tokenizer_config.json} "$dest/hf/"
    cp "$out"/imported/config.json "$out"/imported/analysis/redundancy.{json,md} "$dest/imported/"
fi
