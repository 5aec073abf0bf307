"""``skiplab reproduce``: every table at smoke scale on tiny datasets in the official formats, the transcribed
numbers against the papers' text, reuse of finished runs, the statistics, and bad input."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import random
import re
import shutil
from pathlib import Path

import pytest

from skiplab import cli
from skiplab.tasks import load_trained
from skiplab.models import model_config
from skiplab.reproduce import TABLES, plan, reproduce, resolve, scale, table
from skiplab.reproduce import runs as runs_mod
from skiplab.reproduce import command as reproduce_mod
from skiplab.reproduce import report
from skiplab.reproduce.stats import welch_p
from skiplab import run_dir, tasks
from skiplab.tasks import parallel
from skiplab.tasks import mt as mt_task
from tests.conftest import write_fashion_mnist
from tests.data.test_cifar import write_cifar
from tests.test_reproduce_lm import write_c4

# A figure whose legend does not fit (one run standing for many rows) warns; here that fails the test.
pytestmark = pytest.mark.filterwarnings("error:Tight layout not applied")

PAPERS = Path(__file__).resolve().parents[2] / "shared" / "papers"  # the source documents beside the checkout

EN = "the a small big red blue dog cat man woman runs sits sees eats house tree car street child ball".split()
OTHER = {"vi": "cái một nhỏ to đỏ xanh chó mèo người đàn_bà chạy ngồi thấy ăn nhà cây xe phố bé bóng".split(),
         "de": "der ein klein groß rot blau Hund Katze Mann Frau läuft sitzt sieht isst Haus Baum Auto Straße Kind Ball".split()}


def _pairs(n: int, lang: str, seed: int) -> tuple[list[str], list[str]]:
    """Moses-style tokenised, escaped sentence pairs: a word-for-word code, quotes as &quot; / &apos;."""
    rng = random.Random(seed)
    src, tgt = [], []
    for i in range(n):
        idx = [rng.randrange(len(EN)) for _ in range(rng.randint(3, 8))]
        s, t = " ".join(EN[j] for j in idx), " ".join(OTHER[lang][j] for j in idx)
        if i % 5 == 0:
            s, t = f"&quot; {s} &quot;", f"&quot; {t} &quot;"
        if i % 7 == 0:
            s, t = s + " &apos;s", t + " &apos;s"
        src.append(s + " .")
        tgt.append(t + " .")
    return src, tgt


def _write(folder: Path, stem: str, lang: str, n: int, seed: int) -> None:
    src, tgt = _pairs(n, lang, seed)
    (folder / f"{stem}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    (folder / f"{stem}.{lang}").write_text("\n".join(tgt) + "\n", encoding="utf-8")


def write_datasets(root: Path) -> Path:
    """CIFAR-10/100 (python version), IWSLT15 en-vi and WMT14 en-de (Stanford NMT file names), and C4 'en' (a few
    allenai/c4 shards) under ``root``."""
    write_c4(root)
    write_fashion_mnist(root / "fashion-mnist", n_train=5100, n_test=60)  # fashion-mnist-scenes (001-table5)
    # as many images as the smoke scale's subsets take (64 training, 32 test; CIFAR-100's training set is one batch)
    write_cifar(root / "cifar10", "cifar10", n=32)
    write_cifar(root / "cifar100", "cifar100", n=64)
    iwslt, wmt = root / "iwslt15-en-vi", root / "wmt14-en-de"
    iwslt.mkdir()
    wmt.mkdir()
    for k, (stem, n) in enumerate((("train", 160), ("tst2012", 8), ("tst2013", 12))):
        _write(iwslt, stem, "vi", n, k)
    for k, (stem, n) in enumerate((("train", 160), ("newstest2012", 6), ("newstest2013", 8), ("newstest2014", 12))):
        _write(wmt, stem, "de", n, 10 + k)
    return root


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Every table at smoke scale: two seeds for an image table and two MT tables, one for the others."""
    root = write_datasets(tmp_path_factory.mktemp("data"))
    out = tmp_path_factory.mktemp("repro")
    two = ["000-table1", "000-table2", "003-table1"]
    one = [i for i in TABLES if i not in two]
    results = {r["table"]: r for r in reproduce(two, "smoke", str(out), seeds=2, data_root=str(root), progress=False)}
    results.update({r["table"]: r for r in reproduce(one, "smoke", str(out), seeds=1, data_root=str(root), progress=False)})
    return {"out": out, "root": root, "results": results, "one": one, "two": two}


