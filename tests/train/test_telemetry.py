"""Per-step telemetry: the spike rule and the gradient norm by hand, the lines of a run, exact resume with it on,
a diverged run's last line, the FLOP count, and the loggers (TensorBoard, W&B offline, trackio on local files)."""

import json
import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from skiplab.models import GPT, GPTConfig
from skiplab import run_dir
from skiplab.train import telemetry
from skiplab.train.telemetry import FACTOR, WINDOW, Telemetry, cut_lines, grad_norm, read_lines
from tests.train.test_distributed import one_thread
from tests.train.test_lm import args, run, text  # noqa: F401  (the fixture)
from tests.train.test_mt import interrupt_after_step

SAME = ("step", "loss", "lr", "grad_norm", "clipped", "spike")  # what does not depend on the clock


def test_a_spike_is_a_loss_above_k_times_the_median_of_the_window_before_it():
    watch = Telemetry(every=1)
    for t in range(1, WINDOW + 1):  # the first W updates are never spikes, however they jump
        watch.update(t, 2.0 if t % 2 else 50.0, 1e-3, 1.0, False, 10, 1.0)
    assert watch.spikes == 0
    median = 26.0  # of 50 x 2.0 and 50 x 50.0
    watch.update(WINDOW + 1, FACTOR * median + 0.01, 1e-3, 3.0, True, 10, 1.0)
    assert watch.spikes == 1 and watch.pending[-1]["spike"]
    watch.update(WINDOW + 2, FACTOR * 26.0 - 0.01, 1e-3, 0.5, False, 10, 1.0)  # the window moved on by one
    assert watch.spikes == 1 and not watch.pending[-1]["spike"]
    assert watch.summary()["max_grad_norm"] == 3.0 and watch.summary()["clipped_updates"] == 1
    restored = Telemetry(every=1)
    restored.load_state(json.loads(json.dumps(watch.state())))  # what a checkpoint keeps
    assert restored.summary() == watch.summary() and list(restored.losses) == list(watch.losses)


def test_lines_every_n_updates_and_the_last():
    watch = Telemetry(every=4, flops_per_token=100.0)
    for t in range(1, 11):
        watch.update(t, 1.0, 0.1, 1.0, False, tokens=50, seconds=0.5, last=t == 10)
    lines = watch.take()
    assert [x["step"] for x in lines] == [4, 8, 10] and watch.take() == []
    assert lines[0]["tokens_per_s"] == 100.0 and lines[0]["model_flops_per_s"] == 1e4 and lines[0]["mfu"] is None


def test_the_gradient_norm_is_the_global_norm_before_clipping():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5))]
    grads = [torch.randn(3, 4) * 3, torch.randn(5) * 3]
    by_hand = math.sqrt(sum(float((g ** 2).sum()) for g in grads))
    for clip, clipped in ((0.0, False), (by_hand + 1, False), (1.0, True)):
        for p, g in zip(params, grads):
            p.grad = g.clone()
        norm, was = grad_norm(params, clip)
        assert norm == pytest.approx(by_hand, rel=1e-6) and was == clipped
        after = math.sqrt(sum(float((p.grad ** 2).sum()) for p in params))
        assert after == pytest.approx(min(by_hand, clip) if clip else by_hand, rel=1e-5)


def test_flops_per_token_is_6n_plus_12_l_d_t():
    cfg = GPTConfig(vocab_size=50, d_model=16, heads=2, layers=3, ffn_dim=32, context=8, positions="learned")
    model = GPT(cfg)
    n = sum(p.numel() for p in model.parameters()) - 8 * 16  # the position table is a lookup
    assert model.flops_per_token() == 6 * n + 12 * 3 * 16 * 8


def test_a_run_writes_its_lines_and_summary(text, tmp_path):  # noqa: F811
    out = tmp_path / "r"
    with one_thread():
        assert run(args(text, out, "--log-every", "2", "--clip-norm", "0.5")) == 0
    lines = read_lines(out)
    assert [x["step"] for x in lines] == [2, 4, 6]
    assert all(x["grad_norm"] > 0 and x["clipped"] == (x["grad_norm"] > 0.5) for x in lines)
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["lr"] for x in lines if x["step"] in (3, 6)] == [m["lr"] for m in metrics if m["step"] == 6]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["loss_spikes"] == 0 and summary["max_grad_norm"] >= max(x["grad_norm"] for x in lines)
    assert "median of the 100 updates" in summary["spike_rule"]


