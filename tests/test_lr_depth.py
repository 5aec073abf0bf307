"""``skiplab analyze lr-depth``: sweeps' runs read once each, labelled by parametrisation, one kind of machine, the
two tables and the figure (skiplab.reproduce.lr_depth)."""

import json
import math
import re

import pytest

from skiplab import cli, host
from skiplab.reproduce import lr_depth

GRID = [2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3]
KIND = ["cpu-test-kind fp32"]


def _value(design, depth, lr, seed):
    # PreLN's optimum falls as 2^(−10 − 0.5 log2(L/4)); CompleteP's stays at 2^−10; seed k adds 0.01·k everywhere
    centre = -10.0 - (0.5 * math.log2(depth / 4) if design == "PreLN" else 0.0)
    return 0.05 * (math.log2(lr) - centre) ** 2 + 2.4 + 0.01 * seed


def _sweep(path, parametrization, depths, lrs, seeds, kinds=KIND, metric="test_bpb", value=_value, diverged=()):
    design = "PreLN" if parametrization == "standard" else "PreLN@completep"
    runs = []
    for depth in depths:
        for lr in lrs(depth) if callable(lrs) else lrs:
            for k in seeds:
                bad = (depth, lr, k) in diverged
                runs.append({"connection": "PreLN", "depth": depth, "lr": lr, "seed": k,
                             "status": "diverged" if bad else "finished",
                             metric: None if bad else value(design, depth, lr, k),
                             "kinds": kinds, "code": ["abc1234"], "dir": f"runs/{design}-{depth}-{lr:g}/seed{k}"})
    path.mkdir(parents=True)
    all_lrs = sorted({r["lr"] for r in runs})
    (path / "sweep.json").write_text(json.dumps({
        "metric": metric, "higher_is_better": False, "config": {"parametrization": parametrization},
        "axes": {"lrs": all_lrs}, "runs": runs}))
    return path


def _around(centre_lr):
    i = GRID.index(centre_lr)
    return GRID[i - 1:i + 2]


@pytest.fixture
def sweeps(tmp_path):
    best = {4: 1e-3, 8: 5e-4, 16: 5e-4}  # the grid points nearest PreLN's optimum at each depth
    return [
        _sweep(tmp_path / "grid-standard", "standard", [4, 8, 16], GRID, [1]),
        _sweep(tmp_path / "grid-completep", "completep", [4, 8, 16], GRID, [1]),
        *[_sweep(tmp_path / f"seeds-standard-L{d}", "standard", [d], _around(best[d]), [1, 2, 3]) for d in best],
        *[_sweep(tmp_path / f"seeds-completep-L{d}", "completep", [d], _around(1e-3), [1, 2, 3]) for d in best],
    ]


def test_the_tables_read_each_design_across_depth(sweeps, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["analyze", "lr-depth", *map(str, sweeps), "--out", str(out), "--samples", "200"]) == 0
    result = json.loads((out / "lr_depth.json").read_text())
    assert [d["design"] for d in result["designs"]] == ["PreLN", "PreLN@completep"]
    pre, cp = result["designs"]
    # seed 1 of the grid is seed 1 of the seeded sweeps: read once (3 seeds x 3 lrs + 2 grid-only lrs, per depth)
    assert [sum(c["runs"] for c in o["cells"]) for o in pre["optima"]] == [11, 11, 11]
    assert [o["x_star"] for o in pre["optima"]] == pytest.approx([-10.0, -10.5, -11.0])
    assert pre["slope"]["slope"] == pytest.approx(-0.5) and pre["slope"]["verdict"] == "falls"
    assert cp["slope"]["slope"] == pytest.approx(0.0, abs=1e-9) and cp["slope"]["verdict"] == "no shift shown"
    assert result["kind"] == KIND[0] and result["codes"] == ["abc1234"]
    assert "replicates" not in pre["optima"][0]  # the json keeps the summary, not the 200 replicates
    text = (out / "lr_depth.md").read_text()
    assert f"Runs on {KIND[0]}; code abc1234; 200 bootstrap replicates" in text
    assert "| PreLN@completep | 16" in text and "falls" in text
    assert (out / "lr_depth.png").stat().st_size > 10_000
    assert "wrote" in capsys.readouterr().out


def test_the_files_are_not_replaced_without_overwrite(sweeps, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "lr_depth.md").write_text("kept")
    assert cli.main(["analyze", "lr-depth", str(sweeps[0]), "--out", str(out)]) == 2
    assert "lr_depth.md exists; use --overwrite" in capsys.readouterr().err
    assert (out / "lr_depth.md").read_text() == "kept"


