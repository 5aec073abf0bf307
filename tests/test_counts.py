"""Every count option is checked where options are parsed: zero or negative is a one-line error, nothing written."""

import re

import pytest

from skiplab import run_dir
from skiplab.cli import main
from skiplab.models import GPTConfig
from skiplab.train.image import ImageTrainConfig
from skiplab.train.lm_config import LMTrainConfig

# (command, option, the least it takes): every count option of every command
COUNTS = [
    (["train", "image"], "--epochs", 1), (["train", "image"], "--batch-size", 1),
    (["train", "image"], "--train-subset", 0), (["train", "image"], "--test-subset", 0),
    (["train", "image"], "--warmup-iters", -1),
    (["train", "mt"], "--max-tokens", 1), (["train", "mt"], "--update-freq", 1), (["train", "mt"], "--save-every", 1),
    (["train", "mt"], "--keep-checkpoints", 1), (["train", "mt"], "--max-len", 1), (["train", "mt"], "--vocab-size", 1),
    (["train", "mt"], "--warmup", 0), (["train", "mt"], "--max-steps", 0), (["train", "mt"], "--epochs", 0),
    (["train", "mt"], "--train-subset", 0),
    (["train", "lm"], "--batch-size", 1), (["train", "lm"], "--grad-accum", 1), (["train", "lm"], "--max-steps", 1),
    (["train", "lm"], "--warmup", 0), (["train", "lm"], "--eval-every", 1), (["train", "lm"], "--valid-tokens", 0),
    (["train", "lm"], "--keep-checkpoints", 1), (["train", "lm"], "--vocab-size", 2), (["compare", "lm"], "--seeds", 1),
    (["eval", "lm", "--checkpoint", "RUN"], "--average", 0), (["eval", "lm", "--checkpoint", "RUN"], "--stride", 0),
    (["generate", "--checkpoint", "RUN"], "--max-new-tokens", 1), (["generate", "--checkpoint", "RUN"], "--top-k", 0),
    (["generate", "--checkpoint", "RUN"], "--average", 0),
    (["compare", "image"], "--seeds", 1), (["compare", "mt"], "--seeds", 1), (["demo", "image"], "--seeds", 1),
    (["eval", "mt", "--checkpoint", "RUN"], "--beam", 1), (["eval", "mt", "--checkpoint", "RUN"], "--average", 0),
    (["translate", "--checkpoint", "RUN"], "--beam", 1), (["translate", "--checkpoint", "RUN"], "--max-tokens", 1),
    (["translate", "--checkpoint", "RUN"], "--average", 0),
    (["average", "--checkpoint", "RUN", "--out", "OUT"], "--last", 1),
    (["bootstrap", "R", "A", "B"], "--samples", 1),
    (["analyze", "gradients", "RUN"], "--examples", 1), (["analyze", "gates", "RUN"], "--examples", 1),
    (["analyze", "ratios", "RUN"], "--examples", 1), (["analyze", "activations", "RUN"], "--examples", 1),
    (["analyze", "linearity", "RUN", "--layers", "block.0"], "--steps", 1),
    (["analyze", "linearity", "RUN", "--layers", "block.0"], "--sample", 1),
    (["analyze", "linearity", "RUN", "--layers", "block.0"], "--beam", 1),
    (["connections", "PostLN"], "--dim", 1), (["bench", "--quick"], "--threads", 0),
    (["reproduce", "000-table1"], "--seeds", 1), (["reproduce", "000-table1"], "--jobs", 1),
    (["demo", "gradient-flow"], "--depth", 1), (["demo", "gradient-flow"], "--width", 1),
    (["demo", "gradient-flow"], "--batch", 1),
]


