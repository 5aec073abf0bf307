"""Image training end to end on a tiny dataset written in Fashion-MNIST's format."""

import dataclasses
import json
import math

import pytest
import torch

from skiplab.cli import build_parser, main
from skiplab.models import PreActResNet
from skiplab.train import image as image_train
from skiplab import run_dir
from skiplab.tasks import arguments
from skiplab.train.image import ImageTrainConfig, learning_rate, milestones, train
from tests.noise import DELTA, assert_within_noise, image_training_in_float64, noise


def tiny(fashion_dir, out, **kw) -> ImageTrainConfig:
    fields = dict(dataset="fashion-mnist", data_dir=str(fashion_dir), epochs=1, batch_size=64, out=str(out))
    return ImageTrainConfig(**{**fields, **kw})


def test_cli_run_writes_config_metrics_checkpoints_and_summary(fashion_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "image", "--dataset", "fashion-mnist", "--data-dir", str(fashion_dir), "--epochs", "1",
            "--train-subset", "200", "--batch-size", "64", "--connection", "2rSkip + LN", "--out", str(out)]
    assert main(argv) == 0  # the spaces the grammar ignores are not recorded (a later command compares one spelling)
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["model"] == "preact-resnet20(connection=2rSkip+LN)" and config["config"]["seed"] == 1
    assert config["model"]["connection"] == "2rSkip+LN" and "connection" not in config["config"]
    assert config["data"]["train"] == 200 and config["model"]["in_channels"] == 1
    (record,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert set(record) >= {"epoch", "train_loss", "train_error", "test_loss", "test_error", "lr", "time"}
    assert (out / "last.pt").is_file() and (out / "best.pt").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["final_test_error"] == record["test_error"]
    assert summary["steps"] == record["step"] == 4  # ⌈200 / 64⌉ updates: what a comparison's time per update divides by

    capsys.readouterr()
    assert main(["eval", "image", "--checkpoint", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["test_error"] == pytest.approx(record["test_error"]) and result["test_images"] == 64


def test_an_existing_run_is_never_overwritten_silently(fashion_dir, tmp_path, capsys):
    out = tmp_path / "run"
    train(tiny(fashion_dir, out, train_subset=64), progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["train", "image", "--dataset", "fashion-mnist", "--data-dir", str(fashion_dir), "--out", str(out)]) == 2
    assert "already holds files; use --resume" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    summary = train(tiny(fashion_dir, out, train_subset=64, seed=2), overwrite=True, progress=False)
    assert summary["config"]["seed"] == 2


def test_resume_after_a_stop_continues_exactly(fashion_dir, tmp_path, monkeypatch):
    straight = tmp_path / "straight"
    train(tiny(fashion_dir, straight, epochs=3, train_subset=128), progress=False)

    stopped = tmp_path / "stopped"
    real_append = run_dir.append_metrics

    def stop_after_first_epoch(out, record):
        real_append(out, record)
        if record["epoch"] == 1:
            raise KeyboardInterrupt  # the process is killed after epoch 1's checkpoint

    monkeypatch.setattr(run_dir, "append_metrics", stop_after_first_epoch)
    with pytest.raises(KeyboardInterrupt):
        train(tiny(fashion_dir, stopped, epochs=3, train_subset=128), progress=False)
    monkeypatch.setattr(run_dir, "append_metrics", real_append)
    assert torch.load(stopped / "last.pt", weights_only=True)["epoch"] == 1

    assert main(["train", "image", "--resume", "--out", str(stopped)]) == 0  # config comes from the run
    a = torch.load(straight / "last.pt", weights_only=True)
    b = torch.load(stopped / "last.pt", weights_only=True)
    assert b["epoch"] == 3
    for key in a["model"]:
        torch.testing.assert_close(b["model"][key], a["model"][key], rtol=0, atol=0, msg=key)
    epochs = [json.loads(line)["epoch"] for line in (stopped / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2, 3]


def test_resume_with_changed_settings_is_refused(fashion_dir, tmp_path, capsys):
    out = tmp_path / "run"
    train(tiny(fashion_dir, out, train_subset=64), progress=False)
    assert main(["train", "image", "--resume", "--out", str(out), "--lr", "0.5"]) == 2
    assert "another config" in capsys.readouterr().err


def test_a_non_finite_loss_stops_the_run_naming_epoch_and_step(fashion_dir, tmp_path, monkeypatch, capsys):
    calls = {"n": 0}
    real_forward = PreActResNet.forward

    def blow_up_on_third_step(self, x):
        calls["n"] += 1
        out = real_forward(self, x)
        return out * float("nan") if calls["n"] == 3 else out

    monkeypatch.setattr(PreActResNet, "forward", blow_up_on_third_step)
    out = tmp_path / "run"
    summary = train(tiny(fashion_dir, out, train_subset=256, model="preact-resnet20(connection=2xSkip)"), progress=False)
    assert summary["status"] == "diverged" and (summary["epoch"], summary["step"]) == (1, 3)
    assert "non-finite loss (nan) at epoch 1, step 3" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["status"] == "diverged"


def test_a_non_finite_test_loss_after_the_last_update_is_a_divergence(fashion_dir, tmp_path, monkeypatch, capsys):
    """A finite training loss whose update left non-finite weights: the test loss says so; the error an argmax over
    NaN logits gives is no result (every design would read the same)."""
    import skiplab.train.image as image

    monkeypatch.setattr(image, "evaluate", lambda *a, **k: (math.nan, 90.0))
    out = tmp_path / "run"
    summary = train(tiny(fashion_dir, out, train_subset=128), progress=False)
    assert summary["status"] == "diverged" and (summary["epoch"], summary["step"]) == (1, 2)
    assert "non-finite test loss (nan) at epoch 1, step 2: the run diverged" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["status"] == "diverged"
    assert not (out / "metrics.jsonl").exists() and not (out / "last.pt").exists()  # no record of NaN weights


def test_learning_rate_schedule():
    cfg = ImageTrainConfig()
    assert milestones(164) == (81, 122) and milestones(10) == (5, 7)
    assert milestones(2) == (1, 2) and milestones(1) == (1, 2) and milestones(3) == (1, 2)  # three phases where room
    two = ImageTrainConfig(epochs=2)
    assert [learning_rate(two, 20, epoch=e, step=10**5) for e in (0, 1)] == [0.1, pytest.approx(0.01)]
    assert learning_rate(cfg, 110, epoch=0, step=0) == 0.01  # warm-up for depth >= 110
    assert learning_rate(cfg, 110, epoch=0, step=399) == 0.01
    assert learning_rate(cfg, 110, epoch=1, step=400) == 0.1
    assert learning_rate(cfg, 20, epoch=0, step=0) == 0.1  # no warm-up below 110
    assert learning_rate(cfg, 20, epoch=80, step=10**5) == 0.1
    assert learning_rate(cfg, 20, epoch=81, step=10**5) == pytest.approx(0.01)
    assert learning_rate(cfg, 20, epoch=122, step=10**5) == pytest.approx(0.001)
    short = ImageTrainConfig(epochs=10, warmup_iters=5)
    assert learning_rate(short, 20, epoch=0, step=4) == 0.01 and learning_rate(short, 20, epoch=5, step=50) == pytest.approx(0.01)


def test_bad_checkpoints_give_one_line_errors(fashion_dir, tmp_path, capsys):
    out = tmp_path / "run"
    train(tiny(fashion_dir, out, train_subset=64), progress=False)
    ckpt = torch.load(out / "last.pt", weights_only=True)

    other = dict(ckpt, model_config={**ckpt["model_config"], "depth": 32})  # weights of a 20-layer model
    torch.save(other, tmp_path / "other.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    torch.save({"kind": "mt"}, tmp_path / "mt.pt")

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"kind": "image", "x": Evil()}, tmp_path / "evil.pt")
    for path, message in [("other.pt", "does not match the model"),
                          ("garbage.pt", "not a readable checkpoint (not a file torch.save wrote, or cut short"),
                          ("mt.pt", "not a skiplab image checkpoint"),
                          ("evil.pt", "not a readable checkpoint (it holds print, not only tensors")]:
        assert main(["eval", "image", "--checkpoint", str(tmp_path / path)]) == 2
        err = capsys.readouterr()
        assert message in err.err and err.err.count("\n") == 1, (path, err.err)
        assert "pwned" not in err.out


def test_bad_settings_fail_before_anything_is_written(fashion_dir, tmp_path, capsys):
    out = tmp_path / "run"
    for extra, message in [(["--connection", "2rskip+LN"], "did you mean 'rSkip'"),
                           (["--model", "resnet50"], "unknown model"),
                           (["--dataset", "imagenet"], "imagenet"),
                           # settings the data make: they were overridden, and the spec recorded as given
                           (["--model", "preact-resnet20(num_classes=5)"], "--model preact-resnet20(num_classes=5) "
                            "sets num_classes=5, but fashion-mnist has 10 classes: the data set it; leave "
                            "num_classes out"),
                           (["--model", "preact-resnet20(in_channels=3)"], "sets in_channels=3, but fashion-mnist "
                            "has 1 channel: the data set it"),
                           # more images than the split has: it was the whole split, recorded as asked
                           (["--train-subset", "257"], "--train-subset 257 is more than fashion-mnist's 256 training "
                            "images (0: all of them)"),
                           (["--test-subset", "65"], "--test-subset 65 is more than fashion-mnist's 64 test images"),
                           (["--momentum", "1"], "--momentum must be in [0, 1), got 1")]:
        argv = ["train", "image", "--dataset", "fashion-mnist", "--data-dir", str(fashion_dir), "--out", str(out)] + extra
        assert main(argv) == 2
        assert message in capsys.readouterr().err
        assert not out.exists()


def test_evaluate_matches_a_direct_computation(fashion_dir, tmp_path):
    out = tmp_path / "run"
    train(tiny(fashion_dir, out, train_subset=64), progress=False)
    cfg, model, _ = image_train.load_trained(out)
    from skiplab.data import load_image_dataset, normalise

    data = load_image_dataset("fashion-mnist", str(fashion_dir))
    with torch.no_grad():
        logits = model(normalise(data.test_x, data.mean, data.std))
    error = 100.0 * (logits.argmax(1) != data.test_y).float().mean().item()
    assert image_train.evaluate_checkpoint(out)["test_error"] == pytest.approx(error)


def test_device_choice():
    from skiplab.device import pick_device

    assert pick_device("cpu").type == "cpu"
    assert pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        pick_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            pick_device("cuda")


def test_a_run_written_before_the_multi_process_options_resumes(fashion_dir, tmp_path, monkeypatch):
    out = tmp_path / "old"
    real_append = run_dir.append_metrics

    def stop_after_first_epoch(out, record):
        real_append(out, record)
        raise KeyboardInterrupt

    monkeypatch.setattr(run_dir, "append_metrics", stop_after_first_epoch)
    with pytest.raises(KeyboardInterrupt):
        train(tiny(fashion_dir, out, epochs=2, train_subset=64), progress=False)
    monkeypatch.setattr(run_dir, "append_metrics", real_append)
    # what an older skiplab wrote: no sync_bn, compile or world size anywhere
    ckpt = torch.load(out / "last.pt", weights_only=True)
    del ckpt["world_size"], ckpt["config"]["sync_bn"], ckpt["config"]["compile"]
    torch.save(ckpt, out / "last.pt")
    stored = json.loads((out / "config.json").read_text())
    del stored["config"]["sync_bn"], stored["config"]["compile"], stored["environment"]["world_size"]
    (out / "config.json").write_text(json.dumps(stored))

    assert main(["train", "image", "--resume", "--out", str(out)]) == 0
    assert torch.load(out / "last.pt", weights_only=True)["epoch"] == 2
    assert main(["train", "image", "--resume", "--out", str(out), "--compile", "true"]) == 2  # a setting it lacked


@pytest.mark.slow
def test_a_compiled_model_trains_as_the_eager_one(fashion_dir, tmp_path):
    """torch.compile on a tiny PreAct-ResNet-8: two steps and an evaluation (about 30 s of compiling).

    Compiled and eager differ by float32 rounding, whose size depends on the CPU's kernels: the tolerance is
    FACTOR times the noise measured here (tests/noise.py), from the eager run against the same training in
    float64, and that float64 training against itself on images perturbed at float32 size (ReLU kinks)."""
    kw = dict(model="preact-resnet20(depth=8)", train_subset=64, test_subset=32, batch_size=32)
    eager = train(tiny(fashion_dir, tmp_path / "eager", **kw), progress=False)
    compiled = train(tiny(fashion_dir, tmp_path / "compiled", compile=True, **kw), progress=False)
    with image_training_in_float64():
        train(tiny(fashion_dir, tmp_path / "exact", **kw), progress=False)
    with image_training_in_float64(delta=DELTA):
        train(tiny(fashion_dir, tmp_path / "perturbed", **kw), progress=False)
    runs = ("eager", "compiled", "exact", "perturbed")
    a, b, exact, moved = (run_dir.read_metrics(tmp_path / name)[0] for name in runs)
    for key in ("train_loss", "test_loss"):
        level = noise((a[key], exact[key]), (moved[key], exact[key]))
        assert_within_noise(b[key], a[key], level, msg=key)
    x, y, x64, moved64 = (torch.load(tmp_path / name / "last.pt", weights_only=True)["model"] for name in runs)
    assert list(x) == list(y)  # the plain model's names, no "_orig_mod." prefix
    for key in x:
        assert_within_noise(y[key], x[key], noise((x[key], x64[key]), (moved64[key], x64[key])), msg=key)
    report = compiled["compile"]
    assert "compile" not in eager and report["graphs_compiled"] >= 2 and report["recompile_limit"] == 8
    assert set(report) == {"graphs_compiled", "frames_compiled", "recompiles", "graph_breaks", "recompile_limit"}
    assert json.loads((tmp_path / "compiled" / "summary.json").read_text())["compile"] == report


def test_a_relative_data_dir_given_on_resume_is_recorded_absolute(tmp_path, monkeypatch):
    """--resume --data-dir fm (a moved dataset): the config names it absolute, so that `eval` finds it from anywhere."""
    import dataclasses

    from skiplab.cli import build_parser
    from skiplab.tasks import arguments

    out = tmp_path / "run"
    out.mkdir()
    run_dir.write_json(out / "config.json", {"config": dataclasses.asdict(ImageTrainConfig(out=str(out)))})
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["train", "image", "--out", str(out), "--resume", "--data-dir", "fm"])
    assert arguments.train_config(ImageTrainConfig, args).data_dir == str(tmp_path / "fm")


@pytest.mark.parametrize("again", [["--model", "preact-resnet20", "--width", "1"], ["--model", "preact-resnet20"],
                                   ["--width", "1"], []])
def test_a_run_started_with_a_presets_own_value_resumes_with_its_command(tmp_path, again):
    """`--model preact-resnet20 --width 1` is stored as preact-resnet20(width=1): its own command with --resume was
    refused ("another config (different model)"), as was the command without --width; only a bare --resume went on."""
    out = tmp_path / "run"
    first = build_parser().parse_args(["train", "image", "--model", "preact-resnet20", "--width", "1", "--out", str(out)])
    stored = arguments.train_config(ImageTrainConfig, first)
    assert stored.model == "preact-resnet20(width=1)"
    out.mkdir()
    run_dir.write_json(out / "config.json", {"config": dataclasses.asdict(stored)})
    args = build_parser().parse_args(["train", "image", *again, "--out", str(out), "--resume"])
    assert arguments.train_config(ImageTrainConfig, args).model == stored.model
    wider = build_parser().parse_args(["train", "image", "--width", "2", "--out", str(out), "--resume"])
    with pytest.raises(ValueError, match="width is set twice"):  # another model: refused
        arguments.train_config(ImageTrainConfig, wider)


def test_a_run_that_fails_on_bad_data_in_a_worker_is_one_line(fashion_dir, tmp_path, capsys):
    """--jobs 2: a run's data error (a corrupt file) reaches the terminal as the one line a run alone gives, with
    the run and its log named; no traceback."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(fashion_dir, bad)
    (bad / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip")
    argv = ["compare", "image", "--dataset", "fashion-mnist", "--data-dir", str(bad), "--connections", "1xSkip,2xSkip",
            "--seeds", "1", "--epochs", "1", "--batch-size", "64", "--jobs", "2", "--out", str(tmp_path / "cmp")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    line = err.split("\r")[-1]  # after the runs' progress bar, cleared
    assert line.count("\n") == 1 and line.startswith(f"skiplab: error: run {tmp_path / 'cmp' / '1xSkip' / 'seed1'} "
                                                     "failed: ") and "train-images-idx3-ubyte.gz" in line, err
    assert "Traceback" not in err and err.count("\n") == 1


def test_a_comparison_refused_its_data_leaves_no_empty_folders(fashion_dir, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(fashion_dir, bad)
    (bad / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip")
    mine = tmp_path / "mine"
    mine.mkdir()  # the user's folder stays; what the comparison made in it goes
    for out in (tmp_path / "new" / "cmp", mine):
        argv = ["compare", "image", "--dataset", "fashion-mnist", "--data-dir", str(bad), "--connections", "1xSkip",
                "--seeds", "1", "--epochs", "1", "--out", str(out)]
        assert main(argv) == 2
        assert "not a valid gzip file" in capsys.readouterr().err
    assert not (tmp_path / "new").exists() and mine.is_dir() and list(mine.iterdir()) == []