def test_every_table_runs_at_smoke_scale_with_the_paper_column_filled(smoke):
    pytest.importorskip("pycocoevalcap")  # the captioning table's cells are scored with it
    assert set(smoke["results"]) == set(TABLES)
    for tid, t in TABLES.items():
        folder = smoke["out"] / "smoke" / tid
        md = (folder / "table.md").read_text()
        rows = list(csv.DictReader(io.StringIO((folder / "table.csv").read_text())))
        assert len(rows) == len(t.cells), tid
        for cell, row in zip(t.cells, rows):
            assert row["row"] == cell.row and row["column"] == cell.column
            assert (row["paper"] == "") == (cell.paper is None), (tid, cell.row)
            if cell.paper is not None:
                assert float(row["paper"]) == cell.paper and f"{cell.paper:.2f}" in md
        result = smoke["results"][tid]
        if tid in ("000-table1", "000-table2"):  # the differences to the baseline and the learning curves, drawn
            assert (folder / "deltas.png").stat().st_size > 0 and (folder / "curves.png").stat().st_size > 0
        for c in result["cells"]:
            if c["available"] and c["column"] == "METEOR" and not shutil.which("java"):
                assert all(m and m.get("why") for m in c["per_seed"])  # no java: a reason, not a number
            elif c["available"]:  # every runnable cell has a number from every seed
                seeds = 2 if tid in smoke["two"] else 1
                assert c["n"] == seeds and len(c["runs"]) == seeds, (tid, c["row"], c["column"])
            else:
                assert c["why"].startswith(("paper only:", "not available at smoke scale:")), c["why"]
        assert "skiplab reproduce" in md and "Settings at this scale" in md or not any(
            c["available"] for c in result["cells"])


def test_image_rows_carry_welch_and_mt_rows_a_bootstrap_per_seed(smoke):
    t1 = {c["row"]: c for c in smoke["results"]["000-table1"]["cells"]}
    assert t1["1xSkip"]["delta"] is None and t1["Baseline"]["available"] is False  # He et al.'s number only
    two = t1["2xSkip"]
    assert two["test"].startswith("Welch") and two["delta"] == pytest.approx(two["mean"] - t1["1xSkip"]["mean"])
    assert two["p"] is None or 0.0 <= two["p"] <= 1.0
    # 1rSkip+LN is the 1xSkip+LN run (the paper: equivalent)
    assert t1["1rSkip+LN"]["runs"] == t1["1xSkip+LN"]["runs"] and t1["1rSkip+LN"]["values"] == t1["1xSkip+LN"]["values"]
    t2 = {c["row"]: c for c in smoke["results"]["000-table2"]["cells"]}
    assert t2["Baseline"]["runs"] == t2["1xSkip+LN"]["runs"] == t2["1rSkip+LN"]["runs"]
    p = t2["2rSkip+LN"]["p"]
    assert t2["2rSkip+LN"]["test"].startswith("paired bootstrap") and len(p) == 2 and all(0 <= x <= 1 for x in p)
    # the seed-matched pairs' t-test with Holm's correction over the table's cells that have one
    from skiplab.analysis.blocks import holm, paired_p

    for c in t1.values():
        if c.get("available") and c["row"] != "1xSkip" and "p_paired" in c:
            pairs = [a - b for a, b in zip(c["values"], t1["1xSkip"]["values"])]
            assert c["p_paired"] == paired_p(pairs)
    ps = [c.get("p_paired") for c in smoke["results"]["000-table1"]["cells"]]
    assert [c.get("p_holm") for c in smoke["results"]["000-table1"]["cells"]] == holm(ps)
    md = (smoke["out"] / "smoke" / "000-table1" / "table.md").read_text()
    assert ("p paired, Holm" in md) == any(p is not None for p in ps)
    # accuracy tables report 100 - error of the same runs
    acc = {c["row"]: c for c in smoke["results"]["001-table7"]["cells"]}["x+F (Baseline)"]
    assert acc["values"] == pytest.approx([100 - v for v in t1["1xSkip"]["values"][:1]])


def test_mt_cells_report_tokenised_bleu_of_the_averaged_checkpoints(smoke):
    c = {c["row"]: c for c in smoke["results"]["003-table1"]["cells"] if c["column"] == "En-De"}["Transformer Base"]
    run = Path(c["runs"][0])
    scores = sorted(run.glob("score.test.beam4.avg*.json"))
    assert len(scores) == 1
    score = json.loads(scores[0].read_text())
    assert c["values"][0] == score["bleu_tok"] and "tok:none" in score["bleu_tok_signature"]
    assert json.loads((run / "config.json").read_text())["config"]["corpus"] == "wmt14-en-de(valid=newstest2012+newstest2013)"


