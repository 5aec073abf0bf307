"""experiments/depth_undertraining_pairs.py on a small folder of sweeps written here: the per-seed differences and
their mean against hand computation, a stalled run left out of its pair and named, a sweep not recorded yet said."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "depth_undertraining_pairs.py"
UNIGRAM = 4.8


def sweep(folder: Path, name: str, cells: dict[tuple[str, int, float], list[float]]) -> None:
    runs = [{"connection": c, "depth": d, "lr": lr, "seed": i + 1, "status": "finished", "test_bpb": v}
            for (c, d, lr), values in cells.items() for i, v in enumerate(values)]
    (folder / name).mkdir(parents=True)
    (folder / name / "sweep.json").write_text(json.dumps({"runs": runs, "reference": {"value": UNIGRAM}}))


def pairs(folder: Path) -> list[str]:
    done = subprocess.run([sys.executable, str(SCRIPT), str(folder)], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_differences_stalled_runs_and_missing_sweeps(tmp_path):
    sweep(tmp_path, "short", {("PreLN", 16, 1e-3): [2.9, 3.0, 2.95], ("PreLN", 4, 1e-3): [2.8, 2.8, 2.8]})
    # seed 2 at lr 3e-3 ends 0.3 from the unigram level: stalled (the LM margin is 0.5)
    sweep(tmp_path, "lr", {("PreLN", 16, 3e-4): [3.3, 3.3, 3.4], ("PreLN", 16, 3e-3): [2.8, UNIGRAM - 0.3, 3.15]})
    lines = pairs(tmp_path)

    def line(start: str) -> str:
        (found,) = [x for x in lines if x.startswith(start)]
        return found
    assert line("16 - 4 layers, 400 updates (seeds 1,2,3): +0.100 +0.200 +0.150; mean +0.150 [")
    assert line("16 layers: lr 3e-4 - lr 1e-3 (seeds 1,2,3): +0.400 +0.300 +0.450; mean +0.383 [")
    fast = line("16 layers: lr 3e-3 - lr 1e-3 (seeds 1,3): -0.100 +0.200; mean +0.050 [")
    assert fast.endswith("; apart, stalled: seed 2")
    assert line("16 layers: warm-up 160 - warm-up 40: the warmup sweep is not recorded in")
    assert len(lines) == 8  # every pair has its line


def test_a_folder_that_is_not_there_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "nope")], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == f"depth_undertraining_pairs: no folder {tmp_path / 'nope'}"
