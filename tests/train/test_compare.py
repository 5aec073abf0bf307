import csv
import json

import pytest

from skiplab.analysis.comparison import lambda_and_norm, markdown, mean_std, summarise
from skiplab.cli import main
from skiplab import tasks


def test_compare_writes_its_table_and_resumes(fashion_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "cmp"
    argv = ["compare", "image", "--dataset", "fashion-mnist", "--data-dir", str(fashion_dir), "--epochs", "1",
            "--train-subset", "64", "--batch-size", "32", "--connections", "1xSkip,2rSkip+LN", "--seeds", "2",
            "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| 1xSkip" in printed and "| 2rSkip+LN" in printed
    table = (out / "table.md").read_text()
    assert "error % (mean ± std)" in table and "Δ vs 1xSkip" in table
    rows = list(csv.DictReader((out / "table.csv").open()))
    assert [r["connection"] for r in rows] == ["1xSkip", "2rSkip+LN"]
    assert [(r["lambda"], r["G"]) for r in rows] == [("1", "-"), ("2", "LN")]
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


def test_table_statistics():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    runs = {"1xSkip": [{"status": "finished", "e": 10.0}, {"status": "finished", "e": 12.0}],
            "2xSkip": [{"status": "finished", "e": 15.0}, {"status": "diverged"}]}
    rows = summarise(runs, "e")
    assert rows[0]["mean"] == 11.0 and rows[1]["mean"] == 15.0 and rows[1]["delta"] == 4.0
    assert rows[1]["diverged"] == 1 and rows[1]["finished"] == 1
    assert rows[0]["p"] is None and rows[1]["p"] is None  # one finished seed: no test
    runs["3xSkip"] = [{"status": "finished", "e": 13.0}, {"status": "finished", "e": 17.0}]
    rows = summarise(runs, "e")
    # Welch by hand: t = (11 - 15) / sqrt(2/2 + 8/2) = -1.789, df = 5² / (1²/1 + 4²/1) = 1.471, two-sided
    # p = 2 P(T_1.471 < -1.789) = 0.2585
    assert rows[2]["p"] == pytest.approx(0.2585, abs=5e-4)
    table = markdown(rows, "error %")
    assert "p (Welch)" in table and "| 0.259 " in table


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
