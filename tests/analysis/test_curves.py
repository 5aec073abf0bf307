"""``skiplab curves``: runs grouped by connection, plotted against step or epoch; bad input refused."""

from pathlib import Path

import pytest

from skiplab.analysis import curves
from skiplab.cli import main
from skiplab import run_dir


def fake_run(path, connection, records):
    """A run directory as training writes it: image runs (epochs) are named by their connection, MT runs by their
    model spec."""
    path.mkdir(parents=True)
    if "epoch" in records[0]:
        stored = {"config": {"dataset": "fashion-mnist", "model": f"preact-resnet20(connection={connection})"},
                  "model": {"connection": connection}}
    else:
        stored = {"config": {"corpus": "multi30k", "model": connection}, "model": {"connection": "PostLN"}}
    run_dir.write_json(path / "config.json", stored)
    for r in records:
        run_dir.append_metrics(path, r)
    return str(path)


def mt_records(scale):
    return [{"step": s, "train_loss": scale / s, "valid_loss": scale / s, "valid_ppl": 2.0 ** (scale / s)}
            for s in (10, 20, 30)]


def test_runs_are_grouped_by_connection_against_the_step(tmp_path, monkeypatch):
    a1 = fake_run(tmp_path / "a1", "PostLN", mt_records(40))
    a2 = fake_run(tmp_path / "a2", "PostLN", mt_records(50))
    b = fake_run(tmp_path / "b", "2rSkip+LN", mt_records(30))
    seen = {}
    monkeypatch.setattr(curves, "plot_curves", lambda groups, keys, path, title, x: seen.update(
        groups=groups, keys=keys, x=x))
    curves.plot_runs([a1, a2, b], tmp_path / "f.png")
    assert seen["x"] == "step" and seen["keys"] == ("train_loss", "valid_loss", "valid_ppl")
    assert list(seen["groups"]) == ["PostLN", "2rSkip+LN"]
    assert [len(v) for v in seen["groups"].values()] == [2, 1]
    assert seen["groups"]["PostLN"][1][0]["train_loss"] == 5.0

    curves.plot_runs([a1, b], tmp_path / "g.png", keys=("valid_ppl",), labels=("x", "y"))
    assert list(seen["groups"]) == ["x", "y"] and seen["keys"] == ("valid_ppl",)