def test_a_second_reproduce_retrains_and_rescores_nothing(smoke, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("trained or scored again")

    for task in ("image", "mt"):
        monkeypatch.setattr(tasks.TASKS[task], "train", refuse)
    monkeypatch.setattr(mt_task, "evaluate_split", refuse)
    monkeypatch.setattr(reproduce_mod, "linearity", refuse)
    ids = ["000-table1", "003-table7", "000-table5"]
    seeds = {i: 2 if i in smoke["two"] else 1 for i in ids}
    for tid in ids:
        before = smoke["results"][tid]
        (again,) = reproduce([tid], "smoke", str(smoke["out"]), seeds=seeds[tid], data_root=str(smoke["root"]),
                             progress=False)
        assert [c.get("values") for c in again["cells"]] == [c.get("values") for c in before["cells"]]


def test_collected_runs_without_checkpoints_give_the_same_table(smoke, tmp_path, monkeypatch):
    """Runs copied elsewhere with their small files only (config, metrics, summary, cached scores and probes,
    test translations: what is committed) give the same cells and p-values, training and translating nothing."""
    def refuse(*a, **k):
        raise AssertionError("trained or scored again")

    runs = smoke["out"] / "smoke" / "runs"
    for f in runs.rglob("*"):
        if f.is_file() and f.suffix != ".pt" and f.parent != runs:
            dest = tmp_path / "smoke" / "runs" / f.relative_to(runs)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f.read_bytes())
    for task in ("image", "mt", "lm"):
        monkeypatch.setattr(tasks.TASKS[task], "train", refuse)
    monkeypatch.setattr(tasks.TASKS["lm"], "score", refuse)
    monkeypatch.setattr(mt_task, "evaluate_split", refuse)
    monkeypatch.setattr(reproduce_mod, "linearity", refuse)
    for tid in ("000-table2", "003-table7", "lns-table1"):
        before = smoke["results"][tid]
        (again,) = reproduce([tid], "smoke", str(tmp_path), seeds=2 if tid in smoke["two"] else 1,
                             data_root=str(smoke["root"]), progress=False)
        assert [(c.get("values"), c.get("p")) for c in again["cells"]] == [(c.get("values"), c.get("p"))
                                                                          for c in before["cells"]]
        if tid == "000-table2":  # the bootstrap read the translations beside the moved runs
            assert any(isinstance(c.get("p"), list) and None not in c["p"] for c in again["cells"])


def test_a_table_of_runs_that_read_their_data_elsewhere_says_so(tmp_path, monkeypatch):
    """Runs are found by their settings with the data's place set aside (a moved data folder): the same table given
    another --data-root reuses them, and said nothing, while its commands named the new place (data that differ
    there gave a table of runs that never read them). The table now names where its runs read their data."""
    root = tmp_path / "data"
    write_cifar(root / "cifar10", "cifar10", n=32)  # the smoke scale takes 64 training images, 32 test
    (first,) = reproduce(["000-table1"], "smoke", str(tmp_path / "o"), seeds=1, data_root=str(root), progress=False)
    assert not any("elsewhere" in n for n in first["notes"])  # read where given: no note

    def refuse(*a, **k):
        raise AssertionError("trained again")

    monkeypatch.setattr(tasks.TASKS["image"], "train", refuse)
    moved = tmp_path / "moved"
    shutil.copytree(root, moved)
    (again,) = reproduce(["000-table1"], "smoke", str(tmp_path / "o"), seeds=1, data_root=str(moved), progress=False)
    assert [c.get("values") for c in again["cells"]] == [c.get("values") for c in first["cells"]]
    n = len({r for c in first["cells"] for r in c.get("runs", ())})
    assert again["notes"][-1].startswith(f"{n} of the table's {n} runs read their data elsewhere than given here "
                                         f"({n} at {root / 'cifar10'})"), again["notes"][-1]
    assert "read their data elsewhere than given here" in (tmp_path / "o" / "smoke" / "000-table1" / "table.md").read_text()


