#!/usr/bin/env bash
# Does the best learning rate move with depth? (docs/depth.md). The depth study's model, corpus and recipe (gpt-mini
# width d = 128, pydocs bytes, 128-byte windows, 16 a batch, cosine to 1e-4, no clipping) at 400 updates with a
# warm-up of 160, on a 5-point factor-2 lr grid (2.5e-4 ... 4e-3), two runs side by side, one thread each:
#   1. the grid, one seed: PreLN standard and PreLN CompleteP (--depth-base 4) at 4, 8, 16 and 32 layers;
#      DeepNorm, LNS and PeriLN (standard) at 4 and 16 layers              -> OUT/grid-{standard,completep,others}
#      and where a cell's best lr is the grid's lowest or highest, that cell's grid widened by a factor 2 past
#      it, up to WIDEN times (default 3)                                    -> OUT/grid-<name>-<design>-L<depth>
#   2. seeds 1-3 at each design x depth's best lr of step 1 and at its two neighbours swept, and where the seeds
#      move the best lr (the lowest mean over seeds) to one whose neighbour is unseeded, that neighbour too (past
#      the lrs swept by a factor 2 where it is their edge, up to WIDEN widenings of the cell in all), round
#      after round (an optimum still on the edge after widening is reported as such by the table)
#                                                                          -> OUT/seeds-<name>-<design>-L<depth>
#   3. skiplab analyze lr-depth over every sweep: lr* per design x depth, its interval, its slope -> OUT/table
# Every run lives in OUT/runs (finished runs kept, runs cut short resumed, a sweep's runs of one machine kind), so it
# can be run a group of depths at a time over several sittings: DEPTHS=4,8 experiments/depth_lr.sh, then the default.
# Usage: experiments/depth_lr.sh [OUT]   (default runs/depth-lr); LRS, DEPTHS, OTHER_DEPTHS, WIDEN, STAGE=1 (grids only),
# NAMES (the families trained in this sitting, of "standard completep others", in that order by default: e.g.
# NAMES="standard completep" seeds the PreLN cells before the other designs' grids are trained; the table reads
# every sweep in OUT whichever families ran).
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
names=${NAMES:-standard completep others}
for name in $names; do
    case $name in standard|completep|others) ;;
        *) echo "depth_lr.sh: NAMES: unknown family '$name' (standard, completep, others)" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
"$(dirname "$0")/restore_runs.sh" "${RECORDED:-}" "$out"
cells="python3 $(dirname "$0")/depth_lr_cells.py"
extra_of() {  # NAME: the options of the grid's parametrisation
    [ "$1" = completep ] && echo "--parametrization completep --depth-base 4" || true
}
grid() {  # NAME CONNECTIONS DEPTHS: one seed of the grid, then each cell whose best lr is on its edge widened by
    # a factor 2 past it, up to WIDEN times (default 3), into OUT/grid-NAME-<design>-L<depth>
    local name=$1 connections=$2 grid_depths=$3 round design depth wide
    # shellcheck disable=SC2046
    "$skiplab" sweep lm "${common[@]}" --runs "$out/runs" --lrs "$lrs" --seeds 1 $(extra_of "$name") \
        --connections "$connections" --depths "$grid_depths" --out "$out/grid-$name"
    for round in $(seq 1 "${WIDEN:-3}"); do
        edges=$($cells edges "$out" "$name")
        [ -z "$edges" ] && break
        while read -r design depth wide; do  # a run each: two cells side by side
            while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n || exit 1; done
            # shellcheck disable=SC2046
            "$skiplab" sweep lm "${common[@]}" --jobs 1 --runs "$out/runs" --lrs "$wide" --seeds 1 $(extra_of "$name") \
                --connections "$design" --depths "$depth" --out "$out/grid-$name-$design-L$depth" < /dev/null &
        done <<< "$edges"
        while [ -n "$(jobs -rp)" ]; do wait -n || exit 1; done
    done
}
for name in $names; do
    if [ "$name" = others ]; then grid others DeepNorm,LNS,PeriLN "$other_depths"; else grid "$name" PreLN "$depths"; fi
done
[ "${STAGE:-2}" = 1 ] && exit 0
for name in $names; do
    # design depth lrs: the best lr swept and its neighbours, in rounds while the seeds move a cell's best lr to
    # one whose neighbour is not seeded yet (up to WIDEN rounds after the first)
    for round in $(seq 0 "${WIDEN:-3}"); do
        todo=$($cells seeds "$out" "$name" "${WIDEN:-3}")
        [ -z "$todo" ] && break
        while read -r design depth around; do
            # shellcheck disable=SC2046
            "$skiplab" sweep lm "${common[@]}" --runs "$out/runs" $(extra_of "$name") --connections "$design" \
                --depths "$depth" --lrs "$around" --seeds 3 --out "$out/seeds-$name-$design-L$depth" < /dev/null
        done <<< "$todo"
    done
done
# 3. the table: best lr per depth per design, its interval, its slope across depth (every sweep's runs, once each)
shopt -s nullglob
"$skiplab" analyze lr-depth "$out"/grid-* "$out"/seeds-* --out "$out/table" --overwrite
