#!/usr/bin/env bash
# One card's records in one call: the GPU bench (skiplab bench --groups gpu), then one block of the GPU evidence
# track (experiments/pool_gpu.sh), prepared from the debdocs corpus where its shards are not there yet. Everything it
# measures lands in RESULTS: bench/bench.md and bench.json, bench.log, pool.log, and pool-gpu.tgz (every run's small
# files and the block's table). Run from the repository's root on a machine with a card and torch; skiplab need not
# be installed (it runs as python3 -m skiplab from the tree).
# Usage: experiments/gpu_record.sh RESULTS BLOCK CORPUS TIKTOKEN
#   CORPUS    the built debdocs corpus (skiplab corpus debdocs; 32 MB); TIKTOKEN: gpt2.tiktoken
#   After the bench, benchmarks/profile_gpu.py profiles PreLN and every design the bench found above its goal
#   (RESULTS/profile: traces and profile.md; PROFILE_BUDGET=SECONDS, default 150, PROFILE=0 skips it).
#   BENCH_BUDGET=SECONDS the bench's --gpu-budget (default 270); BENCH=0 or POOL=0 skips one; WORK=DIR holds the
#   prepared shards and the runs (default /tmp); SMOKE=1 the block at smoke size on a CPU, CORPUS a pydocs-shaped folder
#   A record RESULTS already holds (bench/, profile/, pool-gpu.tgz) is refused before anything runs; OVERWRITE=1
#   replaces it. A block whose pool fails packs what it wrote into pool-gpu.failed.tgz instead (not a record: the
#   next call replaces it), and the script exits 2 where any step failed.
set -uo pipefail
if [[ $# -ne 4 ]]; then
    echo "usage: experiments/gpu_record.sh RESULTS BLOCK CORPUS TIKTOKEN (see the script's header)" >&2
    exit 2
fi
results=$1 block=$2 corpus=$3 tiktoken=$4
[[ $results = /* ]] || results=$PWD/$results  # the archive is written from inside the pool's folder
overwrite=()
if [[ -n ${OVERWRITE:-} ]]; then overwrite=(--overwrite); else
    for part in bench:BENCH profile:PROFILE pool-gpu.tgz:POOL; do
        name=${part%%:*} switch=${part##*:}
        if [[ ${!switch:-1} != 0 && -e $results/$name ]]; then
            echo "gpu_record.sh: $results/$name holds an earlier record; give another RESULTS, or OVERWRITE=1" >&2
            exit 2
        fi
    done
fi
if [[ ${POOL:-1} != 0 && -z ${SMOKE:-} ]]; then  # the block's inputs checked before any card time is spent
    if [[ ! -f $corpus/manifest.json ]]; then
        echo "gpu_record.sh: $corpus is not a built debdocs corpus (no manifest.json; skiplab corpus debdocs)" >&2
        exit 2
    fi
    if [[ ! -f $tiktoken ]]; then
        echo "gpu_record.sh: no tokenizer file $tiktoken (experiments/gpt2_tokenizer.sh DIR writes DIR/gpt2.tiktoken)" >&2
        exit 2
    fi
fi
mkdir -p "$results"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$results/card.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$results/card.txt"
work=${WORK:-/tmp}
failed=0
if [[ ${BENCH:-1} != 0 ]]; then
    python3 -m skiplab bench --groups gpu --gpu-budget "${BENCH_BUDGET:-270}" --out "$results/bench" \
        ${overwrite[@]+"${overwrite[@]}"} > "$results/bench.log" 2>&1
    rc=$?; echo "bench: exit $rc"; grep '^\[bench\] gpu' "$results/bench.log"; [[ $rc == 0 ]] || failed=1
fi
if [[ ${PROFILE:-1} != 0 && -f $results/bench/bench.json ]]; then
    python3 "$(dirname "$0")/../benchmarks/profile_gpu.py" --from-bench "$results/bench/bench.json" \
        --budget "${PROFILE_BUDGET:-150}" --out "$results/profile" ${overwrite[@]+"${overwrite[@]}"} \
        > "$results/profile.log" 2>&1
    rc=$?; echo "profile: exit $rc"; grep '^\[profile\]' "$results/profile.log"; [[ $rc == 0 ]] || failed=1
fi
if [[ ${POOL:-1} != 0 ]]; then
    data=$work/debdocs-gpt2
    if [[ -n ${SMOKE:-} ]]; then data=$corpus; fi
    CORPUS=$corpus TOKENIZER=tiktoken:gpt2:$tiktoken SKIPLAB="python3 -m skiplab" \
        "$(dirname "$0")/pool_gpu.sh" "$data" "$work/pool-gpu" "$block" > "$results/pool.log" 2>&1
    rc=$?; echo "pool block $block: exit $rc"; tail -n 30 "$results/pool.log"
    archive=$results/pool-gpu.tgz
    if [[ $rc != 0 ]]; then failed=1 archive=$results/pool-gpu.failed.tgz; fi
    if [[ -d $work/pool-gpu ]]; then
        (cd "$work/pool-gpu" && find . \( -name '*.json' -o -name '*.jsonl' -o -name 'table.*' -o -name '*.png' \) \
            -not -name 'prepared*' | tar czf "$archive" -T -)
    fi
fi
if [[ $failed != 0 ]]; then
    echo "gpu_record.sh: a step failed (its log is in $results)" >&2
    exit 2
fi