def test_probes_of_a_run_share_one_call_and_match_probing_alone(smoke, monkeypatch):
    """A probe table's layers of one run are probed in one call (the untouched model translated once), and
    each layer's BLEU is the one it gets probed alone."""
    before = {(c["row"], c["column"]): c.get("values") for c in smoke["results"]["003-table6"]["cells"]}
    run = Path(next(c["runs"][0] for c in smoke["results"]["003-table6"]["cells"] if c["available"]))
    for f in run.glob("probe.*.json"):
        f.unlink()
    calls = []
    real = reproduce_mod.linearity
    monkeypatch.setattr(reproduce_mod, "linearity", lambda tr, layers, **kw: calls.append(list(layers)) or real(tr, layers, **kw))
    (again,) = reproduce(["003-table6"], "smoke", str(smoke["out"]), seeds=1, data_root=str(smoke["root"]), progress=False)
    assert calls == [["encoder.0", "decoder.0"]]  # smoke's one-layer model: rows "None" and "1" of both sides
    assert {(c["row"], c["column"]): c.get("values") for c in again["cells"]} == before
    assert all(c["test"] == reproduce_mod.PROBE_TEST for c in again["cells"] if c["available"] and c["row"] != "None")
    assert "p: " + reproduce_mod.PROBE_TEST in (smoke["out"] / "smoke" / "003-table6" / "table.md").read_text()
    files = sorted(f.name.split(".beam")[0] for f in run.glob("probe.*.json"))
    assert files == ["probe.decoder.0", "probe.encoder.0"]
    alone = real(load_trained(next(run.glob("avg*.pt"))), ["decoder.0"], steps=1, beam=4, progress=False)
    assert alone["layers"][0]["bleu_tok"] == json.loads(next(run.glob("probe.decoder.0.*")).read_text())["layers"][0]["bleu_tok"]


def test_rows_restrict_what_is_trained(tmp_path, monkeypatch):
    trained = []
    monkeypatch.setattr(runs_mod, "train_missing", lambda jobs, **kw: trained.extend(
        model_config(c.model).connection for _, c in jobs))
    (result,) = reproduce(["000-table1"], "cpu", str(tmp_path), rows=("1xSkip", "2rSkip+LN"), progress=False)
    assert sorted(trained) == ["1xSkip", "1xSkip", "2rSkip+LN", "2rSkip+LN"]
    assert all(c.get("mean") is None for c in result["cells"])  # nothing ran: every cell says so
    assert "not run yet" in (tmp_path / "cpu" / "000-table1" / "table.md").read_text()


def test_shared_runs_and_reasons_at_cpu_scale():
    cpu = scale("cpu")
    t6, t1 = table("000-table6"), table("000-table1")
    r20 = resolve(t6, t6.cell("Baseline", "ResNet-20"), cpu)
    base = resolve(t1, t1.cell("1xSkip", "CIFAR-10"), cpu)
    assert runs_mod.key(r20.config) == runs_mod.key(base.config)  # one Fashion-MNIST miniature for both
    assert "does not fit" in resolve(t6, t6.cell("Baseline", "ResNet-110"), cpu).why
    t7 = table("000-table7")
    assert resolve(t7, t7.cell("Transformer-Big", "En-De"), cpu).why.startswith("not available at cpu scale")
    assert resolve(t7, t7.cell("Admin", "En-Fr"), cpu).why.startswith("paper only")
    t5 = table("003-table5")
    assert resolve(t5, t5.cell("Std, 12 layers", "En-De"), cpu).why.startswith("not available")
    # cpu: the 6-layer rows are the small preset (3 layers), 2 blocks become 1
    t05 = table("000-table5")
    six, two = (resolve(t05, t05.cell(f"1xSkip+LN, {n} blocks", "En-Vi"), cpu).config.model for n in (6, 2))
    assert six == "transformer-small(connection=1xSkip+LN)"
    assert two == "transformer-small(connection=1xSkip+LN,encoder_layers=1,decoder_layers=1)"
    # a row's runs live where its config says, seeds apart
    _, needed = plan(t1, cpu, 2, Path("r"))
    assert len(needed) == 2 * 8 and len({Path(c.out).parent for _, c in needed}) == 8


def test_paper_scale_is_the_published_setting():
    paper = scale("paper")
    t1, t3 = table("000-table1"), table("003-table1")
    cfg = resolve(t1, t1.cell("2rSkip+LN", "CIFAR-10"), paper).config
    assert (cfg.model, cfg.dataset, cfg.epochs, cfg.weight_decay) == (
        "preact-resnet110(connection=2rSkip+LN)", "cifar10", 164, 2e-4)
    mt = resolve(t3, t3.cell("Base with depth-wise LSTM", "En-De"), paper).config
    assert (mt.model, mt.warmup, mt.max_steps, mt.schedule) == ("dwlstm-base", 8000, 100_000, "vaswani")
    assert mt.corpus == "wmt14-en-de(valid=newstest2012+newstest2013)" and mt.max_tokens * mt.update_freq == 25_000
    assert table("003-table1").averaged("wmt-big-003") == 20 and table("003-table1").averaged("wmt-base-003") == 5
    assert table("001-table3").averaged("wmt-big-001") == 10


