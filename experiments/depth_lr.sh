#!/usr/bin/env bash
# Does the best learning rate move with depth? (docs/depth.md). The depth study's model, corpus and recipe (gpt-mini
# width d = 128, pydocs bytes, 128-byte windows, 16 a batch, cosine to 1e-4, no clipping) at 400 updates with a
# warm-up of 160, on a 5-point factor-2 lr grid (2.5e-4 ... 4e-3), two runs side by side, one thread each:
#   1. the grid, one seed: PreLN standard and PreLN CompleteP (--depth-base 4) at 4, 8, 16 and 32 layers;
#      DeepNorm, LNS and PeriLN (standard) at 4 and 16 layers              -> OUT/grid-{standard,completep,others}
#   2. seeds 1-3 at each design x depth's best lr of step 1 and at its two neighbours on the grid (an optimum on the
#      grid's edge is reported as such: widen LRS and run again)         -> OUT/seeds-<name>-<design>-L<depth>
#   3. skiplab analyze lr-depth over every sweep: lr* per design x depth, its interval, its slope -> OUT/table
# Every run lives in OUT/runs (finished runs kept, runs cut short resumed, a sweep's runs of one machine kind), so it
# can be run a group of depths at a time over several sittings: DEPTHS=4,8 experiments/depth_lr.sh, then the default.
# Usage: experiments/depth_lr.sh [OUT]   (default runs/depth-lr); LRS, DEPTHS, OTHER_DEPTHS, STAGE=1 (grid only).
# Afterwards: experiments/collect_runs.sh OUT docs/results/depth-lr (every run's small files; RECORDED=that folder
# puts them back in a later sitting) and the sweeps' and the table's files beside them.
set -euo pipefail
out=${1:-runs/depth-lr}
data=${DATA:-../shared/data/pydocs}
skiplab=${SKIPLAB:-skiplab}
lrs=${LRS:-2.5e-4,5e-4,1e-3,2e-3,4e-3}
depths=${DEPTHS:-4,8,16,32}
other_depths=${OTHER_DEPTHS:-4,16}
common=(--model "gpt-mini(context=128)" --corpus pydocs --data-dir "$data" --tokenizer bytes --batch-size 16
        --max-steps 400 --warmup 160 --min-lr 1e-4 --clip-norm 0 --eval-every 100 --valid-tokens 50000
        --device cpu --jobs 2)
mkdir -p "$out"
out=$(cd "$out" && pwd)
"$(dirname "$0")/restore_runs.sh" "${RECORDED:-}" "$out"
grid() {  # NAME SWEEP-OPTIONS...: one seed of the grid
    local name=$1
    shift
    "$skiplab" sweep lm "${common[@]}" --runs "$out/runs" --lrs "$lrs" --seeds 1 "$@" --out "$out/grid-$name"
}
grid standard --connections PreLN --depths "$depths"
grid completep --connections PreLN --depths "$depths" --parametrization completep --depth-base 4
grid others --connections DeepNorm,LNS,PeriLN --depths "$other_depths"
[ "${STAGE:-2}" = 1 ] && exit 0
for name in standard completep others; do
    extra=()
    [ "$name" = completep ] && extra=(--parametrization completep --depth-base 4)
    # design depth lrs: the best lr of the grid and its neighbours
    python3 - "$out/grid-$name/sweep.json" "$lrs" <<'PY' | while read -r design depth around; do
import json, sys
grid = [float(v) for v in sys.argv[2].split(",")]
for s in json.load(open(sys.argv[1]))["stability"]:
    if s["best_lr"] is None:
        continue
    i = min(range(len(grid)), key=lambda k: abs(grid[k] - s["best_lr"]))
    around = grid[max(i - 1, 0) : i + 2]
    print(s["connection"], s["depth"], ",".join(f"{v:g}" for v in around))
PY
        "$skiplab" sweep lm "${common[@]}" --runs "$out/runs" "${extra[@]}" --connections "$design" \
            --depths "$depth" --lrs "$around" --seeds 3 --out "$out/seeds-$name-$design-L$depth" < /dev/null
    done
done
# 3. the table: best lr per depth per design, its interval, its slope across depth (every sweep's runs, once each)
shopt -s nullglob
"$skiplab" analyze lr-depth "$out"/grid-* "$out"/seeds-* --out "$out/table" --overwrite
