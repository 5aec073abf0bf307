"""The run-directory helper every training loop shares, with a linear model standing in for a task's."""

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from skiplab import run_dir
from skiplab.distributed import Group
from skiplab.train.run import Run


@dataclass(frozen=True)
class Config:
    out: str
    lr: float = 0.1
    max_steps: int = 5
    amp: bool = True
    compile: bool = False


def started(cfg: Config, kind: str = "toy", resume: bool = False) -> tuple[Run, dict | None]:
    """A Run of ``cfg`` with its model (a seeded nn.Linear) and optimizer attached, and config.json where it is
    fresh; the checkpoint it resumes."""
    run = Run(cfg, kind, Group(), torch.device("cpu"), resume=resume)
    ckpt = run.resume(extendable=("max_steps",))
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    run.attach(model, Config(out="model"), torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9))
    if ckpt is None:
        run.write_config({"data": {"rows": 4}})
    return run, ckpt


def train_steps(run: Run, steps, keep=None, times=None) -> None:
    """One SGD step and one save per step in ``steps``; the loss is the step's (so improved while it falls)."""
    for i, step in enumerate(steps):
        run.optimizer.zero_grad()
        run.model(torch.randn(4, 3)).square().mean().backward()
        run.optimizer.step()
        record = {"step": step, "loss": 1 / step, "time": times[i] if times else 1.0}
        run.save(run.checkpoint(record, rng={"mine": torch.tensor([step])}, step=step, best=1 / step), improved=True,
                 step=step, keep=keep)


def test_step_checkpoints_keep_exactly_the_last_n(tmp_path):
    run, _ = started(Config(out=str(tmp_path / "run")))
    train_steps(run, range(1, 6), keep=2)
    assert [p.name for p in run_dir.step_checkpoints(run.out)] == ["checkpoint_4.pt", "checkpoint_5.pt"]
    assert [r["step"] for r in run_dir.read_metrics(run.out)] == [1, 2, 3, 4, 5]
    last = run_dir.load_checkpoint(run.out, kind="toy")
    assert list(last) == ["kind", "config", "model_config", "model", "optimizer", "step", "best", "telemetry", "rng",
                          "world_size", "record"]
    assert last["step"] == 5 and last["record"]["step"] == 5 and last["rng"]["mine"].item() == 5
    assert "ranks" not in last["rng"] and "torch" in last["rng"]
    # without a step, or with keep None, nothing is pruned
    train_steps(run, [6, 7])
    assert len(run_dir.step_checkpoints(run.out)) == 4


def test_finish_sums_the_records_time_and_puts_the_task_entries_first(tmp_path):
    run, _ = started(Config(out=str(tmp_path / "run")))
    train_steps(run, [1, 2, 3], times=[1.5, 2.0, 0.25])
    summary = run.finish(lambda last: {"steps": 3, "final_loss": last["loss"]})
    assert summary["train_time_s"] == 3.75 and summary["final_loss"] == pytest.approx(1 / 3)
    assert list(summary) == ["status", "steps", "final_loss", "train_time_s", "world_size", "config"]
    assert summary["status"] == "finished" and summary["config"]["out"] == str(run.out)
    assert json.loads((run.out / "summary.json").read_text()) == summary


def test_config_json_holds_the_task_entries_between_parameters_and_device(tmp_path):
    run, _ = started(Config(out=str(tmp_path / "run")))
    config = json.loads((run.out / "config.json").read_text())
    assert list(config) == ["kind", "config", "model", "parameters", "data", "device", "amp", "environment"]
    assert config["model"]["class"] == "Linear" and config["parameters"] == 8 and config["amp"] is False
    assert config["environment"]["world_size"] == 1


def test_a_checkpoint_of_another_kind_is_refused_in_one_line(tmp_path):
    run, _ = started(Config(out=str(tmp_path / "run")), kind="image")
    train_steps(run, [1])
    with pytest.raises(run_dir.RunDirError) as err:
        started(Config(out=str(tmp_path / "run")), kind="mt", resume=True)
    assert str(err.value) == f"{run.out / 'last.pt'}: not a skiplab mt checkpoint (found 'image')"


def test_resume_restores_the_state_and_cuts_the_metrics_back(tmp_path, capsys):
    cfg = Config(out=str(tmp_path / "run"))
    run, _ = started(cfg)
    train_steps(run, [1, 2])
    weights, rng = run.model.state_dict(), torch.get_rng_state()
    run_dir.append_metrics(run.out, {"step": 3, "loss": 0.3, "time": 1.0})  # past the checkpoint: dropped
    with pytest.raises(run_dir.RunDirError, match="another config"):
        started(Config(out=cfg.out, lr=0.5), resume=True)
    resumed, ckpt = started(Config(out=cfg.out, max_steps=9), resume=True)  # a larger budget resumes
    assert ckpt["step"] == 2 and resumed.changed == ["max_steps"]
    resumed.restore(ckpt, key="step")
    for key, value in weights.items():
        assert torch.equal(resumed.model.state_dict()[key], value)
    assert torch.equal(torch.get_rng_state(), rng)
    assert resumed.optimizer.state_dict()["state"][0]["momentum_buffer"] is not None
    assert [r["step"] for r in run_dir.read_metrics(resumed.out)] == [1, 2]
    said = capsys.readouterr().out
    assert "resumed with max_steps 5 -> 9" in said and "1 record(s) past the checkpoint (step 3)" in said
    assert json.loads((resumed.out / "config.json").read_text())["config"]["max_steps"] == 9


