"""Same config, same bits, as a user meets it: the same `skiplab train lm` command run N times, each in a process of
its own at the default thread count of a 2-core machine (OMP_NUM_THREADS=2), one after another on a quiet machine,
and K more that are killed (SIGKILL) once their checkpoint at update KILL_AT is written and then resumed with
`--resume`. Prints, per run, a digest of the final weights and of the validation losses, and how many differ from
the first uninterrupted run's.

The config is the one a run-to-run difference was first seen with: `train lm --model "gpt-mini(layers=3)"
--connection PostLN --batch-size 8 --max-steps 60 --eval-every 10 --warmup 10 --seed 4` on a small JSONL corpus
(here the first documents of pydocs' splits, written into the work folder).

Usage: PYTHONPATH=. python docs/results/determinism/train_repeats.py WORK [--runs 8] [--killed 4] [--kill-at 30]
       [--data ../shared/data/pydocs]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
DOCS = {"train": 60, "valid": 6, "test": 6}  # documents of each split in the small corpus


def corpus(data: Path, work: Path) -> Path:
    out = work / "corpus"
    out.mkdir(parents=True, exist_ok=True)
    for split, n in DOCS.items():
        with gzip.open(data / f"{split}.jsonl.gz", "rt") as f:
            lines = [next(f) for _ in range(n)]
        (out / f"{split}.jsonl").write_text("".join(lines))
    return out


def command(text: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "skiplab", "train", "lm", "--corpus", "", "--train-file", str(text / "train.jsonl"),
            "--valid-file", str(text / "valid.jsonl"), "--test-file", str(text / "test.jsonl"),
            "--model", "gpt-mini(layers=3)", "--connection", "PostLN", "--batch-size", "8", "--max-steps", "60",
            "--eval-every", "10", "--warmup", "10", "--seed", "4", "--device", "cpu", "--out", str(out)]


def env() -> dict[str, str]:
    e = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)}
    e.pop("MKL_DYNAMIC", None)
    return e


def digest(run: Path) -> tuple[str, str]:
    """(weights, validation losses) of a finished run, as short hex digests."""
    state = torch.load(run / "last.pt", weights_only=True)["model"]
    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode())
        h.update(state[key].detach().cpu().contiguous().numpy().tobytes())
    valid = [json.loads(line).get("valid_loss") for line in (run / "metrics.jsonl").read_text().splitlines()]
    return h.hexdigest()[:12], hashlib.sha256(repr([v for v in valid if v is not None]).encode()).hexdigest()[:12]


def killed_run(text: Path, out: Path, kill_at: int) -> None:
    """Start the run, SIGKILL it once the metrics of update ``kill_at`` are written (its checkpoint goes first),
    then ``--resume`` it to the end."""
    proc = subprocess.Popen(command(text, out), env=env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    metrics = out / "metrics.jsonl"
    while proc.poll() is None:
        if metrics.is_file() and any(json.loads(line).get("step") == kill_at
                                     for line in metrics.read_text().splitlines() if line.strip()):
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    if proc.returncode == 0:
        raise SystemExit(f"train_repeats: the run in {out} finished before update {kill_at}; nothing was killed")
    subprocess.run([sys.executable, "-m", "skiplab", "train", "lm", "--resume", "--out", str(out)], env=env(),
                   cwd=ROOT, check=True, capture_output=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work", type=Path)
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--killed", type=int, default=4)
    p.add_argument("--kill-at", type=int, default=30)
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "pydocs")
    a = p.parse_args()
    if a.work.exists():
        print(f"train_repeats: {a.work} exists; give a new folder", file=sys.stderr)
        return 2
    text = corpus(a.data, a.work)
    first = None
    differ = {"uninterrupted": 0, "killed and resumed": 0}
    jobs = [("uninterrupted", i) for i in range(a.runs)] + [("killed and resumed", i) for i in range(a.killed)]
    for kind, i in jobs:
        out = a.work / f"{kind.split()[0]}-{i + 1}"
        if kind == "uninterrupted":
            subprocess.run(command(text, out), env=env(), cwd=ROOT, check=True, capture_output=True)
        else:
            killed_run(text, out, a.kill_at)
        d = digest(out)
        first = first or d
        same = d == first
        differ[kind] += not same
        print(f"{kind} {i + 1}: weights {d[0]}, validation losses {d[1]}: {'same' if same else 'DIFFERENT'}",
              flush=True)
    env0 = json.loads((a.work / "uninterrupted-1" / "config.json").read_text())["environment"]
    print(f"{differ['uninterrupted']} of {a.runs - 1} uninterrupted runs and {differ['killed and resumed']} of "
          f"{a.killed} killed-and-resumed runs differ from the first; machine {env0.get('cpu')} "
          f"({env0.get('cpu_capability')}), threads {env0.get('threads')}, mkl_dynamic {env0.get('mkl_dynamic')}, "
          f"torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
