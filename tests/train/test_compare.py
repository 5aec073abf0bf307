import csv
import re
import json

import pytest

from skiplab.analysis.comparison import lambda_and_norm, mean_std
from skiplab.cli import main
from skiplab import tasks
from skiplab.tasks.variants import model_variants


def test_compare_writes_its_table_and_resumes(fashion_dir, tmp_path, capsys, monkeypatch):
    # runs of 64 images and one epoch end near chance, which the table calls stalled (the next test); here the
    # table's rows, columns and resumption are what is looked at
    monkeypatch.setattr(tasks.TASKS["image"], "stall_margin", None)
    out = tmp_path / "cmp"
    argv = ["compare", "image", "--dataset", "fashion-mnist", "--data-dir", str(fashion_dir), "--epochs", "1",
            "--train-subset", "64", "--batch-size", "32", "--connections", "1xSkip,2rSkip+LN", "--seeds", "2",
            "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| 1xSkip" in printed and "| 2rSkip+LN" in printed
    table = (out / "table.md").read_text()
    first = table.splitlines()[0]  # what was compared, as printed, heads the file
    assert first in printed.splitlines() and first.startswith("preact-resnet20") and "fashion-mnist" in first
    assert "error % (mean ± std)" in table and "Δ vs 1xSkip [95% CI]" in table and "p Holm" in table
    assert "Blocks: 2 (block k = seed k of every row)" in table
    rows = list(csv.DictReader((out / "table.csv").open()))
    assert [r["connection"] for r in rows] == ["1xSkip", "2rSkip+LN"]
    assert [(r["lambda"], r["G"]) for r in rows] == [("1", "-"), ("2", "LN")]
    assert float(rows[0]["time_ratio"]) == 1.0 and float(rows[1]["time_ratio"]) > 0  # time per update, over 1xSkip's
    lines = [[c.strip() for c in line.split("|")] for line in table.splitlines() if line.startswith("| ")]
    column = lines[0].index("time × 1xSkip")
    assert float(lines[2][column]) == pytest.approx(float(rows[1]["time_ratio"]), abs=1e-3)  # in the table, not "-"
    errors = [json.loads((out / "2rSkip+LN" / f"seed{k}" / "summary.json").read_text())["final_test_error"] for k in (1, 2)]
    assert float(rows[1]["mean"]) == pytest.approx(sum(errors) / 2)
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"

    def no_training(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(tasks.TASKS["image"], "train", no_training)
    assert main(argv) == 0  # everything finished: only the table is rebuilt

    argv[argv.index("--epochs") + 1] = "2"  # same out, other settings: refused, nothing overwritten
    assert main(argv) == 2
    assert "holds a run with other settings (epochs)" in capsys.readouterr().err


def test_image_runs_that_end_at_chance_are_stalled(fashion_dir, tmp_path, capsys):
    """An image run that ends no better than always answering one class was counted as trained (every image run
    was): the reference is the commonest class of the run's training images, scored on its test images."""
    from skiplab.data import load_image_dataset
    from skiplab.train.image import ImageTrainConfig, chosen

    out = tmp_path / "cmp"
    argv = ["compare", "image", "--dataset", "fashion-mnist", "--data-dir", str(fashion_dir), "--epochs", "1",
            "--train-subset", "32", "--test-subset", "40", "--batch-size", "32", "--lr", "1e-6",
            "--connections", "1xSkip,2xSkip", "--seeds", "1", "--out", str(out)]
    assert main(argv) == 0
    table = (out / "table.md").read_text()
    summary = json.loads((out / "1xSkip" / "seed1" / "summary.json").read_text())
    cfg = ImageTrainConfig(**{k: v for k, v in summary["config"].items() if k in ImageTrainConfig.__dataclass_fields__})
    data = load_image_dataset("fashion-mnist", str(fashion_dir))
    train, test = chosen(cfg, data)
    commonest = max(range(10), key=lambda c: ((data.train_y[train] == c).sum(), -c))  # bincount's argmax: lowest
    expected = 100 * float((data.test_y[test] != commonest).sum()) / 40
    assert summary["majority_test_error"] == pytest.approx(expected)
    assert (f"stalled (finished less than 10 better than the context-free reference, the commonest training class, "
            f"always: {expected:.3f}, or worse)") in table
    rows = list(csv.DictReader((out / "table.csv").open()))
    assert all(float(r["mean"]) > expected - 10 for r in rows)  # lr 1e-6: nothing learned
    assert [line for line in table.splitlines() if line.startswith("| 1xSkip")][-1].count("0 / 1 / 0") == 1


def test_mean_std():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert mean_std([4.0]) == (4.0, 0.0)


@pytest.mark.parametrize("spec,expect", [("2xSkip+LN", ("2", "LN")), ("3rSkip+BN", ("3", "BN")), ("1xSkip", ("1", "-")),
                                         ("0.5xSkip+LN(f=2)", ("0.5 (f=2)", "LN")), ("SAS", ("α (learned)", "LN")),
                                         ("DeepNorm", ("-", "LN")), ("PreLN+UNet", ("1", "LN (pre)")),
                                         ("LNS", ("1", "LN (pre)")), ("LNS+RMS", ("1", "RMS (pre)"))])
def test_lambda_and_norm_columns(spec, expect):
    assert lambda_and_norm(spec) == expect


def test_demo_parser_defaults():
    from skiplab.cli import DEMO, build_parser

    args = build_parser().parse_args(["demo", "image"])
    assert args.dataset == "fashion-mnist" and args.connections is None  # none given: the demo's four
    assert args.default_connections == ("1xSkip", "2xSkip", "2xSkip+LN", "2rSkip+LN")
    assert args.out == DEMO["out"] and args.seeds == 2
    args = build_parser().parse_args(["compare", "image", "--connections", "SAS(gate=single,gamma=free),PostLN"])
    assert args.connections == ("SAS(gate=single,gamma=free)", "PostLN")


def test_labels_say_what_varies_and_name_a_lone_connection():
    """One connection on one model was labelled by the model (runs under OUT/gpt-mini), while a script that trained
    the design under OUT/PreLN and the image task label it by the connection: every run trained twice."""
    assert [v.label for v in model_variants("gpt-mini", (), ("PreLN",))] == ["PreLN"]
    assert [v.label for v in model_variants("gpt-mini", (), ("PreLN", "HC"))] == ["PreLN", "HC"]
    assert [v.label for v in model_variants("gpt-mini", ("gpt-mini", "gpt-small"), ())] == ["gpt-mini", "gpt-small"]
    assert [v.label for v in model_variants("gpt-mini", (), ())] == ["gpt-mini"]
    assert [v.label for v in model_variants("gpt-mini", ("gpt-small",), ("PostLN",))] == ["PostLN"]


@pytest.mark.parametrize("models,connections,said", [
    (("preact-resnet20", "preact-resnet20(depth=20)"), (), "preact-resnet20 and preact-resnet20(depth=20) build the "
                                                           "same model (preact-resnet20(depth=20)): list it once"),
    (("preact-resnet20", "preact-resnet20(connection=1xSkip)"), (), "build the same model"),  # the preset's own
    (("gpt-mini(connection=PostLN)", "gpt-mini(connection=1xSkip+LN)"), (), "build the same model"),  # an alias
    (("gpt-mini", "gpt-mini(layers=4)"), ("PreLN",), "build the same model"),  # gpt-mini has 4 layers
])
def test_models_that_build_the_same_model_are_refused(models, connections, said):
    """Three spellings of one model trained three identical rows (+0.00 [+0.00, +0.00]): refused before anything
    trains, as one connection under two names is."""
    with pytest.raises(ValueError, match=re.escape(said)):
        model_variants(models[0], models, connections)
    assert len(model_variants("gpt-mini", ("gpt-mini", "gpt-mini(layers=2)"), ("PreLN",))) == 2


def test_model_and_models_together_are_refused(capsys, tmp_path):
    """--model was dropped for --models without a word, and compare.json recorded the model never trained."""
    out = tmp_path / "cmp"
    assert main(["compare", "image", "--model", "preact-resnet20(connection=SAS)", "--models", "preact-resnet32",
                 "--out", str(out)]) == 2
    assert capsys.readouterr().err == ("skiplab: error: --model preact-resnet20(connection=SAS) and --models "
                                       "preact-resnet32 both name the models compared: list every model in --models\n")
    assert not out.exists()