def test_resume_is_exact_with_telemetry_on(text, tmp_path, monkeypatch):  # noqa: F811
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    with one_thread():
        assert run(args(text, straight, "--log-every", "1")) == 0
        undo = interrupt_after_step(monkeypatch, 3)
        assert run(args(text, stopped, "--log-every", "1")) == 130  # after step 3's checkpoint
        undo()
        with open(stopped / "steps.jsonl", "a") as f:  # a line past the checkpoint, as a killed run could leave
            f.write(json.dumps({"step": 5, "loss": 9.0}) + "\n")
        assert run(["train", "lm", "--resume", "--out", stopped]) == 0
    a, b = read_lines(straight), read_lines(stopped)
    assert [x["step"] for x in b] == list(range(1, 7))
    assert [{k: x[k] for k in SAME} for x in a] == [{k: x[k] for k in SAME} for x in b]
    sa, sb = (json.loads((r / "summary.json").read_text()) for r in (straight, stopped))
    assert {k: sa[k] for k in ("loss_spikes", "max_grad_norm", "clipped_updates")} == \
           {k: sb[k] for k in ("loss_spikes", "max_grad_norm", "clipped_updates")}
    ma, mb = (torch.load(r / "last.pt", weights_only=True)["model"] for r in (straight, stopped))
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


@pytest.mark.parametrize("at", ["lines", "checkpoint", "best", "last", "metrics"])
def test_a_run_stopped_anywhere_in_a_save_resumes_to_the_same_files(text, tmp_path, monkeypatch, at):  # noqa: F811
    """Stopped in the middle of the last save (step 6's), before the file ``at`` is written (or the lines appended):
    the resumed run's steps.jsonl, metrics.jsonl, best.pt and weights are the uninterrupted run's. last.pt came first
    and the lines, held in memory, last: a run stopped between them lost steps 5-6's lines, and its best.pt stayed
    step 4's."""
    extra = ("--eval-every", "2", "--keep-checkpoints", "9")
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    with one_thread():
        assert run(args(text, straight, *extra)) == 0
    assert torch.load(straight / "best.pt", weights_only=True)["step"] == 6  # improved at the last save
    stops = []

    def stop_at_step_6(name):
        def wrapped(real):
            def call(*a, **kw):
                path_or_out, state = a[0], a[1]
                step = state.get("step") if isinstance(state, dict) else None
                steps = [x.get("step") for x in state] if isinstance(state, list) else []
                is_here = name in (None, getattr(path_or_out, "name", None)) and (step == 6 or 6 in steps)
                if is_here and not stops:
                    stops.append(name)
                    raise KeyboardInterrupt
                return real(*a, **kw)
            return call
        return wrapped

    if at == "lines":
        monkeypatch.setattr(telemetry, "append_lines", stop_at_step_6(None)(telemetry.append_lines))
    elif at == "metrics":
        monkeypatch.setattr(run_dir, "append_metrics", stop_at_step_6(None)(run_dir.append_metrics))
    else:
        name = {"checkpoint": "checkpoint_6.pt", "best": "best.pt", "last": "last.pt"}[at]
        monkeypatch.setattr(run_dir, "save_checkpoint", stop_at_step_6(name)(run_dir.save_checkpoint))
    with one_thread():
        assert run(args(text, stopped, *extra)) == 130
    monkeypatch.undo()
    assert stops
    with one_thread():
        assert run(["train", "lm", "--resume", "--out", stopped]) == 0
    a, b = read_lines(straight), read_lines(stopped)
    assert [{k: x[k] for k in SAME} for x in a] == [{k: x[k] for k in SAME} for x in b]
    clock = ("time", "tokens_per_s")
    ma, mb = ([{k: v for k, v in json.loads(x).items() if k not in clock} for x in (r / "metrics.jsonl").read_text()
               .splitlines()] for r in (straight, stopped))
    assert ma == mb
    for name in ("best.pt", "last.pt"):
        ca, cb = (torch.load(r / name, weights_only=True) for r in (straight, stopped))
        assert ca["step"] == cb["step"] and all(torch.equal(ca["model"][k], cb["model"][k]) for k in ca["model"])
    assert sorted(p.name for p in stopped.glob("*.pt*")) == sorted(p.name for p in straight.glob("*.pt*"))


def test_a_torn_last_line_is_cut_and_the_file_replaced_whole(tmp_path):
    """A process killed while writing a line left half of it: the resume failed on it, naming no file ("Expecting
    property name ..."), every time. A bad line before the last is what no killed process leaves: an error naming it."""
    path = tmp_path / "steps.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"st')
    cut_lines(tmp_path, 2)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n' and not list(tmp_path.glob("*.tmp"))
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"steps.jsonl, line 2: not a line of per-step telemetry"):
        cut_lines(tmp_path, 2)
    assert path.read_text() == '{"step": 1}\nnot json\n{"step": 3}\n'  # nothing rewritten


