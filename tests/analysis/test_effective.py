"""Effective compute (skiplab.analysis.effective, ``compare --baseline-updates``): the multiplier read off the
baseline's lengths by hand, the fallbacks, the interval over blocks, and the command end to end."""

import json
import math

import pytest

from skiplab.analysis.blocks import RunRecord
from skiplab.analysis.effective import effective_compute, multiplier, scaled_label
from skiplab.cli import main


def test_interpolation_in_log_updates_by_hand():
    lengths = [(1.0, 3.0), (1.25, 2.8), (1.5, 2.7)]
    # 2.9 lies halfway between 1x (3.0) and 1.25x (2.8) in score: halfway in log-updates
    m, extra, how = multiplier(lengths, 2.9)
    assert m == pytest.approx(math.exp(0.5 * math.log(1.25))) and not extra and how == "interpolated"
    # 2.75 between 1.25x and 1.5x
    m, _, _ = multiplier(lengths, 2.75)
    assert m == pytest.approx(math.exp(math.log(1.25) + 0.5 * (math.log(1.5) - math.log(1.25))))
    assert multiplier(lengths, 3.0)[0] == pytest.approx(1.0)  # the baseline's own score: 1x


def test_beyond_the_lengths_the_nearest_segment_is_extended_and_marked():
    lengths = [(1.0, 3.0), (1.25, 2.8), (1.5, 2.7)]
    m, extra, _ = multiplier(lengths, 2.6)  # better than 1.5x: the last segment's line, 0.1 further
    assert extra and m == pytest.approx(math.exp(math.log(1.5) + (math.log(1.5) - math.log(1.25))))
    m, extra, _ = multiplier(lengths, 3.2)  # worse than 1x: below 1
    assert extra and m == pytest.approx(math.exp(-math.log(1.25)))


def test_a_baseline_that_does_not_improve_falls_back_to_a_line_or_to_nothing():
    m, _, how = multiplier([(1.0, 3.0), (1.25, 3.05), (1.5, 2.7)], 2.9)  # not monotone: least squares
    assert how == "least-squares line" and math.isfinite(m)
    m, _, how = multiplier([(1.0, 3.0), (1.25, 3.1), (1.5, 3.2)], 2.9)  # getting worse with length
    assert math.isnan(m) and "does not improve" in how


def test_geometric_mean_and_interval_over_blocks():
    recs = []
    for seed, (y1, y2, y3, yd) in enumerate([(3.0, 2.8, 2.7, 2.9), (3.1, 2.9, 2.8, 2.95), (3.0, 2.9, 2.8, 2.9)], 1):
        recs += [RunRecord("PreLN", seed, "finished", y1), RunRecord("PreLN@1.25x", seed, "finished", y2),
                 RunRecord("PreLN@1.5x", seed, "finished", y3), RunRecord("D", seed, "finished", yd)]
    result = effective_compute(recs, "PreLN", (1.25, 1.5), ["PreLN", "PreLN@1.25x", "PreLN@1.5x", "D"])
    (row,) = result["rows"]
    per = [multiplier([(1.0, a), (1.25, b), (1.5, c)], d)[0]
           for a, b, c, d in [(3.0, 2.8, 2.7, 2.9), (3.1, 2.9, 2.8, 2.95), (3.0, 2.9, 2.8, 2.9)]]
    assert [b["multiplier"] for b in row["blocks"]] == pytest.approx(per)
    assert row["multiplier"] == pytest.approx(math.exp(sum(map(math.log, per)) / 3))
    assert row["ci"][0] < row["multiplier"] < row["ci"][1] and row["n"] == 3


def test_the_command_trains_the_baseline_longer_and_writes_the_reading(tmp_path):
    root = tmp_path / "text"
    root.mkdir()
    for split in ("train", "valid", "test"):
        (root / f"{split}.jsonl").write_text(json.dumps({"text": "the cat sat on the mat. " * 8}) + "\n")
    out = tmp_path / "cmp"
    argv = ["compare", "lm", "--corpus", "", "--train-file", root / "train.jsonl", "--valid-file",
            root / "valid.jsonl", "--test-file", root / "test.jsonl", "--model",
            "gpt-mini(d_model=32,heads=2,layers=2,ffn_dim=64,context=32)", "--batch-size", "4", "--max-steps", "4",
            "--warmup", "1", "--device", "cpu", "--connections", "PreLN,PostLN", "--seeds", "2",
            "--baseline-updates", "1.5,2", "--out", out]
    assert main([str(a) for a in argv]) == 0
    assert json.loads((out / "PreLN@2x" / "seed1" / "summary.json").read_text())["steps"] == 8
    assert json.loads((out / "PreLN@1.5x" / "seed2" / "summary.json").read_text())["steps"] == 6
    assert json.loads((out / "PostLN" / "seed1" / "summary.json").read_text())["steps"] == 4
    reading = json.loads((out / "compare.json").read_text())["effective"]
    assert [r["design"] for r in reading["rows"]] == ["PostLN"] and reading["factors"] == [1.0, 1.5, 2.0]
    assert "Effective compute" in (out / "effective.md").read_text()
    table = (out / "table.md").read_text()
    for label in ("PreLN@1.5x", "PreLN@2x"):  # each length's row names it in the table's first column
        assert f"\n| {label} " in table


@pytest.mark.parametrize("value, problem", [("0.5", "distinct factors > 1"), ("x", "comma-separated numbers"),
                                            ("1.5,1.5", "distinct factors > 1")])
def test_bad_factors_are_one_line(tmp_path, capsys, value, problem):
    argv = ["compare", "lm", "--corpus", "", "--train-file", "a.jsonl", "--valid-file", "b.jsonl", "--max-steps",
            "4", "--baseline-updates", value, "--out", str(tmp_path / "o")]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own refusal of the option's type
        code = exit_.code
    assert code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert problem in err[-1] and not (tmp_path / "o").exists()


def test_the_label_of_a_longer_baseline():
    assert scaled_label("PreLN", 1.25) == "PreLN@1.25x" and scaled_label("PreLN", 2.0) == "PreLN@2x"