def test_image_runs_use_the_epoch_and_the_cli_writes_a_png(tmp_path, capsys):
    runs = [fake_run(tmp_path / f"r{i}", "1xSkip", [{"epoch": e, "train_loss": 1 / e, "test_error": 50 / e + i}
                                                     for e in (1, 2, 3)]) for i in range(2)]
    out = tmp_path / "fig" / "c.png"
    assert main(["curves", *runs, "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    first = out.read_bytes()
    assert main(["curves", *runs, "--out", str(out)]) == 2  # an existing figure is not replaced silently
    assert "exists; use --overwrite" in capsys.readouterr().err and out.read_bytes() == first
    assert main(["curves", *runs, "--out", str(out), "--overwrite", "--keys", "test_error"]) == 0


def test_an_out_without_a_suffix_is_the_png_checked_and_named(tmp_path, capsys):
    """matplotlib writes ``pic`` as ``pic.png``: that is the file checked for, replaced only with --overwrite, and
    named; a folder is refused."""
    runs = [fake_run(tmp_path / "r", "1xSkip", [{"epoch": e, "train_loss": 1 / e, "test_error": 50 / e}
                                                for e in (1, 2)])]
    assert main(["curves", *runs, "--out", str(tmp_path / "pic")]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'pic.png'}\n" and not (tmp_path / "pic").exists()
    first = (tmp_path / "pic.png").read_bytes()
    assert main(["curves", *runs, "--out", str(tmp_path / "pic")]) == 2
    assert f"{tmp_path / 'pic.png'} exists; use --overwrite" in capsys.readouterr().err
    assert (tmp_path / "pic.png").read_bytes() == first
    assert main(["curves", *runs, "--out", str(tmp_path / "r"), "--overwrite"]) == 2
    assert "is a folder; give the figure's file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pic.png", "r"]


RECORDED = Path(__file__).parents[2] / "docs" / "results" / "fmnist-r20" / "amd-epyc-avx512-2026-11-30"


def test_a_recorded_image_run_plots_its_default_keys_against_the_epoch(tmp_path, monkeypatch):
    """Image runs log their update step beside the epoch: the default keys and the epoch axis are still the image
    task's (the step in the records chose the language model's keys, and every real image run was refused)."""
    seen = {}
    monkeypatch.setattr(curves, "plot_curves", lambda groups, keys, out, title, x: seen.update(keys=keys, x=x))
    runs = [str(RECORDED / design / "seed1") for design in ("1xSkip", "2rSkip+LN")]
    assert all('"step"' in Path(r, "metrics.jsonl").read_text().splitlines()[0] for r in runs)
    curves.plot_runs(runs, tmp_path / "c.png")
    assert seen == {"keys": ("train_loss", "test_error"), "x": "epoch"}


def test_bad_runs_and_keys_are_named(tmp_path, capsys):
    run = fake_run(tmp_path / "r", "PostLN", mt_records(40))
    (tmp_path / "empty").mkdir()
    for argv, message in [
        ([str(tmp_path / "empty")], "is not a run directory: no metrics.jsonl there"),
        ([run, "--keys", "bleu"], "has no bleu in its metrics; it has: step, train_loss"),
        ([run, "--labels", "a,b"], "2 labels for 1 runs"),
        ([run, str(tmp_path / "x" / ".." / "r")], f"{run}, {tmp_path / 'x' / '..' / 'r'}: a run given twice"),
    ]:
        assert main(["curves", *argv, "--out", str(tmp_path / "x.png")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
    with pytest.raises(ValueError, match="at least one run"):
        curves.plot_runs([], tmp_path / "x.png")


def test_curve_axes_name_their_key_and_an_error_its_percent():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from skiplab.analysis.comparison import draw_curves
    runs = {"1xSkip": [[{"epoch": 1, "train_loss": 2.0, "test_error": 80.0}, {"epoch": 2, "train_loss": 1.0,
                                                                               "test_error": 40.0}]]}
    fig, axes = plt.subplots(1, 2)
    draw_curves(list(axes), runs, ("train_loss", "test_error"))
    assert [ax.get_ylabel() for ax in axes] == ["train loss", "test error (%)"]
    assert [ax.get_xlabel() for ax in axes] == ["epoch", "epoch"]
    plt.close(fig)


def test_a_curve_of_one_record_is_drawn_as_a_point_with_its_spread():
    """Runs of one epoch: a line through one point draws nothing, and the figure showed axes and a legend alone."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from skiplab.analysis.comparison import draw_curves
    runs = {"1xSkip": [[{"epoch": 1, "test_error": 80.0}], [{"epoch": 1, "test_error": 70.0}]],
            "2xSkip": [[{"epoch": 1, "test_error": 60.0}, {"epoch": 2, "test_error": 50.0}]]}
    fig, ax = plt.subplots()
    draw_curves([ax], runs, ("test_error",))
    one, two = [line for line in ax.get_lines() if line.get_label() in runs]
    assert one.get_marker() == "o" and list(one.get_ydata()) == [75.0]  # the mean, marked
    assert two.get_marker() in ("None", None, "") and list(two.get_ydata()) == [60.0, 50.0]
    bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(bars) == 1 and bars[0].lines[2][0].get_segments()[0][:, 1].round(4).tolist() == [67.9289, 82.0711]
    plt.close(fig)


def lm_run(path, lr, seed, steps, connections=("PreLN",)):
    """A language-model run as training writes it: the preset's model spec names no connection, config.json's
    "connections" the ones built."""
    path.mkdir(parents=True)
    run_dir.write_json(path / "config.json", {"config": {"model": "gpt-mini(context=64)", "lr": lr, "seed": seed,
                                                         "out": str(path), "max_steps": 30},
                                              "connections": list(connections)})
    for s in steps:
        run_dir.append_metrics(path, {"step": s, "train_loss": lr * 1000 / s + seed, "valid_loss": 1.0,
                                      "valid_ppl": 2.0})
    return str(path)


def test_only_seeds_of_one_setting_share_a_line_named_by_its_connection(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(curves, "plot_curves", lambda groups, keys, path, title, x: seen.update(groups=groups))
    runs = [lm_run(tmp_path / "s1", 1e-3, 1, (10, 20, 30)), lm_run(tmp_path / "s2", 1e-3, 2, (10, 20, 30)),
            lm_run(tmp_path / "fast", 3e-3, 1, (10, 20, 30)), lm_run(tmp_path / "rs", 1e-3, 1, (10, 20),
                                                                     connections=("2rSkip+LN",))]
    curves.plot_runs(runs, tmp_path / "f.png", keys=("train_loss",))
    assert list(seen["groups"]) == ["PreLN (lr=0.001)", "PreLN (lr=0.003)", "2rSkip+LN"]
    assert [len(v) for v in seen["groups"].values()] == [2, 1, 1]


def test_seeds_are_averaged_at_the_steps_every_one_recorded_not_by_position():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from skiplab.analysis.comparison import draw_curves
    every_10 = [{"step": s, "train_loss": float(s)} for s in (10, 20, 30)]
    every_20 = [{"step": s, "train_loss": float(s) + 2} for s in (20, 40)]
    fig, ax = plt.subplots()
    draw_curves([ax], {"PreLN": [every_10, every_20]}, ("train_loss",), "step")
    line = ax.get_lines()[0]
    assert list(line.get_xdata()) == [20] and list(line.get_ydata()) == [21.0]  # (20 + 22) / 2 at step 20 alone
    plt.close(fig)


def test_a_title_of_many_long_run_names_is_kept_within_the_figure(tmp_path, monkeypatch):
    """Sweep runs' directories are long: joined, they ran off both edges of the figure; the legend names them."""
    long = [fake_run(tmp_path / f"lm_gpt-mini_connection=PreLN_layers={d}_lr=0.003-0123abcd{d}", "PostLN",
                     mt_records(40)) for d in range(3)]
    short = [fake_run(tmp_path / "a", "PostLN", mt_records(40))]
    seen = {}
    monkeypatch.setattr(curves, "plot_curves", lambda groups, keys, path, title, x: seen.update(title=title))
    curves.plot_runs(long, tmp_path / "f.png")
    assert seen["title"] == "3 runs (named in the legend)"
    curves.plot_runs(short, tmp_path / "g.png")
    assert seen["title"] == "a"


def test_runs_are_named_by_the_connection_as_their_command_named_it(tmp_path):
    """A compare lm folder's PostLN runs are PostLN in the legend, as in its table (they read 1xSkip+LN, the
    connection as built); a preset's own connection (no connection= in the spec) is named as built."""
    named = tmp_path / "named"
    named.mkdir()
    run_dir.write_json(named / "config.json", {"config": {"corpus": "pydocs", "model": "gpt-mini(layers=2,connection="
                                                                                         "PostLN)"},
                                               "connections": ["1xSkip+LN"]})
    run_dir.append_metrics(named, {"step": 1, "train_loss": 1.0})
    preset = tmp_path / "preset"
    preset.mkdir()
    run_dir.write_json(preset / "config.json", {"config": {"corpus": "pydocs", "model": "gpt-mini"},
                                                "connections": ["PreLN"]})
    run_dir.append_metrics(preset, {"step": 1, "train_loss": 1.0})
    assert curves.read_run(named)[0] == "PostLN" and curves.read_run(preset)[0] == "PreLN"
