#!/usr/bin/env bash
# The GPU evidence track (docs/performance.md, "On a GPU"): one block a call (one seed of every design, PreLN the
# baseline, first) at ten times the CPU pool's scale and more, on one card, the block's runs side by side. Its table
# is its own (one card, one precision, one scale): it never mixes with the CPU pool or the pool's bf16 blocks at
# CPU scale, and it grows by one block each time this runs on such a card.
#   model   gpt-small(d 384, 8 layers, 6 heads, FFN 1536, context 512, rotary, tied output, vocabulary padded to
#           a multiple of 64), GPT-2's tokens of debdocs (skiplab prepare lm --corpus debdocs, tiktoken gpt2)
#   recipe  64 windows of 512 tokens an update (32,768 tokens), 640 updates (21.0 M tokens a run), AdamW lr 1e-3,
#           warm-up 64, cosine to 1e-4, clipping at 1.0, bf16 autocast, torch.compile, per-step telemetry; the
#           final model's test bits per byte; the output layer and loss chunked (--head-loss chunked, the same
#           numbers): the eager head holds about 2.7 times the float32 logits more at its peak (4,246 MiB more than
#           the chunked one for 8,192 tokens at V = 50,304, 1,572 MiB of logits, in docs/results/bench/
#           intel-xeon-avx512-2026-11-29-head-loss/step.md), about 18 GB a run at 32,768 tokens (estimated), which
#           eight runs side by side would not find on one card
# Usage: experiments/pool_gpu.sh DATA OUT BLOCK
#   DATA   the prepared debdocs folder (GPT-2 tokens); TOKENIZER=tiktoken:gpt2:FILE names the ranks it was made with.
#          CORPUS=DIR (the built corpus, skiplab corpus debdocs) prepares DATA from it first where DATA has no
#          prepared.json (a card's machine gets the 32 MB corpus rather than the 69 MB of shards)
#   BLOCK  the block to train (blocks 1..BLOCK-1 already in OUT, or put back with RECORDED=docs/results/lm/pool-gpu,
#          are not trained again); afterwards: experiments/collect_runs.sh OUT docs/results/lm/pool-gpu
#   DESIGNS=... a subset; JOBS=N runs side by side (default 8: the whole block at once)
#   SMOKE=1 the same commands at smoke size on a CPU (a tiny model on pydocs bytes, a few updates): what the test
#   suite runs
set -euo pipefail
if [ $# -ne 3 ]; then echo "usage: experiments/pool_gpu.sh DATA OUT BLOCK (see the script's header)" >&2; exit 2; fi
data=$1 out=$2 block=$3
designs=${DESIGNS:-PreLN,PostLN,PeriLN,HC,mHC,PreLN+ValueRes,2rSkip+LN,SAS}
read -ra skiplab <<< "${SKIPLAB:-skiplab}"  # a command, e.g. "python3 -m skiplab"
mkdir -p "$out"
"$(dirname "$0")/restore_runs.sh" "${RECORDED:-}" "$out"
if [[ -n ${SMOKE:-} ]]; then
    args=(--model "gpt-small(d_model=32,heads=2,layers=2,ffn_dim=64,context=16)" --corpus pydocs --data-dir "$data"
          --tokenizer bytes --batch-size 2 --max-steps 4 --warmup 1 --eval-every 2 --valid-tokens 256 --device cpu
          --compile false --head-loss chunked)
    jobs=${JOBS:-1}
else
    tokenizer=${TOKENIZER:?TOKENIZER=tiktoken:gpt2:FILE, the ranks DATA was prepared with}
    if [[ -n ${CORPUS:-} && ! -f $data/prepared.json ]]; then
        "${skiplab[@]}" prepare lm --corpus debdocs --data-dir "$CORPUS" --tokenizer "$tokenizer" --out "$data"
    fi
    args=(--model "gpt-small(d_model=384,heads=6,layers=8,ffn_dim=1536,context=512,pad_vocab=64)" --corpus debdocs
          --data-dir "$data" --tokenizer "$tokenizer"
          --batch-size 64 --max-steps 640 --warmup 64 --eval-every 160 --valid-tokens 262144 --device cuda
          --compile true --head-loss chunked)
    jobs=${JOBS:-8}
fi
"${skiplab[@]}" compare lm "${args[@]}" --lr 1e-3 --min-lr 1e-4 --connections "$designs" --seeds "$block" \
    --jobs "$jobs" --out "$out"