@pytest.mark.parametrize("tid,row,column", [
    ("000-table1", "2rSkip+LN", "CIFAR-10"), ("000-table3", "LN(x+3F)", "CIFAR-10"),
    ("000-table4", "2rSkip+BN", "CIFAR-10"), ("000-table6", "+ proposal (2rSkip+LN)", "ResNet-110"),
    ("000-table7", "ScaleNorm", "En-Vi"), ("001-table3", "Big: + Proposal", "En-Fr"),
    ("001-table6", "+ Transform Gate", "CIFAR-10"), ("003-table5", "Ours, 24 layers", "Cs-En"),
    ("003-table7", "6", "Decoder"), ("003-table4", "All", "En-De"),
])
def test_transcribed_numbers_appear_in_that_tables_text(tid, row, column):
    t = table(tid)
    if not (PAPERS / t.source).is_file():
        pytest.skip(f"the source documents are absent ({PAPERS})")
    text = (PAPERS / t.source).read_text(encoding="utf-8")
    n = int(tid.split("table")[1])
    caption = text.index(f"Table {n}:")
    window = text[max(0, caption - 2500): caption]
    value = t.cell(row, column).paper
    digits = 1 if tid in ("000-table7", "001-table3") else 2
    assert re.search(rf"(?<![\d.]){re.escape(f'{value:.{digits}f}')}(?!\d)", window), (tid, row, column, value)


def test_welch_p_against_a_hand_computed_case():
    # a = 1, 2, 3; b = 4, 5, 6: t = -3 / sqrt(1/3 + 1/3) = -3.674, df = 4; two-sided p = 0.02131
    assert welch_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(0.02131, abs=5e-5)
    assert welch_p([1.0], [2.0, 3.0]) is None and welch_p([1.0, 1.0], [2.0, 2.0]) is None


@pytest.mark.parametrize("argv,message", [
    (["reproduce", "000-table9", "--scale", "smoke"], "unknown table '000-table9'; known: 000-table1"),
    (["reproduce", "000-table1", "--scale", "gpu"], "unknown scale 'gpu'; known: smoke, cpu, paper"),
    (["reproduce", "000-table1", "--rows", "2xSkip,4xSkip"], "no row '4xSkip' in 000-table1; its rows: '1rSkip+LN'"),
    (["reproduce", "000-table1", "--scale", "smoke", "--data-root", "/nonexistent/data"],
     "--data-root /nonexistent/data is not a folder"),
])
def test_bad_table_or_scale_is_a_one_line_error(argv, message, capsys, tmp_path):
    assert cli.main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_list_shows_every_table_with_its_scales(capsys):
    assert cli.main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    for tid in TABLES:
        assert tid in out
    assert "GPU-hours" in out and re.search(r"cpu\s*: 9/10 cells, 16 runs \(2 seeds\), ~\d", out)
    # the tables named, not every one (they were ignored); a table named twice was built and written twice
    assert cli.main(["reproduce", "--list", "001-table4", "001-table7"]) == 0
    out = capsys.readouterr().out
    assert [t for t in TABLES if t in out] == ["001-table4", "001-table7"]
    assert cli.main(["reproduce", "001-table4,001-table4", "--scale", "smoke"]) == 2
    assert capsys.readouterr().err == "skiplab: error: 001-table4 named twice\n"


def test_jobs_train_side_by_side_in_worker_processes(tmp_path):
    root = write_datasets(tmp_path / "data")
    (result,) = reproduce(["001-table7"], "smoke", str(tmp_path / "o"), seeds=1, jobs=2, data_root=str(root),
                          progress=False)
    assert all(c["n"] == 1 for c in result["cells"])
    for run in {r for c in result["cells"] for r in c["runs"]}:  # each worker's progress went to the run's log
        assert (Path(run) / "summary.json").is_file()
        assert re.search(r"seed1: 100%.*epoch", Path(run + ".log").read_text())