def test_a_fresh_run_resumes_nothing_and_diverged_writes_the_summary(tmp_path, capsys):
    run, ckpt = started(Config(out=str(tmp_path / "run")))
    assert ckpt is None and run.compile(run.model) is run.model
    summary = run.diverged(float("nan"), 1, 3)
    assert summary["status"] == "diverged" and summary["step"] == 3
    assert "non-finite loss (nan) at epoch 1, step 3" in capsys.readouterr().out


HOLDER = """
import sys
from skiplab import run_dir
run_dir.prepare(sys.argv[1], resume=sys.argv[2] == "resume")
print("held", flush=True)
sys.stdin.read()  # held until the test closes stdin or kills this process
"""


def holder(out, resume: bool) -> subprocess.Popen:
    """Another process that prepares ``out`` (so holds it) and waits; returns once it holds it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out), "resume" if resume else "fresh"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_run_directory_held_by_another_process_is_refused_naming_it_and_freed_when_that_one_dies(tmp_path):
    cfg = Config(out=str(tmp_path / "run"))
    run, _ = started(cfg)
    train_steps(run, [1, 2])
    run.finish(lambda last: {"steps": 2})  # finishing lets go: another process may resume it
    before = {p.name: p.read_bytes() for p in run.out.iterdir() if p.is_file() and p.name != run_dir.LOCK}
    proc = holder(run.out, resume=True)
    try:
        for resume, overwrite in ((True, False), (False, True)):
            with pytest.raises(run_dir.RunDirError) as err:
                Run(cfg, "toy", Group(), torch.device("cpu"), resume=resume, overwrite=overwrite)
            assert str(err.value).startswith(f"{run.out} is being trained by another process (pid {proc.pid} on ")
            assert "\n" not in str(err.value)
        after = {p.name: p.read_bytes() for p in run.out.iterdir() if p.is_file() and p.name != run_dir.LOCK}
        assert after == before  # nothing overwritten, not even by --overwrite
    finally:
        proc.kill()  # killed, not ended: the system lets the lock go all the same
        proc.wait()
    resumed, ckpt = started(Config(out=cfg.out, max_steps=9), resume=True)
    assert ckpt["step"] == 2
    # held now by this process until it finishes: a fresh holder elsewhere is refused
    proc = subprocess.run([sys.executable, "-c", HOLDER, str(run.out), "resume"], capture_output=True, text=True,
                          input="")
    assert proc.returncode == 1 and f"(pid {os.getpid()} on " in proc.stderr.strip().splitlines()[-1]
    resumed.finish(lambda last: {})


def test_a_lock_file_alone_is_not_a_run_and_overwrite_keeps_only_it(tmp_path):
    out = tmp_path / "run"
    proc = holder(out, resume=False)  # a fresh start that ended before writing anything
    proc.stdin.close()
    proc.wait()
    assert sorted(p.name for p in out.iterdir()) == [run_dir.LOCK, run_dir.STARTED]
    (out / run_dir.STARTED).unlink()
    run, _ = started(Config(out=str(out)))  # not "already holds files"
    train_steps(run, [1])
    (run.out / "sub").mkdir()
    run.finish(lambda last: {})
    run_dir.prepare(out, overwrite=True)
    # a fresh start's, again, the run it replaces kept aside until its config.json
    assert sorted(p.name for p in out.iterdir()) == [run_dir.LOCK, run_dir.REPLACED, run_dir.STARTED]
    assert {"config.json", "sub"} <= {p.name for p in (out / run_dir.REPLACED).iterdir()}
    run_dir.release(out)


def test_a_finished_run_leaves_no_lock_file_and_a_killed_ones_is_taken_over(tmp_path):
    run, _ = started(Config(out=str(tmp_path / "run")))
    assert (run.out / run_dir.LOCK).read_text().startswith(f"pid {os.getpid()} on ")
    train_steps(run, [1])
    run.finish(lambda last: {})
    assert not (run.out / run_dir.LOCK).exists()
    proc = holder(run.out, resume=True)
    proc.kill()  # ends holding it: the file stays, its lock does not
    proc.wait()
    assert f"pid {proc.pid} on " in (run.out / run_dir.LOCK).read_text()
    resumed, ckpt = started(Config(out=str(run.out)), resume=True)
    assert ckpt["step"] == 1 and f"pid {os.getpid()} on " in (run.out / run_dir.LOCK).read_text()
    run_dir.release(run.out)
    assert sorted(p.name for p in run.out.iterdir()) == ["best.pt", "checkpoint_1.pt", "config.json", "last.pt",
                                                         "metrics.jsonl", "summary.json"]


def test_what_a_start_wrote_before_its_config_is_replaced_by_the_next_run_and_config_json_ends_that(tmp_path):
    out = tmp_path / "run"
    run_dir.prepare(out)
    (out / "spm.model").write_text("a tokenizer trained before the data failed")
    run_dir.release(out)
    assert run_dir.failed_start(out)
    with pytest.raises(run_dir.RunDirError, match="stopped before writing config.json"):
        run_dir.prepare(out, resume=True)
    run, _ = started(Config(out=str(out)))  # no flag needed: the start's own files, removed
    assert not (out / "spm.model").exists() and not run_dir.failed_start(out)
    assert not (out / run_dir.STARTED).exists()
    train_steps(run, [1])
    run.finish(lambda last: {})
    with pytest.raises(run_dir.RunDirError, match="already holds files"):
        run_dir.prepare(out)
    stray = tmp_path / "stray"  # the marker's name alone with a config.json: a run, refused as any
    stray.mkdir()
    (stray / "config.json").write_text("{}")
    (stray / run_dir.STARTED).touch()
    with pytest.raises(run_dir.RunDirError, match="already holds files"):
        run_dir.prepare(stray)