def test_a_diverged_run_keeps_the_lines_up_to_its_non_finite_loss(text, tmp_path):  # noqa: F811
    out = tmp_path / "boom"
    with one_thread():
        assert run(args(text, out, "--lr", "1e4", "--min-lr", "0", "--warmup", "0", "--clip-norm", "0",
                        "--log-every", "1", "--max-steps", "60", "--eval-every", "60")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged"
    lines = read_lines(out)
    assert lines[-1]["step"] == summary["step"] and not math.isfinite(lines[-1]["loss"])
    assert [x["step"] for x in lines] == list(range(1, summary["step"] + 1)) and "max_grad_norm" in summary


def test_bad_loggers_are_one_line(text, tmp_path, capsys, monkeypatch):  # noqa: F811
    assert run(args(text, tmp_path / "a", "--logger", "tensorboard,neptune")) == 2
    err = capsys.readouterr().err.strip()
    assert err == "skiplab: error: --logger: unknown logger 'neptune'; known: tensorboard, wandb, trackio"
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert run(args(text, tmp_path / "b", "--logger", "wandb")) == 2
    err = capsys.readouterr().err.strip()
    assert err == "skiplab: error: --logger wandb needs the wandb package: pip install wandb"


def test_tensorboard_gets_every_line(text, tmp_path):  # noqa: F811
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    with one_thread():
        assert run(args(text, out, "--log-every", "1", "--logger", "tensorboard")) == 0
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    lines = read_lines(out)
    for key in ("loss", "grad_norm", "lr"):
        scalars = events.Scalars(f"train/{key}")
        assert [(s.step, pytest.approx(s.value, rel=1e-6)) for s in scalars] == [(x["step"], x[key]) for x in lines]


def cli(argv, **env) -> subprocess.CompletedProcess:
    """skiplab in a fresh process (a logger's package reads its environment when imported)."""
    return subprocess.run([sys.executable, "-m", "skiplab", *map(str, argv)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env}, cwd=Path(__file__).resolve().parents[2])


def test_wandb_offline_gets_the_lines(text, tmp_path):  # noqa: F811
    pytest.importorskip("wandb")
    out = tmp_path / "wb"
    done = cli(args(text, out, "--log-every", "2", "--logger", "wandb"), WANDB_MODE="offline", WANDB_SILENT="true")
    assert done.returncode == 0, done.stderr
    (record,) = (out / "wandb").glob("offline-run-*/run-*.wandb")  # what `wandb sync` would upload
    data = record.read_bytes()  # wandb's record log: each logged value is kept as its JSON text
    lines = read_lines(out)
    assert [x["step"] for x in lines] == [2, 4, 6] and data.count(b"train/loss") >= len(lines)  # history, summary
    for x in lines:
        assert json.dumps(x["loss"]).encode() in data and json.dumps(x["grad_norm"]).encode() in data


def test_trackio_gets_the_lines_on_local_files(text, tmp_path):  # noqa: F811
    pytest.importorskip("trackio")
    out, store = tmp_path / "tk", tmp_path / "trackio"
    done = cli(args(text, out, "--log-every", "2", "--logger", "trackio"), TRACKIO_DIR=str(store))
    assert done.returncode == 0, done.stderr
    (db,) = store.glob("*.db")
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT step, metrics FROM metrics ORDER BY step").fetchall()
    assert [(s, json.loads(m)["train/loss"]) for s, m in rows] == [(x["step"], pytest.approx(x["loss"], rel=1e-6))
                                                                    for x in read_lines(out)]


def test_curves_draw_the_loss_and_gradient_norm_of_every_logged_update(text, tmp_path, monkeypatch):  # noqa: F811
    from skiplab.analysis import curves

    out = tmp_path / "r"
    with one_thread():
        assert run(args(text, out, "--log-every", "1")) == 0
    drawn = []
    real = curves.draw_curves
    monkeypatch.setattr(curves, "draw_curves", lambda axes, groups, keys, x: drawn.append((groups, keys, x))
                        or real(axes, groups, keys, x))
    assert run(["curves", out, "--out", tmp_path / "c.png"]) == 0
    (_, metric_keys, _), (groups, step_keys, x) = drawn
    assert metric_keys == ("train_loss", "valid_loss", "valid_ppl") and (step_keys, x) == (("loss", "grad_norm"), "step")
    (lines,) = groups.values()
    assert lines == [read_lines(out)] and (tmp_path / "c.png").stat().st_size > 10_000
    drawn.clear()
    assert run(["curves", out, "--keys", "valid_loss", "--out", tmp_path / "d.png"]) == 0
    assert len(drawn) == 0  # keys given: the figure they ask for alone (plot_curves draws it)