def test_two_kinds_of_machine_or_two_metrics_are_refused_in_one_line(tmp_path, capsys):
    a = _sweep(tmp_path / "a", "standard", [4], GRID, [1])
    b = _sweep(tmp_path / "b", "standard", [8], GRID, [1], kinds=["other-kind fp32"])
    assert cli.main(["analyze", "lr-depth", str(a), str(b), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "different kinds of machine" in err and "other-kind" in err
    assert "--runs" not in err and "analyse each kind's sweeps apart" in err  # analyze lr-depth has no --runs
    c = _sweep(tmp_path / "c", "standard", [8], GRID, [1], metric="test_loss")
    assert cli.main(["analyze", "lr-depth", str(a), str(c), "--out", str(tmp_path / "o")]) == 2
    assert "its metric is test_loss, the first sweep's test_bpb" in capsys.readouterr().err
    assert cli.main(["analyze", "lr-depth", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]) == 2
    assert "no sweep.json" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_sweep_without_per_run_kinds_is_of_the_machine_its_record_names(tmp_path):
    """An older sweep records no kind a run, only the environment it was made in: its runs are of that machine's
    kind (they were pooled under the other sweep's kind, unsaid), and with no environment of a kind of their own."""
    env = host.environment()  # the old sweep made here; the other sweep's kind another machine's, by construction
    here = host.machine_kind(env, "cpu", False)
    a = _sweep(tmp_path / "a", "standard", [4], GRID, [1], kinds=[f"{here} (other)"])
    old = _sweep(tmp_path / "old", "standard", [32], GRID, [1], kinds=[])
    record = json.loads((old / "sweep.json").read_text())
    record["environment"] = env
    (old / "sweep.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=re.escape(f"5 runs on {here} (other); 5 runs on {here}")):
        lr_depth.read([a, old])
    assert lr_depth.read([old])["kind"] == here
    del record["environment"]
    (old / "sweep.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="5 runs on .*old/sweep.json's machine, unknown"):
        lr_depth.read([a, old])


def test_one_run_with_two_numbers_is_an_error(tmp_path):
    a = _sweep(tmp_path / "a", "standard", [4], GRID, [1])
    b = _sweep(tmp_path / "b", "standard", [4], GRID, [1], value=lambda *args: _value(*args) + 0.5)
    with pytest.raises(ValueError, match="give different test_bpb"):
        lr_depth.read([a, b])


def test_a_diverged_neighbour_and_an_edge_are_named_under_the_table(tmp_path):
    a = _sweep(tmp_path / "a", "standard", [4, 32], GRID, [1], diverged={(4, 5e-4, 1)},
               value=lambda d, L, lr, k: _value(d, L, lr, k) if L == 4 else (math.log2(lr) + 13) ** 2)
    text = lr_depth.tables(lr_depth.analyse(lr_depth.read([a]), samples=100))
    assert "PreLN at depth 4: lr 0.0005 beside the best (0.001) has not every run finished" in text
    assert "<= 0.00025 (edge)" in text and "PreLN at depth 32: the best lr is the grid's lowest" in text


def test_a_cell_of_one_seed_reads_one_run_not_a_zero_spread(tmp_path):
    one = lr_depth.tables(lr_depth.analyse(lr_depth.read([_sweep(tmp_path / "a", "standard", [4], GRID, [1])]),
                                           samples=100))
    two = lr_depth.tables(lr_depth.analyse(lr_depth.read([_sweep(tmp_path / "b", "standard", [4], GRID, [1, 2])]),
                                           samples=100))
    assert "(one run)" in one and "± 0.0000" not in one
    assert "(one run)" not in two and "± " in two


def test_a_grid_widened_at_one_depth_brackets_its_optimum_there_alone(tmp_path):
    far = lambda d, L, lr, k: 0.05 * (math.log2(lr) - (math.log2(1.6e-2) if L == 4 else -10.0)) ** 2 + 2.4  # noqa: E731
    grid = _sweep(tmp_path / "grid", "standard", [4, 8], GRID, [1], value=far)
    wide = _sweep(tmp_path / "wide", "standard", [4], GRID + [8e-3, 1.6e-2, 3.2e-2], [1], value=far)
    result = lr_depth.analyse(lr_depth.read([grid]), samples=100)
    assert [o["status"] for o in result["designs"][0]["optima"]] == ["edge", "bracketed"]
    result = lr_depth.analyse(lr_depth.read([grid, wide]), samples=100)
    four, eight = result["designs"][0]["optima"]
    assert four["status"] == "bracketed" and four["lr_star"] == pytest.approx(1.6e-2)
    assert [c["lr"] for c in four["cells"]] == GRID + [8e-3, 1.6e-2, 3.2e-2]
    assert [c["lr"] for c in eight["cells"]] == GRID and eight["x_star"] == pytest.approx(-10.0)