@pytest.mark.parametrize("command,option,least", COUNTS, ids=[f"{' '.join(c[:2])} {o}" for c, o, _ in COUNTS])
def test_a_count_below_its_least_is_a_one_line_error(command, option, least, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything a command wrote would land here
    for value in (least - 1, least - 5):
        with pytest.raises(SystemExit) as stop:
            main([*command, option, str(value)])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("skiplab ")
        assert f"error: argument {option}: must be >= {least}, got {value}\n" in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_model_options_and_library_counts_are_refused_too(tmp_path, capsys):
    for argv, message in [
        (["train", "image", "--width", "0"], "width must be a positive integer, got 0"),
        (["train", "image", "--depth", "-4"], "depth must be 6n + 2 with n >= 1"),
        (["train", "mt", "--max-steps", "2", "--heads", "0"], "must be positive"),
    ]:
        assert main([*argv, "--out", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="checkpoints to average must be >= 1, got 0"):
        run_dir.average_checkpoints(tmp_path, 0)  # a slice [-0:] would have averaged them all


def test_seeds_as_a_count_a_range_or_a_list():
    import argparse

    from skiplab.config import seed_list

    assert seed_list("3") == (1, 2, 3) and seed_list("4-5") == (4, 5) and seed_list("2,7") == (2, 7)
    for bad, said in (("0", "must be >= 1, got 0"), ("x", "expected N, A-B or A,B,..."),
                      ("3-1", "at least one"), ("2,2", "none twice"), ("0-2", "must be >= 1")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(said)):
            seed_list(bad)


# (command, a float option): a number that is not finite is no rate, momentum, decay or bound
FLOATS = [(["train", "image"], "--lr"), (["train", "image"], "--momentum"), (["train", "image"], "--weight-decay"),
          (["train", "lm"], "--lr"), (["train", "lm"], "--min-lr"), (["train", "lm"], "--clip-norm"),
          (["train", "lm"], "--weight-decay"), (["train", "mt"], "--lr"), (["train", "mt"], "--label-smoothing"),
          (["train", "mt"], "--weight-decay")]


@pytest.mark.parametrize("command,option", FLOATS, ids=[f"{' '.join(c)} {o}" for c, o in FLOATS])
def test_a_float_that_is_not_a_finite_number_is_a_one_line_error(command, option, tmp_path, capsys, monkeypatch):
    """``--lr nan`` trained and was recorded as a diverged run (inside compare: a design that diverged)."""
    monkeypatch.chdir(tmp_path)
    for value in ("nan", "inf", "-inf"):
        with pytest.raises(SystemExit) as stop:
            main([*command, f"{option}={value}"])  # -inf would read as an option
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert f"error: argument {option}: " in err and "finite number" in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command,option", [(["train", "image"], "--momentum"), (["train", "image"], "--weight-decay"),
                                            (["train", "lm"], "--clip-norm"), (["train", "mt"], "--clip-norm"),
                                            (["generate", "--checkpoint", "RUN"], "--temperature")])
def test_momentum_decay_clipping_and_temperature_are_not_negative(command, option, tmp_path, capsys, monkeypatch):
    """--clip-norm -1 turned clipping off silently (0 is off); a negative momentum failed in torch's words."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main([*command, f"{option}=-5"])
    assert f"error: argument {option}: must be a finite number >= 0, got -5\n" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_config_made_in_python_refuses_a_float_that_is_not_finite():
    for cls, field in ((ImageTrainConfig, "momentum"), (ImageTrainConfig, "lr"), (LMTrainConfig, "clip_norm")):
        with pytest.raises(ValueError, match=rf"--{field.replace('_', '-')} must be a finite number, got nan"):
            cls(**{field: float("nan")})


@pytest.mark.parametrize("value,said", [("nan", "expected a finite number, got 'nan'"),
                                        ("0", "must be in (0, 1], got 0"), ("1.5", "must be in (0, 1], got 1.5")])
def test_generates_nucleus_mass_is_a_probability(value, said, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["generate", "--checkpoint", "RUN", "--top-p", value])
    assert f"error: argument --top-p: {said}\n" in capsys.readouterr().err


@pytest.mark.parametrize("base", [-1.0, 0.0, float("nan")])
def test_a_rotary_base_that_gives_no_angles_is_refused(base):
    """A negative base to a fractional power is NaN: the run diverged at its first step (and exited 0)."""
    with pytest.raises(ValueError, match="rope_base must be a finite number > 0"):
        GPTConfig(positions="rope", rope_base=base)


@pytest.mark.parametrize("task", ["image", "mt", "lm", "caption"])
def test_resume_and_overwrite_together_are_named_whatever_the_folder_holds(task, tmp_path, capsys, monkeypatch):
    """On a fresh folder the error read "nothing to resume in X", naming neither option."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", task, "--out", "fresh", "--resume", "--overwrite"]) == 2
    assert capsys.readouterr().err == "skiplab: error: --resume and --overwrite exclude each other\n"
    assert list(tmp_path.iterdir()) == []


SEEDS = [(["train", "image"], "--seed"), (["train", "lm"], "--seed"), (["train", "mt"], "--seed"),
         (["train", "caption"], "--scene-seed"), (["generate", "--checkpoint", "RUN"], "--seed"),
         (["bootstrap", "R", "A", "B"], "--seed")]


@pytest.mark.parametrize("command,option", SEEDS, ids=[f"{' '.join(c[:2])} {o}" for c, o in SEEDS])
def test_a_seed_out_of_torchs_range_is_a_one_line_error(command, option, tmp_path, capsys, monkeypatch):
    """A negative seed was taken as given, and one past 2**63 failed deep in torch with "Overflow when unpacking
    long long"."""
    monkeypatch.chdir(tmp_path)
    for value in (-1, 2**64):
        with pytest.raises(SystemExit) as stop:
            main([*command, option, str(value)])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert f"error: argument {option}: a seed is an integer in [0, 2**63 - 1], got {value}\n" in err, err
        assert err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
