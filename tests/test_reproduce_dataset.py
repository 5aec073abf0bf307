"""``reproduce --dataset``: 001-table5's composed-set settings on fashion-mnist-scenes-hard (and -crowded), the easy
set's runs and table untouched, and the refusals (one line, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skiplab import cli
from skiplab.reproduce import plan, reproduce, resolve, scale, table
from tests.conftest import write_fashion_mnist

HARD = "fashion-mnist-scenes-hard"
CROWDED = "fashion-mnist-scenes-crowded"
# the baseline run of the easy set's recorded table (docs/results/repro/cpu/runs/): its name must not move
EASY_BASELINE = "fashion-mnist_captioner-small_connection=1xSkip+LN_-2b27daa4"
# the baseline runs of the harder sets' calibrations (docs/results/caption-hard/, caption-crowded/)
CALIBRATED = {HARD: f"{HARD}_captioner-small_connection=1xSkip+LN_-56e62f45",
              CROWDED: f"{CROWDED}_captioner-small_connection=1xSkip+LN_-85c052f5"}


def test_cpu_cells_read_the_hard_set_and_the_easy_runs_keep_their_names():
    t, sc = table("001-table5"), scale("cpu")
    easy = plan(t, sc, 3, Path("R"))[1]
    hard = plan(t, sc, 3, Path("R"), dataset=HARD)[1]
    assert len(easy) == len(hard) == 9  # three rows, three seeds
    assert Path(easy[0][1].out).parent.name == EASY_BASELINE
    assert all(c.dataset == "fashion-mnist-scenes" for _, c in easy) and all(c.dataset == HARD for _, c in hard)
    names = {Path(c.out).parent.name for _, c in hard}
    assert all(n.startswith(HARD + "_captioner-small_") for n in names) and len(names) == 3
    for (_, e), (_, h) in zip(easy, hard):  # nothing but the dataset (and so the run's key) differs
        assert {k for k in vars(e) if getattr(e, k) != getattr(h, k)} == {"dataset", "out"}


@pytest.mark.parametrize("name", [HARD, CROWDED])
def test_the_calibration_runs_keep_their_directories(name):
    (_, cfg), = plan(table("001-table5"), scale("cpu"), 1, Path("R"), dataset=name, rows=("Baseline",))[1]
    assert cfg.out == str(Path("R") / CALIBRATED[name] / "seed1") and cfg.dataset == name


def test_paper_scale_and_other_tasks_have_no_dataset_choice():
    r = resolve(table("001-table5"), table("001-table5").cell("Baseline", "CIDEr"), scale("paper"), dataset=HARD)
    assert r.config is None and "reads COCO files" in r.why
    r = resolve(table("000-table1"), table("000-table1").cells[1], scale("cpu"), dataset=HARD)
    assert r.config is None and "no --dataset choice" in r.why


@pytest.mark.parametrize("argv,message", [
    (["reproduce", "001-table5", "--scale", "smoke", "--dataset", "coco"],
     "unknown captioning dataset 'coco' for --dataset; known: fashion-mnist-scenes, fashion-mnist-scenes-hard"),
    (["reproduce", "001-table5", "--scale", "paper", "--dataset", HARD],
     f"--dataset {HARD}: no cell of 001-table5 at paper scale reads it"),
    (["reproduce", "001-table5,000-table1", "--scale", "smoke", "--dataset", HARD],
     f"--dataset {HARD}: no cell of 000-table1 at smoke scale reads it"),
])
def test_a_dataset_no_cell_takes_is_one_line_and_writes_nothing(argv, message, capsys, tmp_path):
    assert cli.main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", [HARD, CROWDED])
def test_smoke_table_on_a_harder_set_is_written_beside_the_easy_one(tmp_path, name):
    pytest.importorskip("pycocoevalcap")  # its cells are scored with it
    root = tmp_path / "data"
    write_fashion_mnist(root / "fashion-mnist", n_train=5300, n_test=60)  # 300 training images: 40 scenes of <= 6
    out = tmp_path / "repro"
    result, = reproduce(["001-table5"], "smoke", str(out), seeds=1, data_root=str(root), progress=False,
                        rows=("Baseline",), dataset=name)
    folder = out / "smoke" / f"001-table5-{name}"
    assert (folder / "table.md").is_file() and not (out / "smoke" / "001-table5").exists()
    assert result["dataset"] == name and json.loads((folder / "table.json").read_text())["dataset"] == name
    assert all(about.endswith(f"; read here on --dataset {name}, in place of the setting's own")
               for about in result["settings"].values()) and result["settings"]  # not the easy set's words alone
    base = [c for c in result["cells"] if c["row"] == "Baseline" and c["column"] == "BLEU-4"][0]
    assert base["available"] and base["values"][0] is not None and base["config"]["dataset"] == name
    run = Path(base["runs"][0])
    assert run.parent.name.startswith(name + "_") and json.loads((run / "config.json").read_text())["config"][
        "dataset"] == name
