#!/usr/bin/env bash
# The GPU commands' smoke tests under another torch than the test suite's, on this CPU: the torch (and transformers)
# a card's machine carries, so that a short window on the card is not spent finding that the commands break there.
# Builds a virtual environment VENV with that torch and the packages the commands import (no skiplab extras beyond
# them), then runs the GPU bench's, the profiles', the GPU pool's and the graph-break tests with it; the log and the
# versions go to OUT.
# Usage: experiments/card_torch_check.sh VENV OUT [TORCH] [TRANSFORMERS]
#   TORCH default torch==2.11.0 (the cards' image: 2.11.0+cu130; its CUDA build runs on a CPU, no card needed);
#   TRANSFORMERS default "transformers==5.17.0 huggingface-hub==1.33.0 tokenizers==0.23.2" (the same image's).
#   TESTS overrides the test files (default below); EXTRA names more packages to install for them (e.g.
#   TESTS="tests/connections tests/models tests/train" EXTRA="pycocoevalcap==1.2": the captioning tests score with
#   it); LOG=NAME writes pytest-NAME.log rather than pytest.log. Exit status: pytest's.
set -euo pipefail
venv=$1 out=$2
torch_req=${3:-torch==2.11.0}
hf_req=${4:-transformers==5.17.0 huggingface-hub==1.33.0 tokenizers==0.23.2}
tests=${TESTS:-tests/test_bench_gpu.py tests/test_profile_gpu.py tests/test_pool_gpu.py tests/test_compile_breaks.py}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [[ ! -x $venv/bin/python ]]; then
    python3 -m venv "$venv"
fi
# shellcheck disable=SC2086  # the requirements are words
"$venv/bin/pip" install -q "$torch_req" numpy matplotlib tqdm sentencepiece sacrebleu sacremoses scipy pytest \
    pytest-timeout $hf_req safetensors tiktoken ${EXTRA:-}
"$venv/bin/pip" install -q --no-deps -e "$root"
"$venv/bin/python" -c "import importlib.metadata as m, torch
def v(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return 'not installed'
print('torch', torch.__version__, 'cuda', torch.version.cuda, '| transformers', v('transformers'), '| tokenizers',
      v('tokenizers'))" | tee "$out/versions.txt"
cd "$root"
{ echo "code $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (changed)')"
  "$venv/bin/python" -c "from skiplab.bench.suite import machine_name; print('machine', machine_name())"
  date -u +"date %Y-%m-%d %H:%M UTC"; } | tee -a "$out/versions.txt"
# its own caches: the kernels and inductor's code are built for this torch, apart from the suite's
# shellcheck disable=SC2086
PATH=$venv/bin:$PATH SKIPLAB_KERNEL_CACHE=$out/.kernels TORCHINDUCTOR_CACHE_DIR=$out/.inductor \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider $tests 2>&1 | tee "$out/pytest${LOG:+-$LOG}.log"
status=${PIPESTATUS[0]}
rm -rf "$out/.kernels" "$out/.inductor"
exit "$status"
