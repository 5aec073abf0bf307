#!/usr/bin/env bash
# The debdocs corpus built from the installed Debian documentation, then prepared into token shards with GPT-2's
# tokenizer and in bytes. The corpus and the shards go to DATA (large: never committed); the manifest, the two
# sidecars and each step's time and peak memory (/usr/bin/time -v) go to RESULTS (small files, committed).
# Usage: experiments/debdocs.sh DATA [RESULTS]     RESULTS defaults to docs/results/debdocs
#   DATA/corpus (train/valid/test.jsonl.gz, manifest.json), DATA/gpt2/gpt2.tiktoken, DATA/shards-gpt2, DATA/shards-bytes
# Needs the packages that skiplab/corpora/debdocs.py names installed (its docstring and docs/language-models.md give the
# apt-get line). A step whose output is there already is not run again.
set -euo pipefail
data=$1
results=${2:-docs/results/debdocs}
py=${PYTHON:-python}
mkdir -p "$data" "$results"
step() {  # NAME OUTPUT COMMAND...: COMMAND, one thread and niced, unless OUTPUT exists; its time in RESULTS/NAME.time
    local name=$1 out=$2
    shift 2
    if [[ -e $out ]]; then
        echo "$name: $out is there already"
        return
    fi
    OMP_NUM_THREADS=1 nice -n 5 /usr/bin/time -v -o "$results/$name.time" "$@"
}
step build "$data/corpus" "$py" -m skiplab corpus debdocs --out "$data/corpus"
PATH=$(dirname "$(command -v "$py")"):$PATH experiments/gpt2_tokenizer.sh "$data/gpt2"
step prepare-gpt2 "$data/shards-gpt2" "$py" -m skiplab prepare lm --corpus debdocs --data-dir "$data/corpus" \
    --tokenizer "tiktoken:gpt2:$data/gpt2/gpt2.tiktoken" --out "$data/shards-gpt2"
step prepare-bytes "$data/shards-bytes" "$py" -m skiplab prepare lm --corpus debdocs --data-dir "$data/corpus" \
    --tokenizer bytes --out "$data/shards-bytes"
cp "$data/corpus/manifest.json" "$results/manifest.json"
cp "$data/shards-gpt2/prepared.json" "$results/prepared-gpt2.json"
cp "$data/shards-bytes/prepared.json" "$results/prepared-bytes.json"
du -sb "$data/corpus" "$data/shards-gpt2" "$data/shards-bytes" | tee "$results/sizes.txt"
