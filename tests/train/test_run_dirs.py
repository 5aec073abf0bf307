"""Run directories that survive being moved, a process killed mid-write or before its first checkpoint; one place per
model setting."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from skiplab import run_dir
from skiplab.cli import main
from skiplab.train.image import ImageTrainConfig, train
from skiplab.train.run import Run
from tests.train.test_distributed import one_thread
from tests.train.test_lm import args as lm_args
from tests.train.test_lm import text  # noqa: F401 (a fixture)
from tests.train.test_mt import corpus, interrupt_after_step, tiny_args  # noqa: F401 (corpus is a fixture)

IMAGE = ["train", "image", "--dataset", "fashion-mnist", "--epochs", "3", "--train-subset", "128",
         "--batch-size", "64"]


def image_args(fashion_dir, out, *extra):
    return [*IMAGE, "--data-dir", str(fashion_dir), "--out", str(out), *extra]


def stop_after_epoch(monkeypatch, epoch: int, torn: bool = False):
    """Stop training (as a kill does) once epoch ``epoch``'s checkpoint is written; with ``torn``, its metrics
    line is cut half-way, as a process killed while appending leaves it. Return the undo."""
    real = run_dir.append_metrics

    def append(out, record):
        if record["epoch"] == epoch and torn:
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record)[:25])
            raise KeyboardInterrupt
        real(out, record)
        if record["epoch"] == epoch:
            raise KeyboardInterrupt

    monkeypatch.setattr(run_dir, "append_metrics", append)
    return lambda: monkeypatch.setattr(run_dir, "append_metrics", real)


def same_weights(a, b):
    x, y = (torch.load(p / "last.pt", weights_only=True)["model"] for p in (a, b))
    for key in x:
        torch.testing.assert_close(y[key], x[key], rtol=0, atol=0, msg=key)


def move_and_resume(task, first, moved, capsys):
    """Move the stopped run ``first`` to ``moved``, resume it there, check that it says so; return ``moved``."""
    shutil.move(first, moved)
    capsys.readouterr()
    assert main(["train", task, "--resume", "--out", str(moved)]) == 0
    assert f"resumed with out {first} -> {moved}" in capsys.readouterr().out
    return moved


def records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def straight(fashion_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "run"
    assert main(image_args(fashion_dir, out)) == 0
    return out


def test_a_moved_run_resumes_and_ends_as_an_uninterrupted_one(fashion_dir, straight, tmp_path, monkeypatch, capsys):
    first = tmp_path / "cluster" / "a"
    undo = stop_after_epoch(monkeypatch, 1)
    assert main(image_args(fashion_dir, first)) == 130  # interrupted
    undo()
    moved = move_and_resume("image", first, tmp_path / "here" / "b", capsys)
    same_weights(straight, moved)
    assert [r["epoch"] for r in records(moved)] == [1, 2, 3]
    assert json.loads((moved / "config.json").read_text())["config"]["out"] == str(moved)
    # what a run is still counts: another learning rate is another run
    assert main(["train", "image", "--resume", "--out", str(moved), "--lr", "0.5"]) == 2
    assert "another config (different lr)" in capsys.readouterr().err


def test_a_torn_last_metrics_line_is_dropped_on_resume(fashion_dir, straight, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    undo = stop_after_epoch(monkeypatch, 2, torn=True)
    assert main(image_args(fashion_dir, out)) == 130  # interrupted
    undo()
    assert torch.load(out / "last.pt", weights_only=True)["epoch"] == 2
    with pytest.raises(run_dir.RunDirError, match=r"metrics.jsonl, line 2: not a JSON record"):
        run_dir.read_metrics(out)  # outside a resume a torn line is an error naming file and line
    capsys.readouterr()
    assert main(["train", "image", "--resume", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "metrics.jsonl: dropped a torn last line (line 2)" in said and "at epoch 2" in said
    same_weights(straight, out)
    # the checkpoint holds its own record: epoch 2's line, lost to the tear, is back as the straight run wrote it
    assert [{k: v for k, v in r.items() if k != "time"} for r in records(out)] == \
        [{k: v for k, v in r.items() if k != "time"} for r in records(straight)]


def test_records_past_the_checkpoint_are_dropped_and_said(fashion_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    undo = stop_after_epoch(monkeypatch, 1)
    assert main(image_args(fashion_dir, out)) == 130  # interrupted
    undo()
    with open(out / "metrics.jsonl", "a") as f:  # a record the checkpoint does not cover (killed before saving)
        f.write(json.dumps({"epoch": 2, "train_loss": 9.0}) + "\n")
    message = run_dir.resume_metrics(out, 1)
    assert "dropped 1 record(s) past the checkpoint (epoch 2)" in message
    assert [r["epoch"] for r in records(out)] == [1]


def test_a_torn_line_before_the_last_is_a_one_line_error_and_nothing_is_rewritten(fashion_dir, tmp_path, monkeypatch,
                                                                                   capsys):
    out = tmp_path / "run"
    undo = stop_after_epoch(monkeypatch, 2)
    assert main(image_args(fashion_dir, out)) == 130  # interrupted
    undo()
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text(lines[0][:20] + "\n" + lines[1] + "\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main(["train", "image", "--resume", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'metrics.jsonl'}, line 1: not a JSON record" in err and err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_moved_translation_run_resumes_exactly(corpus, tmp_path, monkeypatch, capsys):  # noqa: F811
    straight = tmp_path / "straight"
    assert main(tiny_args(corpus, straight)) == 0
    first = tmp_path / "a"
    undo = interrupt_after_step(monkeypatch, 2)
    assert main(tiny_args(corpus, first)) == 130
    undo()
    moved = move_and_resume("mt", first, tmp_path / "elsewhere" / "b", capsys)
    same_weights(straight, moved)
    assert [r["step"] for r in records(moved)] == [2, 4]


# -- one place per setting: the model spec holds the connection ----------------------------------------
def test_the_model_specs_connection_trains_that_connection(fashion_dir, tmp_path):
    out = tmp_path / "sas"
    argv = [*IMAGE[:-6], "--epochs", "1", "--train-subset", "64", "--batch-size", "64", "--data-dir",
            str(fashion_dir), "--model", "preact-resnet20(connection=SAS,depth=8)", "--out", str(out)]
    assert main(argv) == 0
    stored = json.loads((out / "config.json").read_text())
    assert stored["model"]["connection"] == "SAS" and stored["model"]["depth"] == 8
    assert stored["config"]["model"] == "preact-resnet20(connection=SAS,depth=8)" and "connection" not in stored["config"]
    weights = torch.load(out / "last.pt", weights_only=True)["model"]
    assert any(".conn.alpha." in k for k in weights)  # SAS's gates, not 1xSkip's nothing


def test_a_conflicting_connection_is_refused_before_anything_is_written(fashion_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [*IMAGE, "--data-dir", str(fashion_dir), "--model", "preact-resnet20(connection=SAS)", "--connection",
            "2rSkip+LN", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "connection is set twice: connection=SAS in 'preact-resnet20(connection=SAS)' and connection=2rSkip+LN" in err
    assert err.count("\n") == 1 and not out.exists()
    assert main([*IMAGE, "--data-dir", str(fashion_dir), "--model", "preact-resnet20(connection=SAS)",
                 "--connection", "SAS", "--epochs", "1", "--train-subset", "64", "--out", str(out)]) == 0  # the same


def test_the_translation_model_specs_connection_trains_that_connection(corpus, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "sas"
    args = tiny_args(corpus, out, "--max-steps", "2", "--save-every", "2")
    assert main([*args, "--model", "transformer-small(connection=SAS)"]) == 0
    assert json.loads((out / "config.json").read_text())["model"]["connection"] == "SAS"
    assert any(".conn_ffn.alpha." in k for k in torch.load(out / "last.pt", weights_only=True)["model"])
    other = tmp_path / "other"
    assert main([*tiny_args(corpus, other), "--model", "transformer-small(connection=SAS)", "--connection",
                 "PreLN"]) == 2
    assert "connection is set twice" in capsys.readouterr().err and not other.exists()


def test_a_config_written_before_the_model_spec_held_the_connection_upgrades():
    old = {"model": "preact-resnet20", "connection": "2rSkip+LN", "width": 1, "dataset": "fashion-mnist"}
    assert ImageTrainConfig.upgrade(old)["model"] == "preact-resnet20(connection=2rSkip+LN)"
    # the separate field won over the spec's option: the upgrade says what was trained
    old = {"model": "preact-resnet20(connection=SAS)", "connection": "1xSkip", "width": 2}
    assert ImageTrainConfig.upgrade(old)["model"] == "preact-resnet20(width=2)"
    assert "connection" not in ImageTrainConfig.upgrade(old)


def test_an_old_image_run_resumes(fashion_dir, tmp_path, monkeypatch):
    straight = tmp_path / "straight"
    train(ImageTrainConfig(model="preact-resnet20(connection=2xSkip,depth=8)", dataset="fashion-mnist",
                           data_dir=str(fashion_dir), epochs=2, train_subset=64, batch_size=32, out=str(straight)),
          progress=False)
    old = tmp_path / "old"
    undo = stop_after_epoch(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        train(ImageTrainConfig(model="preact-resnet20(connection=2xSkip,depth=8)", dataset="fashion-mnist",
                               data_dir=str(fashion_dir), epochs=2, train_subset=64, batch_size=32, out=str(old)),
              progress=False)
    undo()
    # rewrite it as an older skiplab wrote it: connection and width as fields of their own
    def legacy(cfg):
        return {**cfg, "model": "preact-resnet20(depth=8)", "connection": "2xSkip", "width": 1}
    stored = json.loads((old / "config.json").read_text())
    run_dir.write_json(old / "config.json", {**stored, "config": legacy(stored["config"])})
    ckpt = torch.load(old / "last.pt", weights_only=True)
    run_dir.save_checkpoint(old / "last.pt", {**ckpt, "config": legacy(ckpt["config"])})
    assert main(["train", "image", "--resume", "--out", str(old)]) == 0
    same_weights(straight, old)


def stop_at_first_save(monkeypatch):
    """Stop training (as a kill does) at its first save, before the checkpoint is written: the run leaves its
    config.json (and its lock file) alone. Return the undo."""
    real = Run.save

    def kill(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Run, "save", kill)
    return lambda: monkeypatch.setattr(Run, "save", real)


def test_an_image_run_stopped_before_its_first_checkpoint_resumes_from_the_beginning(fashion_dir, straight, tmp_path,
                                                                                    monkeypatch, capsys):
    out = tmp_path / "run"
    undo = stop_at_first_save(monkeypatch)
    assert main(image_args(fashion_dir, out)) == 130
    undo()
    assert sorted(p.name for p in out.iterdir() if p.name != run_dir.LOCK) == ["config.json"]
    capsys.readouterr()
    assert main(["train", "image", "--resume", "--out", str(out)]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if "first checkpoint" in x]
    assert lines == [f"{out}: stopped before its first checkpoint; the run starts again from the beginning"]
    same_weights(straight, out)
    assert [r["epoch"] for r in records(out)] == [1, 2, 3]


def test_an_lm_run_stopped_before_its_first_checkpoint_resumes_from_the_beginning(text, tmp_path, monkeypatch,
                                                                                 capsys):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    with one_thread():
        assert main([str(a) for a in lm_args(text, straight)]) == 0
        undo = stop_at_first_save(monkeypatch)
        assert main([str(a) for a in lm_args(text, stopped)]) == 130
        undo()
        assert sorted(p.name for p in stopped.iterdir() if p.name != run_dir.LOCK) == ["config.json"]
        capsys.readouterr()
        assert main(["train", "lm", "--resume", "--out", str(stopped)]) == 0
    assert "stopped before its first checkpoint; the run starts again from the beginning" in capsys.readouterr().out
    same_weights(straight, stopped)
    assert records(stopped) == [{**r, "tokens_per_s": s["tokens_per_s"], "time": s["time"]}
                                for r, s in zip(records(straight), records(stopped))]


def test_a_run_stopped_before_its_first_checkpoint_refuses_another_config(text, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    undo = stop_at_first_save(monkeypatch)
    with one_thread():
        assert main([str(a) for a in lm_args(text, out)]) == 130
    undo()
    written = (out / "config.json").read_bytes()
    capsys.readouterr()
    assert main(["train", "lm", "--resume", "--out", str(out), "--lr", "0.01"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a run with another config (different lr)" in err
    assert (out / "config.json").read_bytes() == written  # nothing rewritten, nothing removed
    assert sorted(p.name for p in out.iterdir() if p.name != run_dir.LOCK) == ["config.json"]
    shutil.rmtree(out)
    assert main(["train", "lm", "--resume", "--out", str(out)]) == 2  # nothing there: still nothing to resume
    assert "nothing to resume" in capsys.readouterr().err


def test_a_checkpoint_write_interrupted_leaves_no_part_behind(tmp_path, monkeypatch):
    """Ctrl-C while torch.save writes: the part written (last.pt.tmp) was left in the run directory; the file it
    replaces stays whole."""
    run_dir.save_checkpoint(tmp_path / "last.pt", {"step": 1})

    def interrupted(state, path):
        Path(path).write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_dir.save_checkpoint(tmp_path / "last.pt", {"step": 2})
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
    assert torch.load(tmp_path / "last.pt", weights_only=True) == {"step": 1}


def test_sigterm_during_an_overwrite_puts_the_replaced_run_back(fashion_dir, straight, tmp_path, monkeypatch, capsys):
    """SIGTERM (a batch system's stop) ends a command as Ctrl-C does: exit 143, one line, the lock removed, and a
    run that --overwrite was replacing put back (before, the process died at once and left it in .replaced)."""
    out = tmp_path / "run"
    shutil.copytree(straight, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    real = run_dir.write_config

    def killed(path, payload):  # the stop arrives once the run is set aside, before its replacement is written
        assert (out / run_dir.REPLACED).is_dir()
        os.kill(os.getpid(), signal.SIGTERM)
        real(path, payload)

    monkeypatch.setattr(run_dir, "write_config", killed)
    capsys.readouterr()
    assert main(image_args(fashion_dir, out, "--overwrite")) == 143
    err = capsys.readouterr().err
    assert err.startswith("skiplab: terminated (SIGTERM)") and err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert not (out / run_dir.LOCK).exists() and not (out / run_dir.REPLACED).exists()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # put back as it was


def test_sigterm_stops_a_training_process_cleanly(fashion_dir, tmp_path):
    """A real process: SIGTERM while it trains leaves its lock removed and its last checkpoint to resume from."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "skiplab", *image_args(fashion_dir, out)[:5], "200",
                             *image_args(fashion_dir, out)[6:]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 180
    while not (out / "last.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "skiplab: terminated (SIGTERM)" in err and "Traceback" not in err
    assert not (out / run_dir.LOCK).exists() and (out / "last.pt").is_file()


def test_a_comparisons_worker_stopped_by_its_parent_lets_go_of_its_run(tmp_path):
    """compare --jobs 2 interrupted: the parent ends its pool with SIGTERM, which killed each worker where it stood,
    its run's lock left behind. A worker lets go of its run first (the lock removed) and exits 143."""
    out = tmp_path / "run"
    script = ("import os, signal, sys, time\n"
              "from pathlib import Path\n"
              "from skiplab import run_dir\n"
              "from skiplab.tasks.parallel import _leave_interrupts_to_the_parent\n"
              "_leave_interrupts_to_the_parent()\n"
              "out = Path(sys.argv[1]); run_dir.prepare(out)\n"
              "assert (out / run_dir.LOCK).is_file()\n"
              "os.kill(os.getpid(), signal.SIGTERM)\n"
              "time.sleep(30)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 143, proc.stderr
    assert not (out / run_dir.LOCK).exists() and "Traceback" not in proc.stderr
