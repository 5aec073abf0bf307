"""One kind of machine per paired table: compare and sweep refuse blocks of two kinds before anything is written.

"Another kind" is derived from this machine's own record (its CPU's name with a word added), so it differs from
the machine the test runs on by construction, whatever that machine is.
"""

import json
from pathlib import Path

import pytest

from skiplab import host, run_dir
from skiplab.cli import main
from skiplab.reproduce import sweep as sweep_mod
from skiplab.train.lm import LMTrainConfig

TINY = "gpt-mini(d_model=32,heads=2,layers=2,ffn_dim=64,context=32)"


@pytest.fixture()
def text(tmp_path):
    root = tmp_path / "text"
    root.mkdir()
    for split in ("train", "valid", "test"):
        (root / f"{split}.jsonl").write_text(json.dumps({"text": "the cat sat on the mat. " * 8}) + "\n")
    return root


def _elsewhere(out: Path, seed: int) -> None:
    """A finished-looking run's config.json and summary.json in ``out``, trained on a CPU of another kind than
    this machine's."""
    env = host.environment()
    other = {**env, "cpu": f"{env['cpu']} Other", "cuda": None}
    out.mkdir(parents=True)
    run_dir.write_json(out / "config.json", {"config": {"seed": seed}, "device": "cpu", "amp": False,
                                             "environment": other})
    run_dir.write_json(out / "summary.json", {"status": "finished", "steps": 6, "train_time_s": 1.0})


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_machine_kind_names_the_processor_kernels_and_precision():
    env = {"cpu": "Example CPU X1", "cpu_capability": "AVX512", "cuda": "NVIDIA H100 80GB HBM3"}
    assert host.machine_kind(env, "cuda", True) == "NVIDIA H100 80GB HBM3, bf16 autocast"
    assert host.machine_kind(env, "cuda:0", False) == "NVIDIA H100 80GB HBM3, fp32"
    assert host.machine_kind(env, "cpu", True) == "Example CPU X1 (AVX512), fp32"  # autocast is CUDA only
    stored = {"config": {"device": "auto", "amp": True}, "environment": env}  # a run before device/amp were kept
    assert run_dir.kinds(stored) == ["NVIDIA H100 80GB HBM3, bf16 autocast"]
    stored["resumed_on"] = [{"at": 300, "environment": {**env, "cuda": None}, "device": "cpu", "amp": False}]
    assert run_dir.kinds(stored) == ["NVIDIA H100 80GB HBM3, bf16 autocast", "Example CPU X1 (AVX512), fp32"]


def test_compare_refuses_blocks_of_two_kinds_and_writes_nothing(text, tmp_path, capsys):
    """Block 1's baseline trained on another kind of CPU, block 2 is to train here: one line, exit 2, and the
    folder holds what it held (no data prepared, no run begun, no table)."""
    out = tmp_path / "cmp"
    _elsewhere(out / "PreLN" / "seed1", 1)
    before = _files(out)
    argv = ["compare", "lm", "--corpus", "", "--train-file", text / "train.jsonl", "--valid-file",
            text / "valid.jsonl", "--test-file", text / "test.jsonl", "--model", TINY, "--batch-size", "4",
            "--max-steps", "2", "--device", "cpu", "--connections", "PreLN,PostLN", "--seeds", "2", "--out", out]
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "different kinds of machine" in lines[0]
    here = host.machine_kind(host.environment(), "cpu", False)
    assert "seed 1 on " in lines[0] and f"seed 2 on {here}" in lines[0]
    assert _files(out) == before
    # the same blocks of one kind are not refused by the check (seed 2 alone: the kind of this machine)
    assert main([str(a) for a in argv[:-4] + ["--seeds", "2-2", "--out", tmp_path / "one"]]) == 0
    table = (tmp_path / "one" / "table.md").read_text()
    assert f"Kind of machine: {here}, every block" in table and "2/2^1 = 1" in table


def test_sweep_refuses_runs_of_two_kinds_and_writes_nothing(text, tmp_path):
    base = LMTrainConfig(model="gpt-mini(d_model=32,heads=2,ffn_dim=64,context=32)", corpus="", train_file=str(text / "train.jsonl"),
                         valid_file=str(text / "valid.jsonl"), test_file=str(text / "test.jsonl"), batch_size=4,
                         max_steps=2, device="cpu", out=str(tmp_path / "swp"))
    root = tmp_path / "swp" / "runs"
    points, _ = sweep_mod.plan("lm", base, ("PreLN", "PostLN"), (2,))
    _elsewhere(Path(sweep_mod._seeded("lm", points[0], 1, root).out), 1)
    before = _files(tmp_path / "swp")
    with pytest.raises(ValueError) as err:
        sweep_mod.sweep("lm", base, ("PreLN", "PostLN"), (2,), seeds=1, progress=False)
    assert "a sweep's runs are of different kinds of machine (1 run on " in str(err.value)
    assert "runs to train here on " in str(err.value) and "\n" not in str(err.value)
    assert _files(tmp_path / "swp") == before
