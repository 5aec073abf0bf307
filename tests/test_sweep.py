"""``skiplab sweep lm``: every design x depth x lr x seed one run (diverged ones counted, not retried), the table's
numbers equal to the runs' own summaries, runs reused by a second sweep, the best and highest stable lr, and the
one-line errors before anything trains."""

import csv
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skiplab import host, tasks
from skiplab.analysis.report import pyplot
from skiplab.reproduce.sweep import aggregate, plan, stability
from skiplab.reproduce.sweep_report import _reference_line
from skiplab.train import lm_data
from skiplab.train.lm import LMTrainConfig
from skiplab.train.lm_data import unigram_baseline
from tests.train.test_distributed import one_thread
from tests.train.test_lm import run, text  # noqa: F401 (text: the tiny corpus fixture)

BASE = "gpt-mini(d_model=32,heads=2,ffn_dim=64,context=32)"  # the sweep sets layers and connection
STABLE, HUGE = 3e-3, 1e6  # a tiny model trains at the first; the second makes the loss NaN within three updates


AXES = {"connections": "PreLN,PostLN", "depths": "2,1", "lrs": f"{HUGE:g},{STABLE:g}"}


def sweep_args(text, out, **options):
    """``skiplab sweep lm`` on the tiny corpus, four updates a run, one seed; ``options`` (field=value) change, add."""
    given = {"corpus": "", "train_file": text / "train.jsonl", "valid_file": text / "valid.jsonl",
             "test_file": text / "test.jsonl", "model": BASE, "batch_size": 8, "max_steps": 4, "eval_every": 2,
             "warmup": 2, "device": "cpu", "seeds": 1, "out": out, **options}
    return ["sweep", "lm", *(x for k, v in given.items() for x in ("--" + k.replace("_", "-"), v))]


