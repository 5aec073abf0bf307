#!/usr/bin/env bash
# The depth study (docs/depth.md): gpt-mini width (d = 128, 4 heads, FFN 512) on pydocs bytes, 128-token windows,
# 16 a batch, 400 updates (lr 1e-3 cosine to 1e-4, 40 warm-up), no gradient clipping (the Mix-LN and curse-of-depth
# papers' setting, in which their post-norm models diverge), seeds 1 and 2, two runs side by side, one thread each.
#   1. designs x depths at lr 1e-3           -> OUT/depth  (sweep.md/csv/json, depth.png, curves.png)
#   2. `analyze redundancy` and `analyze norms` of the deepest PreLN run (seed 1) with MixLN's and LNS's overlaid
#      -> OUT/analysis (needs the three runs' checkpoints: trained here, not restored from RECORDED; skipped
#      without them, or with ANALYZE=no)
#   3. PostLN, PreLN, DeepNorm at the deepest depth, lr 1e-3, 3e-3, 1e-2 -> OUT/lr (with lr.png)
# Both sweeps keep their runs in OUT/runs, so the lr-1e-3 runs of step 3 are step 1's. A finished run is kept, one
# cut short resumes, so the study can be run a group of depths at a time across sessions:
#   DEPTHS=4,8 experiments/depth_study.sh     then DEPTHS=4,8,16 ..., then the default (all four, and step 2)
# Usage: experiments/depth_study.sh [OUT]   (default runs/depth)
#   DESIGNS (default PreLN,PostLN,DeepNorm,MixLN,LNS,HC), DEPTHS (default 4,8,16,32), LR_AXIS=no skips step 3.
#   RECORDED=docs/results/depth puts the small files of runs recorded there back into OUT first (those runs are
#   then not trained again); afterwards: experiments/collect_runs.sh OUT docs/results/depth, the same for OUT/depth
#   and OUT/lr, and cp OUT/analysis/* docs/results/depth/analysis/
set -euo pipefail
out=${1:-runs/depth}
designs=${DESIGNS:-PreLN,PostLN,DeepNorm,MixLN,LNS,HC}
depths=${DEPTHS:-4,8,16,32}
deepest=${depths##*,}
data=${DATA:-../shared/data/pydocs}
skiplab=${SKIPLAB:-skiplab}
common=(--model "gpt-mini(context=128)" --corpus pydocs --data-dir "$data" --tokenizer bytes --batch-size 16
        --max-steps 400 --warmup 40 --min-lr 1e-4 --clip-norm 0 --eval-every 100 --valid-tokens 50000 --device cpu
        --seeds 2 --jobs 2 --runs "$out/runs")
mkdir -p "$out"
out=$(cd "$out" && pwd)
"$(dirname "$0")/restore_runs.sh" "${RECORDED:-}" "$out"
"$skiplab" sweep lm "${common[@]}" --connections "$designs" --depths "$depths" --lrs 1e-3 --out "$out/depth"
run_of() {  # DESIGN: the seed-1 run of DESIGN at the deepest depth and lr 1e-3 (its config.json's lr: the folder's
    # name does not hold the lr, and step 3 puts the same design's runs at other lrs beside it)
    "${PYTHON:-python3}" - "$out/runs" "$1" "$deepest" <<'EOF'
import json, sys
from pathlib import Path
root, design, depth = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
for run in sorted(root.glob(f"*_connection={design}_layers={depth}_-*/seed1")):
    try:
        lr = json.loads((run / "config.json").read_text())["config"]["lr"]
    except (OSError, ValueError, KeyError, TypeError):
        continue
    if lr == 1e-3:
        print(run)
        break
EOF
}
if [ "${ANALYZE:-yes}" != no ] && [ -f "$(run_of PreLN)/last.pt" ] && [ -f "$(run_of MixLN)/last.pt" ] \
        && [ -f "$(run_of LNS)/last.pt" ]; then
    mkdir -p "$out/analysis"
    for analysis in redundancy norms; do
        "$skiplab" analyze "$analysis" "$(run_of PreLN)" --compare "$(run_of MixLN)" "$(run_of LNS)" --overwrite
        cp "$(run_of PreLN)/analysis/${analysis}_compare.png" "$out/analysis/"
        for d in PreLN MixLN LNS; do
            for f in "$(run_of "$d")/analysis/$analysis".*; do cp "$f" "$out/analysis/$d.${f##*/}"; done
        done
    done
fi
if [ "${LR_AXIS:-yes}" != no ]; then
    "$skiplab" sweep lm "${common[@]}" --connections PostLN,PreLN,DeepNorm --depths "$deepest" --lrs 1e-3,3e-3,1e-2 \
        --out "$out/lr"
fi