def test_deltas_figure_draws_no_bar_for_a_row_not_run(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    from matplotlib.container import BarContainer

    cells = [{"row": "base", "column": "c", "baseline": "base", "delta": None, "paper_delta": None, "std": 0.1},
             {"row": "ran", "column": "c", "baseline": "base", "delta": 1.5, "paper_delta": 1.0, "std": 0.2},
             {"row": "missing", "column": "c", "baseline": "base", "delta": None, "paper_delta": -0.5, "std": None}]
    result = {"table": "t", "scale": "cpu", "metric": "BLEU", "higher_is_better": True, "cells": cells}
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    assert report.deltas_figure(result, tmp_path / "d.png") and (tmp_path / "d.png").stat().st_size > 0
    (ax,) = figures[0].axes
    paper, ours = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert [b.get_height() for b in paper] == [1.0, -0.5]  # the paper's bars: both rows other than the baseline
    assert [b.get_height() for b in ours] == [1.5]  # ours: only the row that ran, with its error bar
    assert [t.get_text().strip() for t in ax.texts] == ["not run"]
    assert ax.get_title() == "c"  # no config: the paper's column alone
    for c in cells:
        c["config"] = {"dataset": "fashion-mnist"}
    cells[0]["column"] = cells[1]["column"] = cells[2]["column"] = "CIFAR-10"
    figures.clear()
    assert report.deltas_figure(result, tmp_path / "e.png")
    assert figures[0].axes[0].get_title() == "CIFAR-10 (paper); ours: fashion-mnist"  # the data the bars came from
    for c in cells:
        c["config"] = {"dataset": "cifar10"}
    figures.clear()
    assert report.deltas_figure(result, tmp_path / "f.png") and figures[0].axes[0].get_title() == "CIFAR-10"


def test_the_table_names_the_machines_its_runs_trained_on(smoke, tmp_path):
    """"Made with" names where the runs were trained (from their config.json), not only where the table was
    made: a GPU run, a run resumed on another machine (counted for both), an unfinished run (not counted)."""
    from skiplab import host, run_dir

    here = host.machine_name(host.environment())
    made = smoke["results"]["000-table1"]
    assert set(made["run_machines"]) == {here}
    used = {r for c in made["cells"] if c["available"] for r in c["runs"]}  # cells may share runs
    assert made["run_machines"][here]["runs"] == len(used)
    gpu = {"cuda": "NVIDIA H100 80GB HBM3", "cpu": "Intel Xeon", "git_commit": "abc1234"}
    cpu = {"cpu": "AMD EPYC", "cpu_capability": "AVX512", "git_commit": "def5678"}
    dirs = []
    for k, (env, resumed, finished) in enumerate(((gpu, [], True), (gpu, [{"at": 300, "environment": cpu}], True),
                                                  (cpu, [], False))):
        d = tmp_path / f"run{k}" / "seed1"
        d.mkdir(parents=True)
        run_dir.write_json(d / "config.json", {"environment": env, "resumed_on": resumed})
        if finished:
            run_dir.write_json(d / "summary.json", {"status": "finished"})
        dirs.append(d)
    seen = reproduce_mod.run_machines(dirs)
    assert seen == {"NVIDIA H100 80GB HBM3": {"runs": 2, "commits": ["abc1234"]},
                    "AMD EPYC (AVX512)": {"runs": 1, "commits": ["def5678"]}}
    md = report.markdown({**made, "run_machines": seen})
    assert ("Runs trained on: NVIDIA H100 80GB HBM3 (2 runs, code abc1234); AMD EPYC (AVX512) (1 runs, code "
            "def5678). Table made on " + here) in md


def test_caption_cells_name_the_coco_files_they_need(tmp_path):
    """001-table5 at paper scale: without DATA_ROOT/coco each cell says which files it needs; with them the runs
    read the files inside that folder. SPICE and GLIED stay paper only; every other cell is one metric of a run."""
    t, sc = table("001-table5"), scale("paper")
    cell = t.cell("+ Proposal", "CIDEr")
    missing = resolve(t, cell, sc, str(tmp_path))
    assert missing.config is None and "dataset_coco.json" in missing.why and "cocobu_att" in missing.why
    (tmp_path / "coco" / "cocobu_att").mkdir(parents=True)
    (tmp_path / "coco" / "dataset_coco.json").write_text('{"images": []}')
    found = resolve(t, cell, sc, str(tmp_path))
    assert found.config.data_dir == str(tmp_path / "coco") and "connection=SAS" in found.config.model
    assert cell.run.metric == "CIDEr" and t.cell("Baseline", "SPICE").run is None
    assert "holding coco/: 21/32 cells" in reproduce_mod.listing()


def test_holm_counts_a_pair_of_runs_once_however_many_cells_it_stands_for():
    """mixln-table1's shape: the 12-layer miniature stands for LLaMA-71M and 130M, so Post-LN's two cells are one
    experiment, as are DeepNorm's: Holm's m is 2, not 4 (2 · 0.01 = 0.02; max(0.02, 0.04) = 0.04, where counting
    every cell gave 0.04 and 0.08). Another measure of the same runs (captioning's BLEU-4 and CIDEr) is another
    experiment."""
    post = {"runs": ["post12/seed1", "post12/seed2"], "baseline_runs": ["pre12/seed1", "pre12/seed2"],
            "measured": "bpb", "p_paired": 0.01}
    deep = {**post, "runs": ["deep12/seed1", "deep12/seed2"], "p_paired": 0.04}
    cells = [dict(post), dict(post), dict(deep), dict(deep), {"p_paired": None}]
    assert reproduce_mod.holm_cells(cells) == 2
    assert [c.get("p_holm") for c in cells] == [pytest.approx(0.02)] * 2 + [pytest.approx(0.04)] * 2 + [None]
    measures = [{**post, "measured": "BLEU-4"}, {**post, "measured": "CIDEr"}]
    assert reproduce_mod.holm_cells(measures) == 2
    assert [c["p_holm"] for c in measures] == [pytest.approx(0.02)] * 2


def test_a_table_whose_runs_trained_on_a_gpu_says_so_and_deepnet_is_out_of_reach():
    about = "miniatures for a 2-core CPU: about an hour per table at the default 2 seeds a row"
    gpu = {"scale": "cpu", "scale_about": about, "seeds": 2,
           "run_kinds": {"NVIDIA H100 80GB HBM3, bf16 autocast": {"runs": 16, "gpu": True}}}
    line = report.scale_line(gpu)
    assert "2-core CPU" not in line and "trained on NVIDIA H100 80GB HBM3, bf16 autocast (16 runs)" in line
    cpu = {**gpu, "seeds": 3, "run_kinds": {"AMD EPYC (AVX2), fp32": {"runs": 6, "gpu": False}}}
    assert report.scale_line(cpu) == (f"Scale `cpu`: {about}; seeds 1-3. Trained on: AMD EPYC (AVX2), fp32 (6 runs).")
    recorded = Path(__file__).resolve().parents[1] / "docs" / "results" / "repro" / "h100-cpu-scale"
    header = (recorded / "mixln-table1" / "table.md").read_text().split("\n\n")[1]
    assert "2-core CPU" not in header and "NVIDIA H100" in header
    assert "(6 in the family)" in (recorded / "mixln-table1" / "table.md").read_text()
    listed = reproduce_mod.listing().split("deepnet-table1", 1)[1].split("\n\n")[0]
    assert "OUT OF REACH at cpu scale: its depths run to 100-100 layers" in listed


def test_a_difference_that_rounds_to_zero_reads_plus_zero():
    from skiplab.reproduce.report import _signed

    assert [_signed(v) for v in (-0.001, -0.0, 0.004, -0.006, 1.5, None)] == ["+0.00", "+0.00", "+0.00", "-0.01",
                                                                              "+1.50", "-"]


def test_a_finished_run_of_other_settings_is_refused_before_anything_trains(tmp_path, monkeypatch):
    """A run at a job's path that finished with other settings (trained by hand there with another --lr) was
    counted in the table as it was; now it is one line naming what differs, and nothing trains."""
    from skiplab.train.image import ImageTrainConfig

    cfg = ImageTrainConfig(out=str(tmp_path / "run" / "seed1"))
    other = dataclasses.replace(cfg, lr=5.0)
    Path(cfg.out).mkdir(parents=True)
    run_dir.write_json(Path(cfg.out) / "config.json", {"config": dataclasses.asdict(other)})
    run_dir.write_json(Path(cfg.out) / "summary.json", {"status": "finished", "final_test_error": 1.0})
    trained = []
    monkeypatch.setattr(parallel, "_train", lambda *a: trained.append(a))
    with pytest.raises(run_dir.RunDirError, match=r"holds a run with other settings \(lr\); remove it"):
        parallel.train_missing([("image", cfg)], progress=False)
    assert not trained
    run_dir.write_json(Path(cfg.out) / "config.json", {"config": dataclasses.asdict(cfg)})  # the job's own: counted
    assert parallel.train_missing([("image", cfg)], progress=False) == {cfg.out: {"status": "finished",
                                                                                 "final_test_error": 1.0}}


def test_a_finished_summary_without_its_measure_is_one_line(tmp_path):
    """A summary.json that says finished but lacks the run's metric (edited, cut) was a KeyError traceback."""
    from skiplab.train.image import ImageTrainConfig

    cfg = ImageTrainConfig(out=str(tmp_path / "seed1"))
    with pytest.raises(run_dir.RunDirError, match=r"seed1/summary.json: a finished run's summary without "
                                                  r"final_test_error; remove the run to train it again"):
        tasks.get("image").measure(cfg, {"status": "finished", "steps": 1}, "error", 1, 1, False)
    with pytest.raises(run_dir.RunDirError, match="without train_time_s"):
        run_dir.require({"status": "finished"}, ("train_time_s",), Path(cfg.out) / "summary.json")


def test_a_table_of_more_seeds_is_not_replaced_by_fewer_without_overwrite(tmp_path, monkeypatch, capsys):
    """`--seeds 1` after a 2-seed table rewrote it with one-seed cells, silently; now refused in one line before any
    run, unless --overwrite (the runs stay either way); more seeds replace it as before."""
    monkeypatch.setattr(runs_mod, "train_missing", lambda jobs, **kw: {})
    reproduce(["000-table1"], "cpu", str(tmp_path), seeds=2, progress=False)
    table_json = tmp_path / "cpu" / "000-table1" / "table.json"
    before = table_json.read_bytes()
    with pytest.raises(run_dir.RunDirError, match=r"000-table1 holds the table of another comparison, with seeds 2, "
                                                  r"which this one lacks; give another --out, or --overwrite"):
        reproduce(["000-table1"], "cpu", str(tmp_path), seeds=1, progress=False)
    assert table_json.read_bytes() == before
    assert cli.main(["reproduce", "000-table1", "--out", str(tmp_path), "--seeds", "1"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    reproduce(["000-table1"], "cpu", str(tmp_path), seeds=3, progress=False)
    reproduce(["000-table1"], "cpu", str(tmp_path), seeds=1, progress=False, overwrite=True)
    assert json.loads(table_json.read_text())["seeds"] == 1


def test_the_docs_cpu_times_are_the_listings_estimates():
    """docs/reproducing.md's table of tables gives each table's cpu-scale time as `reproduce --list` estimates it
    (its image rows had gone stale, 1.4 times the listing's)."""
    listed, current = {}, None
    for line in reproduce_mod.listing().splitlines():
        if m := re.match(r"^(\S+)  ", line):
            current = m.group(1)
        elif m := re.match(r"^\s+cpu\s*: .*?, (~[^()]+?) \(estimate", line):
            listed[current] = m.group(1).strip()
    doc = (Path(__file__).parents[1] / "docs" / "reproducing.md").read_text()
    rows = dict(re.findall(r"^\| `([^`]+)` \| .* \| [^|]*?, \d+, (~\d+ h \d+ min|~\d+ h|~\d+ min \d+ s|~\d+ min)", doc,
                           re.M))
    assert set(rows) == set(listed) and rows == listed


def test_rows_whose_names_hold_a_comma_can_be_named(tmp_path, monkeypatch):
    """000-table5's rows are "2rSkip+LN, 2 blocks" ...: --rows split them at the comma and named none."""
    names = list(table("000-table5").rows)
    assert reproduce_mod.rejoined(("2rSkip+LN", "2 blocks", "1xSkip+LN", "6 blocks"), names) == \
        ("2rSkip+LN, 2 blocks", "1xSkip+LN, 6 blocks")
    assert reproduce_mod.rejoined(("2rSkip+LN", "nope"), names) == ("2rSkip+LN", "nope")  # refused by name below
    trained = []
    monkeypatch.setattr(runs_mod, "train_missing", lambda jobs, **kw: trained.extend(jobs))
    reproduce(["000-table5"], "cpu", str(tmp_path), rows=("2rSkip+LN", "2 blocks"), seeds=1, progress=False)
    assert len(trained) == 1 and "2rSkip+LN" in trained[0][1].model
    with pytest.raises(ValueError, match=r"no row '2rSkip\+LN', 'nope' in 000-table5; its rows: '1xSkip\+LN, 2 blocks'"):
        reproduce(["000-table5"], "cpu", str(tmp_path), rows=("2rSkip+LN", "nope"), seeds=1, progress=False)
