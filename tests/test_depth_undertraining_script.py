"""experiments/depth_undertraining.sh with a stand-in for skiplab that records its arguments: SWEEPS picks the
sweeps and their order, every name is checked before anything runs, and RECORDED runs are put back first."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "depth_undertraining.sh"


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    log = tmp_path / "calls.txt"
    stub = tmp_path / "skiplab"
    stub.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\n')
    stub.chmod(0o755)
    return subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT,
                          env={"PATH": os.environ["PATH"], "SKIPLAB": str(stub), **env}, timeout=60)


def calls(tmp_path: Path) -> list[tuple[str, str, str]]:
    """(out folder's name, --max-steps, --warmup) of each sweep the script ran, in order."""
    out = []
    for line in (tmp_path / "calls.txt").read_text().splitlines():
        words = line.split()
        value = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
        out.append((Path(value["--out"]).name, value["--max-steps"], value["--warmup"]))
    return out


def test_every_sweep_by_default_the_cheapest_first(tmp_path):
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert calls(tmp_path) == [("short", "400", "40"), ("lr", "400", "40"), ("warmup", "400", "160"),
                               ("long", "1600", "40")]


def test_sweeps_picks_and_orders(tmp_path):
    done = run(tmp_path, SWEEPS="long,short")
    assert done.returncode == 0, done.stderr
    assert calls(tmp_path) == [("long", "1600", "40"), ("short", "400", "40")]


@pytest.mark.parametrize("sweeps", ["long,bogus", "bogus", "short,Long"])
def test_an_unknown_sweep_is_one_line_and_nothing_runs(tmp_path, sweeps):
    done = run(tmp_path, SWEEPS=sweeps, RECORDED=str(tmp_path))
    assert done.returncode == 2
    bad = sweeps.split(",")[-1]
    assert done.stderr.strip() == (f"depth_undertraining.sh: unknown sweep '{bad}' in SWEEPS "
                                   "(short, lr, warmup, long)")
    assert not (tmp_path / "calls.txt").exists() and not (tmp_path / "out").exists()


def test_recorded_runs_are_put_back_before_the_sweeps(tmp_path):
    run_dir = tmp_path / "recorded" / "cell" / "seed1"
    run_dir.mkdir(parents=True)
    for name in ("config.json", "metrics.jsonl", "summary.json"):
        (run_dir / name).write_text("{}")
    done = run(tmp_path, SWEEPS="short", RECORDED=str(tmp_path / "recorded"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "runs" / "cell" / "seed1" / "summary.json").is_file()
    assert calls(tmp_path) == [("short", "400", "40")]
