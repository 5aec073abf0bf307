"""The undertraining question's comparisons across its sweeps (experiments/depth_undertraining.sh): each sweep's
table pairs a design with PreLN at the same depth, budget and lr; the question also asks how a 16-layer PreLN run
compares with itself under another warm-up, lr or budget and with the 4-layer one. Each line: the per-seed
differences of test bits per byte (block k: seed k; a seed that one side lacks is left out), their mean with its
95% CI (Student's t), the paired t-test's p and the exact Wilcoxon signed-rank p (uncorrected; with n = 3 seeds the
smallest attainable is 0.25). A run that stalled (finished within the LM task's margin of the sweep's unigram
reference: skiplab.analysis.blocks) leaves its pair, named on the line. A sweep not recorded yet is skipped with a
line saying so.

Usage: python experiments/depth_undertraining_pairs.py [FOLDER]   (default docs/results/depth-long3)
"""

import json
import sys
from pathlib import Path

from skiplab.analysis.blocks import RunRecord, mean_difference, paired_p, status, wilcoxon_p
from skiplab.tasks.lm import LMTask

# (what, (sweep, connection, depth, lr) of the run, the same of the run it is compared with)
PAIRS = [
    ("16 - 4 layers, 400 updates", ("short", "PreLN", 16, 1e-3), ("short", "PreLN", 4, 1e-3)),
    ("16 layers: warm-up 160 - warm-up 40", ("warmup", "PreLN", 16, 1e-3), ("short", "PreLN", 16, 1e-3)),
    ("16 layers warm-up 160 - 4 layers warm-up 40", ("warmup", "PreLN", 16, 1e-3), ("short", "PreLN", 4, 1e-3)),
    ("16 layers: lr 3e-4 - lr 1e-3", ("lr", "PreLN", 16, 3e-4), ("short", "PreLN", 16, 1e-3)),
    ("16 layers: lr 3e-3 - lr 1e-3", ("lr", "PreLN", 16, 3e-3), ("short", "PreLN", 16, 1e-3)),
    ("16 - 4 layers, 1,600 updates", ("long", "PreLN", 16, 1e-3), ("long", "PreLN", 4, 1e-3)),
    ("4 layers: 1,600 - 400 updates", ("long", "PreLN", 4, 1e-3), ("short", "PreLN", 4, 1e-3)),
    ("16 layers: 1,600 - 400 updates", ("long", "PreLN", 16, 1e-3), ("short", "PreLN", 16, 1e-3)),
]


def test_bpb(folder: Path, sweep: str, connection: str, depth: int, lr: float) -> dict[int, float] | None:
    """Seed -> test bits per byte of the sweep's finished runs of that cell (a stalled run's as None); None where
    the sweep is not recorded."""
    path = folder / sweep / "sweep.json"
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    reference = result["reference"]["value"]
    out = {}
    for r in result["runs"]:
        if (r["connection"], r["depth"], r["lr"]) == (connection, depth, lr) and r.get("test_bpb") is not None:
            record = RunRecord(connection, r["seed"], r["status"], r["test_bpb"])
            verdict = status(record, reference, LMTask.stall_margin, higher_is_better=False)
            if verdict in ("trained", "stalled"):
                out[r["seed"]] = r["test_bpb"] if verdict == "trained" else None
    return out


def main(folder: Path) -> int:
    if not folder.is_dir():
        print(f"depth_undertraining_pairs: no folder {folder}", file=sys.stderr)
        return 2
    for what, run, other in PAIRS:
        a, b = test_bpb(folder, *run), test_bpb(folder, *other)
        if a is None or b is None:
            missing = run[0] if a is None else other[0]
            print(f"{what}: the {missing} sweep is not recorded in {folder}")
            continue
        both = sorted(set(a) & set(b))
        stalled = [s for s in both if a[s] is None or b[s] is None]
        seeds = [s for s in both if s not in stalled]
        apart = f"; apart, stalled: seed {','.join(map(str, stalled))}" if stalled else ""
        d = [a[s] - b[s] for s in seeds]
        if len(d) < 2:
            print(f"{what}: fewer than two seeds on both sides{apart}")
            continue
        m, lo, hi = mean_difference(d)
        tests = f"t-test p {paired_p(d):.3f}, exact Wilcoxon p {wilcoxon_p(d):.3f}"
        print(f"{what} (seeds {','.join(map(str, seeds))}): {' '.join(f'{x:+.3f}' for x in d)}; "
              f"mean {m:+.3f} [{lo:+.3f}, {hi:+.3f}], {tests}{apart}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/results/depth-long3")))