@pytest.fixture(scope="module")
def swept(text, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("sweep") / "s"
    with one_thread():
        assert run(sweep_args(text, out, **AXES)) == 0
    return out


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_every_point_is_one_run_and_the_rows_are_its_runs_numbers(swept):
    result = load(swept / "sweep.json")
    assert result["axes"] == {"connections": ["PreLN", "PostLN"], "depths": [1, 2], "lrs": [STABLE, HUGE], "seeds": 1}
    assert result["config"]["max_steps"] == 4 and "environment" in result
    assert result["command"].startswith("skiplab sweep lm --corpus '' --train-file ")  # as given, to run again
    assert "--lrs 1e+06,0.003" in result["command"] and result["command"] in (swept / "sweep.md").read_text()
    records = result["runs"]
    assert len(records) == 8 and len({r["dir"] for r in records}) == 8
    assert sorted(p.parent for p in (swept / "runs").glob("*/seed1/summary.json")) == sorted(
        Path(r["dir"]) for r in records)
    for r in records:  # each run trained what its point says, and diverged exactly at the huge lr
        config = load(Path(r["dir"]) / "config.json")["config"]
        assert config["lr"] == r["lr"] and config["seed"] == 1
        assert f"connection={r['connection']}" in config["model"] and f"layers={r['depth']}" in config["model"]
        assert r["status"] == ("diverged" if r["lr"] == HUGE else "finished")

    code = host.code_name(host.environment())  # every run started and ended on this code
    assert all(r["code"] == [code] for r in records) and result["pairing"]["codes"] == {code: 8}
    assert f"Code: {code} (8 runs)." in (swept / "sweep.md").read_text()

    rows = result["rows"]
    assert [(r["connection"], r["depth"], r["lr"]) for r in rows] == [
        (c, d, lr) for c in ("PreLN", "PostLN") for d in (1, 2) for lr in (STABLE, HUGE)]
    table = (swept / "sweep.md").read_text()
    written = {(r["connection"], int(r["depth"]), float(r["lr"])): r
               for r in csv.DictReader((swept / "sweep.csv").read_text().splitlines())}
    for row in rows:
        (rec,) = [r for r in records if (r["connection"], r["depth"], r["lr"]) == (row["connection"], row["depth"],
                                                                                   row["lr"])]
        summary = load(Path(rec["dir"]) / "summary.json")  # the run's own numbers, by hand
        line = written[row["connection"], row["depth"], row["lr"]]
        assert row["runs"] == 1 and int(line["runs"]) == 1
        # per-step telemetry, diverged runs too: the run's spikes and largest gradient norm, in the csv as they are
        assert (row["loss_spikes"], row["max_grad_norm"]) == (summary["loss_spikes"], summary["max_grad_norm"])
        assert int(line["loss_spikes"]) == summary["loss_spikes"]
        if row["lr"] == HUGE:
            assert summary["status"] == "diverged" and "test_bpb" not in summary
            assert (row["finished"], row["diverged"], row["mean"], row["std"]) == (0, 1, None, None)
            assert line["mean"] == "" and line["diverged"] == "1"
        else:
            assert (row["finished"], row["diverged"], row["n"]) == (1, 0, 1)
            assert row["mean"] == summary["test_bpb"] and 0 < row["mean"] < 9 and row["std"] == 0
            assert row["valid_mean"] == summary["final_valid_bpb"]
            assert row["s_per_update"] == pytest.approx(summary["train_time_s"] / summary["steps"])
            assert float(line["mean"]) == pytest.approx(summary["test_bpb"], rel=1e-12)
            assert f"| {row['connection']:<10} | {row['depth']:<5} | 0.003 | 1/1 " in table
            assert f"{summary['test_bpb']:.3f} ± 0.000" in table
    assert table.count("all diverged") == 4
    assert "| s/update | loss spikes | max grad norm |" in table
    for s in result["stability"]:  # the huge lr diverged everywhere: the stable one is both the best and the highest
        assert (s["best_lr"], s["highest_stable_lr"], s["diverged"], s["runs"]) == (STABLE, STABLE, 1, 2)
    for name in ("depth.png", "lr.png", "curves.png"):
        assert (swept / name).stat().st_size > 10_000


def test_the_reference_is_the_unigram_model_of_the_training_bytes(swept, text, tmp_path):  # noqa: F811
    """By hand from the files: byte counts of the training documents (+ one end of text each, id 256), add-one
    over 257 ids; the test documents' bytes and end-of-text tokens, all but the first token, scored."""
    def docs(split):
        return [json.loads(line)["text"].encode() for line in (text / f"{split}.jsonl").read_text().splitlines()]
    counts = [0] * 257
    for d in docs("train"):
        for b in d:
            counts[b] += 1
        counts[256] += 1
    total = sum(counts) + 257
    test = [t for d in docs("test") for t in (*d, 256)]
    nats = -sum(math.log((counts[t] + 1) / total) for t in test[1:])
    bpb = nats / (math.log(2) * sum(len(d) for d in docs("test")))
    ref = load(swept / "sweep.json")["reference"]
    assert ref == {"label": "unigram model of the training split", "value": pytest.approx(bpb, rel=1e-9)}
    first = next(r for r in load(swept / "sweep.json")["runs"] if r["status"] == "finished")
    assert load(Path(first["dir"]) / "summary.json")["unigram_test_bpb"] == ref["value"]  # kept for the next sweep
    assert f"the unigram model of the training split reaches {bpb:.3f} test bits per byte" in (
        swept / "sweep.md").read_text()
    files = {f"{split}_file": str(text / f"{split}.jsonl") for split in ("train", "valid", "test")}
    no_run = LMTrainConfig(corpus="", out=str(tmp_path / "none"), **files)  # bytes need no checkpoint (restored runs)
    assert unigram_baseline(no_run)["bpb"] == pytest.approx(bpb, rel=1e-9)
    assert unigram_baseline(dataclasses.replace(no_run, tokenizer="bpe")) is None  # its tokenizer is in no checkpoint


def test_the_text_is_tokenised_once_for_every_run(swept):
    """Every run reads one prepared folder under the runs' root (made by the sweep), not the text."""
    dirs = {load(p)["config"]["data_dir"] for p in (swept / "runs").glob("*/seed1/config.json")}
    (folder,) = map(Path, dirs)
    assert folder.parent == swept / "runs" / "prepared" and load(folder / "prepared.json")["tokenizer"] == "bytes"


def test_a_second_sweep_trains_and_scores_nothing(swept, text, monkeypatch, capsys):  # noqa: F811
    def refuse(*a, **k):
        raise AssertionError("trained or scored again")

    monkeypatch.setattr(tasks.TASKS["lm"], "train", refuse)
    monkeypatch.setattr(tasks.TASKS["lm"], "score", refuse)
    monkeypatch.setattr(lm_data, "unigram_baseline", refuse)  # the reference too is kept in a run's summary
    summaries = sorted((swept / "runs").glob("*/seed1/summary.json"))
    before = {p: p.stat().st_mtime_ns for p in summaries}
    rows = load(swept / "sweep.json")["rows"]
    capsys.readouterr()
    assert run(sweep_args(text, swept, **AXES)) == 0
    assert {p: p.stat().st_mtime_ns for p in summaries} == before
    assert load(swept / "sweep.json")["rows"] == rows
    out = capsys.readouterr().out
    assert "8 runs (4 finished, 4 diverged already)" in out
    assert "| connection | depth | lr " in out and "Highest stable lr" in out and "sweep.md" in out.splitlines()[-1]


def test_a_sweep_given_another_sweeps_runs_reuses_the_ones_it_shares(swept, text, monkeypatch, tmp_path):  # noqa: F811
    def refuse(*a, **k):
        raise AssertionError("trained again")

    monkeypatch.setattr(tasks.TASKS["lm"], "train", refuse)
    out = tmp_path / "subset"  # one design at the deepest depth: a subset of the first sweep's runs
    assert run(sweep_args(text, out, connections="PostLN", depths="2", lrs=f"{STABLE:g}",
                          runs=swept / "runs")) == 0
    (record,) = load(out / "sweep.json")["runs"]
    first = next(r for r in load(swept / "sweep.json")["runs"]
                 if (r["connection"], r["depth"], r["lr"]) == ("PostLN", 2, STABLE))
    assert record["dir"] == first["dir"] and record["test_bpb"] == first["test_bpb"] is not None
    assert not (out / "runs").exists() and (out / "sweep.md").is_file()


def test_one_lr_is_the_configs_and_draws_no_lr_figure(text, tmp_path):  # noqa: F811
    out = tmp_path / "one"
    with one_thread():
        assert run(sweep_args(text, out, connections="PreLN", depths="1", max_steps=2)) == 0
    result = load(out / "sweep.json")
    assert result["axes"]["lrs"] == [LMTrainConfig.lr] and len(result["runs"]) == 1
    assert (out / "depth.png").is_file() and (out / "curves.png").is_file() and not (out / "lr.png").exists()
    assert "Highest stable lr" not in (out / "sweep.md").read_text()
    width = int.from_bytes((out / "curves.png").read_bytes()[16:20], "big")  # the PNG header's width in pixels
    assert width >= 7 * 120  # one depth, one panel: still wide enough for the two-line title (7 in at 120 dpi)


def test_the_axes_are_checked_and_the_lr_defaults_to_the_configs():
    base = LMTrainConfig(model=BASE, lr=2e-3)
    points, axes = plan("lm", base, ("PreLN", "DeepNorm"), ("8", 4))
    assert axes == {"connections": ["PreLN", "DeepNorm"], "depths": [4, 8], "lrs": [2e-3]}
    assert [p.config.model for p in points][:2] == [f"{BASE[:-1]},connection=PreLN,layers=4)",
                                                    f"{BASE[:-1]},connection=PreLN,layers=8)"]
    assert {p.config.lr for p in points} == {2e-3}


def rec(conn, lr, seed, status, value=None, depth=8):
    return {"connection": conn, "depth": depth, "lr": lr, "seed": seed, "status": status, "test_bpb": value,
            "final_valid_bpb": None if value is None else value + 0.5, "s_per_update": 0.1 if value else None}


def test_best_and_highest_stable_lr_on_hand_made_runs():
    records = [
        # PostLN: the lowest mean (1.0) is of one seed of two, the other diverged: not stable, not the best
        rec("PostLN", 1e-3, 1, "finished", 1.5), rec("PostLN", 1e-3, 2, "finished", 1.7),
        rec("PostLN", 3e-3, 1, "finished", 1.4), rec("PostLN", 3e-3, 2, "finished", 1.4),
        rec("PostLN", 1e-2, 1, "finished", 1.0), rec("PostLN", 1e-2, 2, "diverged"),
        # PreLN: the smallest lr diverged, the larger two did not (stability need not be monotone); a tie
        rec("PreLN", 1e-3, 1, "diverged"), rec("PreLN", 1e-3, 2, "diverged"),
        rec("PreLN", 3e-3, 1, "finished", 2.0), rec("PreLN", 3e-3, 2, "finished", 2.2),
        rec("PreLN", 1e-2, 1, "finished", 2.2), rec("PreLN", 1e-2, 2, "finished", 2.0),
        # DeepNorm: every run diverged; and one cell short of a seed (not trained) is not stable either
        rec("DeepNorm", 1e-3, 1, "diverged"), rec("DeepNorm", 1e-3, 2, "diverged"),
        rec("DeepNorm", 3e-3, 1, "finished", 1.2), rec("DeepNorm", 3e-3, 2, "missing"),
    ]
    rows = aggregate(records, "test_bpb", "final_valid_bpb")
    post = {r["lr"]: r for r in rows if r["connection"] == "PostLN"}
    assert post[1e-3]["mean"] == pytest.approx(1.6) and post[1e-3]["std"] == pytest.approx(math.sqrt(0.02))
    assert post[1e-3]["valid_mean"] == pytest.approx(2.1) and post[1e-3]["s_per_update"] == pytest.approx(0.1)
    assert (post[1e-2]["finished"], post[1e-2]["diverged"], post[1e-2]["n"], post[1e-2]["mean"]) == (1, 1, 1, 1.0)
    deep = [r for r in rows if r["connection"] == "DeepNorm"]
    assert [(r["runs"], r["finished"], r["diverged"]) for r in deep] == [(2, 0, 2), (2, 1, 0)]

    best = {s["connection"]: s for s in stability(rows)}
    assert (best["PostLN"]["best_lr"], best["PostLN"]["highest_stable_lr"]) == (3e-3, 3e-3)
    assert best["PostLN"]["best_mean"] == pytest.approx(1.4) and best["PostLN"]["diverged"] == 1
    assert (best["PreLN"]["best_lr"], best["PreLN"]["highest_stable_lr"]) == (3e-3, 1e-2)  # a tie: the smaller
    assert (best["DeepNorm"]["best_lr"], best["DeepNorm"]["highest_stable_lr"], best["DeepNorm"]["best_mean"]) == (
        None, None, None)
    higher = {s["connection"]: s for s in stability(rows, higher_is_better=True)}  # BLEU, say: the largest mean
    assert higher["PostLN"]["best_lr"] == 1e-3 and higher["PreLN"]["best_lr"] == 3e-3


@pytest.mark.parametrize("change, message", [
    ({"depths": "0"}, "--depths: a depth must be >= 1, got 0"),
    ({"depths": "2,x"}, "--depths: 'x' is not an integer"),
    ({"depths": "1.5"}, "--depths: '1.5' is not an integer"),
    ({"depths": "2,2"}, "--depths: 2 is listed twice"),
    ({"connections": "PreLN,Foo"}, "bad connection spec 'Foo': unknown name 'Foo'"),
    ({"connections": "PreLN,PreLN"}, "a connection is listed twice: PreLN, PreLN"),
    ({"connections": "PostLN,1xSkip+LN"}, "a connection is listed twice"),  # one design under two names
    ({"lrs": "1e-3,-1"}, "--lrs: a learning rate must be > 0, got -1"),
    ({"lrs": "0"}, "--lrs: a learning rate must be > 0, got 0"),
    ({"lrs": "1e-3,0.001"}, "--lrs: 0.001 is listed twice"),
    ({"lrs": "1e-5"}, "--lrs 1e-05: need 0 <= --min-lr <= --lr"),  # below the schedule's floor: named as --lrs
    ({"model": "gpt-mini(layers=2)"}, "the sweep sets layers; leave it out of --model"),
    ({"model": "transformer-small"}, "transformer-small is not a language model"),
    ({"test_file": ""}, "scored on the test split: give --test-file"),
])
def test_bad_axes_are_one_line_errors_before_anything_trains(change, message, text, tmp_path,  # noqa: F811
                                                            monkeypatch, capsys):
    monkeypatch.setattr(tasks.TASKS["lm"], "train", lambda *a, **k: pytest.fail("trained"))
    assert run(sweep_args(text, tmp_path / "bad", **{**AXES, **change})) == 2
    err = capsys.readouterr().err
    assert err.startswith("skiplab: error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "bad").exists()


def test_the_reference_is_drawn_inside_the_axes_or_named_off_them():
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [2.0, 3.0])
    _reference_line(ax, {"reference": {"label": "unigram", "value": 4.8}})  # above the runs: named, not drawn
    assert ax.get_ylim()[1] < 4.8 and not ax.lines[1].get_xdata().size
    assert ax.lines[1].get_label() == "unigram: 4.800 (above the axes)"
    _reference_line(ax, {"reference": {"label": "unigram", "value": 2.5}})  # inside: a horizontal line at it
    assert list(ax.lines[2].get_ydata()) == [2.5, 2.5] and ax.lines[2].get_label() == "unigram"
    _reference_line(ax, {"reference": None})
    assert len(ax.lines) == 3
    plt.close(fig)


def test_a_sweep_that_would_drop_part_of_the_table_in_its_out_is_refused_unless_overwrite(swept, text, tmp_path,  # noqa: F811
                                                                                          capsys):
    out = tmp_path / "again"
    out.mkdir()
    (out / "sweep.json").write_bytes((swept / "sweep.json").read_bytes())  # the whole sweep's table, its runs shared
    smaller = sweep_args(text, out, connections="PostLN", depths="2", lrs=f"{STABLE:g}", runs=swept / "runs")
    capsys.readouterr()
    assert run(smaller) == 2
    err = capsys.readouterr().err
    assert "holds the table of another comparison, with connections PreLN; depths 1; lrs 1e+06" in err, err
    assert err.count("\n") == 1 and (out / "sweep.json").read_bytes() == (swept / "sweep.json").read_bytes()
    assert run([*smaller, "--overwrite"]) == 0
    assert len(load(out / "sweep.json")["rows"]) == 1
    assert run(sweep_args(text, out, connections="PostLN", depths="2", lrs=f"{STABLE:g}", runs=swept / "runs")) == 0
    # the same axes at other settings: their table would replace this one's, silently
    kept = (out / "sweep.json").read_bytes()
    capsys.readouterr()
    longer = sweep_args(text, out, connections="PostLN", depths="2", lrs=f"{STABLE:g}", runs=swept / "runs",
                        max_steps=6, warmup=1)
    assert run(longer) == 2
    assert capsys.readouterr().err == (f"skiplab: error: {out} holds the table of a sweep with other settings "
                                       "(max_steps 4, not 6, warmup 2, not 1); give another --out, or --overwrite to "
                                       "replace that table (its runs stay)\n")
    assert (out / "sweep.json").read_bytes() == kept


def test_a_training_runs_folder_is_refused_as_the_sweeps_out(swept, text, monkeypatch, capsys):  # noqa: F811
    """As compare refuses it: a sweep's runs, table and figures would land beside the run's checkpoints."""
    monkeypatch.setattr(tasks.TASKS["lm"], "train", lambda *a, **k: pytest.fail("trained"))
    run_folder = next(p.parent for p in sorted((swept / "runs").glob("*/seed1/config.json")))
    before = sorted(p.name for p in run_folder.iterdir())
    capsys.readouterr()
    assert run(sweep_args(text, run_folder, **AXES)) == 2
    err = capsys.readouterr().err
    assert "is a training run's folder; a sweep writes its runs and table in a folder of its own" in err
    assert err.count("\n") == 1 and sorted(p.name for p in run_folder.iterdir()) == before


def test_a_sweeps_folder_and_a_comparisons_are_refused_to_each_other(swept, text, tmp_path, monkeypatch, capsys):  # noqa: F811
    """A comparison given a sweep's --out (or reproduce's) wrote its runs beside the sweep's and replaced its
    curves.png; a sweep given a comparison's, alike."""
    monkeypatch.setattr(tasks.TASKS["lm"], "train", lambda *a, **k: pytest.fail("trained"))
    before = {p: p.read_bytes() for p in swept.iterdir() if p.is_file()}
    compare = ["compare", "lm", *sweep_args(text, swept)[2:-8], "--connections", "PreLN", "--out", swept]
    capsys.readouterr()
    assert run(compare) == 2
    assert capsys.readouterr().err == (f"skiplab: error: {swept} holds the results of a sweep; a comparison writes "
                                       "its runs and table in a folder of its own: give another --out\n")
    assert {p: p.read_bytes() for p in swept.iterdir() if p.is_file()} == before
    compared = tmp_path / "cmp"
    compared.mkdir()
    (compared / "compare.json").write_text("{}")
    assert run(sweep_args(text, compared, **AXES)) == 2
    assert "holds the results of a comparison; a sweep writes" in capsys.readouterr().err
    repro = tmp_path / "repro"
    (repro / "cpu" / "001-table4").mkdir(parents=True)
    (repro / "cpu" / "001-table4" / "table.json").write_text("{}")
    assert run(sweep_args(text, repro, **AXES)) == 2
    assert "holds the results of reproduce's tables; a sweep writes" in capsys.readouterr().err
    assert sorted(p.name for p in repro.iterdir()) == ["cpu"]


def test_a_sweep_refused_once_it_looks_for_its_data_leaves_no_folder(tmp_path, capsys):
    """Its --out (and the folders above it) made for the prepared data, then the data not there: one line, and
    nothing left behind (the folders held no file)."""
    out = tmp_path / "new" / "sweep"
    argv = ["sweep", "lm", "--model", BASE, "--corpus", "pydocs", "--data-dir", str(tmp_path / "nope"),
            "--connections", "PreLN", "--depths", "1", "--seeds", "1", "--max-steps", "2", "--device", "cpu",
            "--out", str(out)]
    assert run(argv) == 2
    assert "no such file" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_ctrl_c_on_a_two_job_sweep_is_one_line_not_the_workers_tracebacks(text, tmp_path):  # noqa: F811
    """Ctrl-C reaches the whole process group: the workers leave it to the parent, which stops them and says so in one
    line (each worker printed a KeyboardInterrupt traceback of its own before)."""
    out = tmp_path / "s"
    argv = sweep_args(text, out, connections="PreLN", depths="1,2", lrs=f"{STABLE:g}", max_steps=100_000,
                      eval_every=100_000, warmup=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "skiplab", *map(str, argv), "--jobs", "2"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(list((out / "runs").glob("*/seed1/config.json"))) < 2:
        time.sleep(0.5)  # both workers training
    assert len(list((out / "runs").glob("*/seed1/config.json"))) == 2, proc.communicate(timeout=60)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "skiplab: interrupted" in err
