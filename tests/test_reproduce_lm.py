"""``skiplab reproduce`` for the language-model tables (Mix-LN, curse of depth, hyper-connections): the transcribed numbers, what
each cell runs at each scale, the C4 shards, and a smoke table end to end with the paper's numbers beside ours
in another unit."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import random
import re
import shlex
from pathlib import Path

import pytest

from skiplab import cli, tasks
from skiplab.connections import parse_spec
from skiplab.models import build_model, model_config
from skiplab.reproduce import TABLES, report, reproduce, resolve, scale, table
from skiplab.reproduce import runs as runs_mod
from skiplab.reproduce.scales import C4_T5, DOLMA_OLMO, LM_PAPER, OLMO_PAPER, OLMO_STEPS, SCALES
from skiplab.corpora.documents import load_documents
from skiplab.corpora.prepare import PrepareConfig, prepare
from skiplab.corpora.shards import SIDECAR
from skiplab.train import lm, lm_data

pytestmark = pytest.mark.filterwarnings("error:Tight layout not applied")

LM_IDS = ("mixln-table1", "lns-table1", "lns-table4")

# The published numbers, copied again by hand from the papers' tables (so that a typo in papers_lm.py shows).
PUBLISHED = {
    "mixln-table1": {  # Li, Yin, Liu (ICLR 2025), arXiv 2412.13795v1, Table 1
        "columns": ["LLaMA-71M", "LLaMA-130M", "LLaMA-250M", "LLaMA-1B"],
        "Post-LN": [35.18, 26.95, 1409.09, 1411.54],
        "DeepNorm": [34.87, 27.17, 22.77, 1410.94],
        "Pre-LN": [34.77, 26.78, 21.92, 18.65],
        "Mix-LN": [33.12, 26.07, 21.39, 18.18],
    },
    "lns-table1": {  # Sun et al. (2025), arXiv 2502.05795v1, Table 1
        "columns": ["LLaMA-130M", "LLaMA-250M", "LLaMA-350M", "LLaMA-1B"],
        "Post-LN": [26.95, 1409.79, 1368.33, 1390.75],
        "DeepNorm": [27.17, 22.77, 1362.59, 1409.08],
        "Mix-LN": [26.07, 21.39, 1363.21, 1414.78],
        "Pre-LN": [26.73, 21.92, 19.58, 17.02],
        "Pre-LN + LayerNorm Scaling": [25.76, 20.35, 18.20, 15.71],
    },
    "lns-table4": {  # Sun et al. (2025), revised version, Table 4
        "columns": ["LLaMA-130M", "LLaMA-250M"],
        "Pre-LN": [26.73, 21.92],
        "+ LayerScale": [27.93, 23.45],
        "+ SkipInit": [27.41, 22.29],
        "+ Depth-Scaled Initialization": [26.95, 21.50],
        "+ Scaled Initialization": [26.04, 20.98],
        "+ LayerNorm Scaling": [25.76, 20.35],
        "+ LayerNorm Scaling + Scaled Initialization": [25.80, 20.79],
    },
}

# Zhu et al. (ICLR 2025), arXiv 2409.19606, Tables 1 and 2: (V2 eval loss, V3 eval loss)
HC_PUBLISHED = {
    "hc-table1": {"OLMo-1B": [2.811, 2.544], "DHC×1 W/O tanh": [2.822, 2.556], "DHC×2 W/O tanh": [2.792, 2.537],
                  "DHC×4 W/O tanh": [2.779, 2.516], "DHC×8 W/O tanh": [2.777, 2.514], "DHC×1": [2.819, 2.556],
                  "DHC×2": [2.802, 2.534], "DHC×4": [2.781, 2.514], "DHC×8": [2.778, 2.516]},
    "hc-table2": {"OLMo-1B": [2.811, 2.544], "SHC×2": [2.799, 2.538], "DHC×2": [2.802, 2.534],
                  "DHC×2 W/O tanh": [2.792, 2.529], "SHC×4": [2.791, 2.528], "DHC×4": [2.781, 2.515],
                  "DHC×4 W/O tanh": [2.779, 2.516]},
}

WORDS = ("the a of to and in model layer norm deep residual train data text token loss small large "
         "network learns every step grows falls").split()


def _doc(rng: random.Random) -> str:
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize() + "."
                 for _ in range(rng.randint(2, 5))]
    return " ".join(sentences)


def write_shard(path: Path, docs: int, seed: int) -> list[str]:
    """One C4 shard as allenai/c4 publishes it: gzipped JSON lines with text, timestamp and url."""
    rng = random.Random(seed)
    texts = [_doc(rng) for _ in range(docs)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"text": text, "timestamp": "2019-04-25T12:57:54Z",
                                "url": f"https://example.org/{seed}/{i}"}) + "\n")
    return texts


def write_c4(root: Path) -> Path:
    """A tiny C4 'en' under ``root/c4-en``: two of the 1,024 train shards (not the first two) and one of the
    eight validation shards."""
    folder = root / "c4-en"
    for k, seed in ((0, 1), (3, 2)):
        write_shard(folder / f"c4-train.{k:05d}-of-01024.json.gz", 60, seed)
    write_shard(folder / "c4-validation.00000-of-00008.json.gz", 25, 9)
    return folder


# ---- the tables as data -------------------------------------------------------------------------------------
@pytest.mark.parametrize("tid", LM_IDS)
def test_transcribed_numbers_against_a_literal_copy(tid):
    t, published = table(tid), PUBLISHED[tid]
    assert t.columns == published["columns"]
    assert t.rows == [r for r in published if r != "columns"]
    for row in t.rows:
        assert [t.cell(row, col).paper for col in t.columns] == published[row], (tid, row)
    assert (t.metric, t.higher_is_better, t.baseline) == ("perplexity", False, "Pre-LN")
    assert "arXiv" in t.source and f"Table {tid.split('table')[1]}" in t.source


def test_each_paper_is_transcribed_as_it_prints_the_shared_rows():
    mix, lns = table("mixln-table1"), table("lns-table1")
    same = [("DeepNorm", "LLaMA-130M"), ("DeepNorm", "LLaMA-250M"), ("Mix-LN", "LLaMA-130M"), ("Mix-LN", "LLaMA-250M"),
            ("Post-LN", "LLaMA-130M"), ("Pre-LN", "LLaMA-250M")]
    assert all(mix.cell(*rc).paper == lns.cell(*rc).paper for rc in same)
    assert (mix.cell("Pre-LN", "LLaMA-130M").paper, lns.cell("Pre-LN", "LLaMA-130M").paper) == (26.78, 26.73)
    assert (mix.cell("Post-LN", "LLaMA-250M").paper, lns.cell("Post-LN", "LLaMA-250M").paper) == (1409.09, 1409.79)


@pytest.mark.parametrize("name", SCALES)
@pytest.mark.parametrize("tid", LM_IDS)
def test_every_cell_resolves_at_every_scale_or_says_why(tid, name):
    t, sc = table(tid), scale(name)
    for cell in t.cells:
        r = resolve(t, cell, sc)
        if cell.run is None:
            assert r.config is None and r.why.startswith("paper only: ") and len(r.why) > 20
        elif name == "paper":  # no --data-root: every cell says which prepared folder it needs, and how to make it
            assert r.config is None and r.why.startswith("not available at paper scale: needs DATA_ROOT/c4-t5 ")
            assert "T5's tokenizer (spiece.model of google-t5/t5-base" in r.why
            assert r.why.endswith(" --tokenizer sentencepiece:t5-base/spiece.model --out DATA_ROOT/c4-t5")
        else:
            assert r.task == "lm" and r.setting.metric == "bits per byte"
            assert r.config.corpus == ("c4-en" if name == "smoke" else "pydocs") and r.config.tokenizer == "bytes"
            m = model_config(r.config.model)
            assert (m.mlp, m.positions, m.bias, m.tie) == ("swiglu", "rope", False, False)
            layers = LM_PAPER[cell.run.setting][3]
            assert m.layers == (layers if name == "cpu" else layers // 6)


def test_rows_run_the_papers_designs_and_share_runs():
    cpu = scale("cpu")
    t1, t4, mix = table("lns-table1"), table("lns-table4"), table("mixln-table1")
    model = lambda t, row, col: model_config(resolve(t, t.cell(row, col), cpu).config.model)  # noqa: E731
    assert [model(mix, row, "LLaMA-71M").connection for row in mix.rows] == [
        "1xSkip+RMS", "DeepNorm+RMS", "PreRMS", "MixLN+RMS"]
    assert model(t1, "Pre-LN + LayerNorm Scaling", "LLaMA-1B").connection == "PreRMS(scale=depth)"
    assert model(t4, "+ LayerScale", "LLaMA-250M").connection == "LayerScale+RMS"
    scaled = model(t4, "+ LayerNorm Scaling + Scaled Initialization", "LLaMA-130M")
    assert (scaled.connection, scaled.init) == ("PreRMS(scale=depth)", "gpt2")
    assert model(t4, "+ LayerNorm Scaling", "LLaMA-130M").init == "default"
    key = lambda t, row, col: runs_mod.key(resolve(t, t.cell(row, col), cpu).config)  # noqa: E731
    # the 12-layer sizes share one miniature, the 24-layer ones another; the tables share their runs
    assert key(mix, "Pre-LN", "LLaMA-71M") == key(mix, "Pre-LN", "LLaMA-130M") == key(t4, "Pre-LN", "LLaMA-130M")
    assert key(mix, "Pre-LN", "LLaMA-250M") == key(t1, "Pre-LN", "LLaMA-1B") != key(mix, "Pre-LN", "LLaMA-71M")
    cfg = resolve(mix, mix.cell("Mix-LN", "LLaMA-1B"), cpu).config
    assert (cfg.max_steps, cfg.warmup, cfg.lr, cfg.min_lr, cfg.weight_decay, cfg.clip_norm) == (600, 60, 1e-3, 1e-4, 0, 0)
    assert cfg.batch_size * model_config(cfg.model).context == 4096


def _count(vocab: int, d: int, ffn: int, layers: int) -> int:
    """Parameters of the LLaMA shape: untied embedding and output layer, per layer 4d² (attention) + 3d·ffn
    (SwiGLU) + 2d (two RMSNorm gains), a final RMSNorm; no biases."""
    return 2 * vocab * d + layers * (4 * d * d + 3 * d * ffn + 2 * d) + d


def test_the_papers_llama_shapes_have_their_parameter_counts():
    """The presets the paper-scale settings name: the authors' configs' shapes, with the sizes the papers name
    them by (a small model of the same family checks the count by building it)."""
    shapes = {"llama-71m": (512, 1368, 8, 12, 70_578_688), "llama-130m": (768, 2048, 12, 12, 134_105_856),
              "llama-250m": (768, 2560, 16, 24, 247_370_496), "llama-350m": (1024, 2736, 16, 24, 367_969_280),
              "llama-1b": (2048, 5461, 32, 24, 1_339_082_752)}
    assert [p for p, *_ in LM_PAPER.values()] == list(shapes)
    for name, (d, ffn, heads, layers, count) in shapes.items():
        m = model_config(name)
        assert (m.vocab_size, m.d_model, m.ffn_dim, m.heads, m.layers, m.context) == (32000, d, ffn, heads, layers, 256)
        assert (m.mlp, m.positions, m.bias, m.tie, m.connection) == ("swiglu", "rope", False, False, "PreRMS")
        assert _count(32000, d, ffn, layers) == count, name
    small = build_model(model_config("llama-250m(d_model=32,heads=2,ffn_dim=40,layers=3)", vocab_size=100))
    assert sum(p.numel() for p in small.parameters()) == _count(100, 32, 40, 3)


# ---- the hyper-connections tables ----------------------------------------------------------------------------
@pytest.mark.parametrize("tid", HC_PUBLISHED)
def test_hc_tables_transcribed_and_each_row_runs_its_design_at_olmo_shape(tid):
    t, published = table(tid), HC_PUBLISHED[tid]
    assert (t.columns, t.rows) == (["V2 eval loss", "V3 eval loss"], list(published))
    assert all([t.cell(row, col).paper for col in t.columns] == published[row] for row in t.rows)
    assert (t.metric, t.higher_is_better, t.baseline) == ("loss", False, "OLMo-1B") and "2409.19606" in t.source
    for name in SCALES:
        sc = scale(name)
        for cell in t.cells:
            r = resolve(t, cell, sc)
            if name == "paper":
                assert r.config is None and "needs DATA_ROOT/dolma-olmo " in r.why and "OLMo's tokenizer" in r.why
                assert "V2 and V3" in r.why
                continue
            m = model_config(r.config.model)
            assert (m.mlp, m.positions, m.bias, m.tie, m.layers) == ("swiglu", "rope", False, True,
                                                                       16 if name == "cpu" else 2)
            spec = parse_spec(m.connection)
            n = int(re.search(r"×(\d)", cell.row).group(1)) if "×" in cell.row else None
            if n is None:
                assert m.connection == "PreLN"
            else:
                assert (spec.name, spec.options["n"]) == ("HC", n)
                assert spec.options["kind"] == ("static" if cell.row.startswith("SHC") else "dynamic")
                assert spec.options["tanh"] == ("no" if "W/O tanh" in cell.row else "yes")
    cpu = scale("cpu")
    cfg = resolve(t, t.cell("OLMo-1B", "V2 eval loss"), cpu).config
    assert (cfg.adam_betas, cfg.weight_decay, cfg.clip_norm, cfg.max_steps, cfg.lr) == ((0.9, 0.95), 0.1, 1.0, 600, 1e-3)
    # both columns are one run per seed, and the two tables share the rows they both have
    key = lambda t, row, col: runs_mod.key(resolve(t, t.cell(row, col), cpu).config)  # noqa: E731
    assert key(t, "DHC×2", "V2 eval loss") == key(t, "DHC×2", "V3 eval loss") == key(table("hc-table1"), "DHC×2",
                                                                                     "V3 eval loss")


def test_hc_tables_print_their_v3_differences_as_the_paper_does():
    t1, t2 = table("hc-table1"), table("hc-table2")
    shared = [(r, c) for r in t2.rows if r in t1.rows for c in t2.columns]
    differ = [(r, c) for r, c in shared if t1.cell(r, c).paper != t2.cell(r, c).paper]
    assert differ == [("DHC×2 W/O tanh", "V3 eval loss"), ("DHC×4", "V3 eval loss")]
    assert any("2.529" in n and "2.537" in n for n in t2.notes)


def test_olmo_1b_preset_has_the_hyper_connections_papers_parameter_count():
    """Tied embedding V·d, per layer 4d² (attention) + 3d·ffn (SwiGLU); OLMo's LayerNorm has no parameters, skiplab's
    2d per norm (two per layer and the final one). The paper's Table 7: OLMo-1B 1.17676442B."""
    (preset, layers), = OLMO_PAPER.values()
    m = model_config(preset)
    v, d, ffn = m.vocab_size, m.d_model, m.ffn_dim
    assert (v, d, ffn, m.heads, m.layers, m.context, m.tie, m.bias) == (50304, 2048, 8192, 16, layers, 2048, True, False)
    olmo = v * d + layers * (4 * d * d + 3 * d * ffn)
    assert round(olmo / 1e9, 8) == 1.17676442
    small = build_model(model_config("olmo-1b(d_model=32,heads=2,ffn_dim=40,layers=3)", vocab_size=100))
    assert sum(p.numel() for p in small.parameters()) == 100 * 32 + 3 * (4 * 32 * 32 + 3 * 32 * 40) + (2 * 3 + 1) * 2 * 32


# ---- C4 -----------------------------------------------------------------------------------------------------
def test_c4_reads_the_shards_present_in_order_and_validation_is_test(tmp_path):
    folder = tmp_path / "c4"
    b = write_shard(folder / "c4-train.00007-of-01024.json.gz", 3, 7)
    a = write_shard(folder / "c4-train.00002-of-01024.json.gz", 2, 2)
    valid = write_shard(folder / "c4-validation.00005-of-00008.json.gz", 2, 5)
    (folder / "c4-train.00009-of-01024.json").write_text('{"text": "not a shard name"}\n')  # not gzipped: no shard
    train = load_documents("c4-en", folder, "train")
    assert train.texts == a + b and train.name == "c4-en/train (2 of 1024 shards)"
    assert load_documents("c4-en", folder, "valid").texts == load_documents("c4-en", folder, "test").texts == valid
    nested = tmp_path / "hub"  # the allenai/c4 repository's layout: the shards in en/
    write_shard(nested / "en" / "c4-validation.00000-of-00008.json.gz", 2, 0)
    assert len(load_documents("c4_en", nested, "test")) == 2


def test_a_folder_without_c4_shards_is_a_one_line_error(tmp_path):
    write_shard(tmp_path / "c4-validation.00000-of-00008.json.gz", 2, 0)
    with pytest.raises(FileNotFoundError) as err:
        load_documents("c4-en", tmp_path, "train")
    message = str(err.value)
    assert len(message.splitlines()) == 1
    assert f"{tmp_path}: no c4-en shards for the train split (c4-train.?????-of-01024.json.gz)" in message
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "c4-validation.00001-of-00008.json.gz").write_bytes(gzip.compress(b'{"url": "x"}\n'))
    with pytest.raises(ValueError, match=r"c4-validation.00001-of-00008.json.gz, line 1: not a JSON object with"):
        load_documents("c4-en", bad, "valid")


# ---- a table end to end -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    write_c4(root)
    out = tmp_path_factory.mktemp("repro")
    (result,) = reproduce(["mixln-table1"], "smoke", str(out), seeds=2, data_root=str(root), progress=False)
    return {"root": root, "out": out, "result": result}


def test_smoke_table_end_to_end_with_the_paper_beside_ours_in_its_own_unit(smoke):
    result, folder = smoke["result"], smoke["out"] / "smoke" / "mixln-table1"
    assert (result["metric"], result["ours_metric"]) == ("perplexity", "bits per byte")
    cells = {(c["row"], c["column"]): c for c in result["cells"]}
    for (row, col), c in cells.items():
        assert c["available"] and c["n"] == 2 and c["paper"] == PUBLISHED["mixln-table1"][row][
            PUBLISHED["mixln-table1"]["columns"].index(col)]
        for run, value in zip(c["runs"], c["values"]):  # ours: the final model's test bits per byte, in its summary
            summary = json.loads((Path(run) / "summary.json").read_text())
            assert value == summary["test_bpb"] and 0 < value < 20
            assert json.loads((Path(run) / "config.json").read_text())["data"]["train"] == (
                "c4-en/train (2 of 1024 shards)")
    # sizes of one depth share their runs; the baseline's differences and Welch's test
    assert cells[("Pre-LN", "LLaMA-71M")]["runs"] == cells[("Pre-LN", "LLaMA-130M")]["runs"]
    assert cells[("Pre-LN", "LLaMA-71M")]["runs"] != cells[("Pre-LN", "LLaMA-1B")]["runs"]
    mix = cells[("Mix-LN", "LLaMA-1B")]
    assert mix["delta"] == pytest.approx(mix["mean"] - cells[("Pre-LN", "LLaMA-1B")]["mean"])
    assert mix["paper_delta"] == pytest.approx(18.18 - 18.65) and mix["test"].startswith("Welch")
    md = (folder / "table.md").read_text()
    assert "Source: arXiv:2412.13795v1 (Li, Yin, Liu, ICLR 2025), Table 1." in md
    assert "Metric: the paper's perplexity; ours at this scale bits per byte (lower is better for both)" in md
    assert re.search(r"\| paper: perplexity\s+\|", md)
    assert re.search(r"\| ours: bits per byte, mean ± std \(seeds\)\s*\|", md)
    line = next(ln for ln in md.splitlines() if ln.startswith("| Post-LN") and "LLaMA-250M" in ln)
    assert "1409.09" in line and re.search(r"\d\.\d{3} ± \d\.\d{3} \(2\)", line)
    assert "skiplab train lm" in md and "--corpus c4-en" in md
    rows = list(csv.DictReader(io.StringIO((folder / "table.csv").read_text())))
    assert {(r["paper_metric"], r["ours_metric"]) for r in rows} == {("perplexity", "bits per byte")}
    assert (folder / "deltas.png").stat().st_size > 0 and (folder / "curves.png").stat().st_size > 0


def test_a_second_reproduce_trains_and_scores_nothing(smoke, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("trained or scored again")

    monkeypatch.setattr(tasks.TASKS["lm"], "train", refuse)
    monkeypatch.setattr(tasks.TASKS["lm"], "score", refuse)
    (again,) = reproduce(["mixln-table1"], "smoke", str(smoke["out"]), seeds=2, data_root=str(smoke["root"]),
                         progress=False)
    assert [c["values"] for c in again["cells"]] == [c["values"] for c in smoke["result"]["cells"]]


def test_paper_only_and_diverged_cells_say_so(smoke):
    """lns-table4's rows skiplab cannot build carry the paper's number and the reason; a cell whose every seed
    diverged says that, not "not run yet"."""
    (t4,) = reproduce(["lns-table4"], "smoke", str(smoke["out"]), seeds=1, data_root=str(smoke["root"]),
                      progress=False)
    skip = {c["column"]: c for c in t4["cells"] if c["row"] == "+ SkipInit"}
    assert skip["LLaMA-130M"]["paper"] == 27.41 and skip["LLaMA-130M"]["why"].startswith("paper only: skiplab's SkipInit")
    md = (smoke["out"] / "smoke" / "lns-table4" / "table.md").read_text()
    assert "no depth-scaled initialisation" in md and "Scaled Initialization is read as" in md
    cell = {"available": True, "mean": None, "values": [None, None], "diverged": 2}
    assert report.ours(cell) == "diverged (2 of 2 seeds)"
    assert report.ours({**cell, "diverged": 1}) == "not run yet (1 diverged)"


def test_hc_table_smoke_runs_static_dynamic_and_tanh_free_rows(smoke):
    (t2,) = reproduce(["hc-table2"], "smoke", str(smoke["out"]), seeds=1, data_root=str(smoke["root"]),
                      progress=False)
    assert (t2["metric"], t2["ours_metric"]) == ("loss", "bits per byte")
    cells = {(c["row"], c["column"]): c for c in t2["cells"]}
    assert all(c["n"] == 1 and 0 < c["mean"] < 20 for c in cells.values())
    assert cells[("SHC×4", "V2 eval loss")]["values"] == cells[("SHC×4", "V3 eval loss")]["values"]
    specs = {json.loads((Path(c["runs"][0]) / "config.json").read_text())["model"]["connection"]
             for c in cells.values()}
    assert specs == {"PreLN", "HC(n=2,kind=static)", "HC(n=2)", "HC(n=2,tanh=no)", "HC(kind=static)", "HC",
                     "HC(tanh=no)"}
    md = (smoke["out"] / "smoke" / "hc-table2" / "table.md").read_text()
    assert "Metric: the paper's loss; ours at this scale bits per byte" in md and "2.529" in md


def test_list_names_the_lm_tables_their_unit_and_time_per_scale(capsys):
    assert cli.main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    for tid in LM_IDS:
        assert tid in out and tid in TABLES
    block = out[out.index("mixln-table1"):out.index("lns-table1")]
    assert re.search(r"cpu\s*: 16/16 cells, 16 runs \(2 seeds\), ~2 h 36 min \(estimate for 2 CPU cores\); ours in bits per byte, not the "
                     r"paper's perplexity", block)  # 8 runs of 12 and 8 of 24 layers, two at a time
    assert re.search(r"paper: 0/16 cells, 0 runs \(5 seeds\), -\n", block)
    # what the paper scale runs given its prepared folder, and the command that makes the folder
    given = re.search(r"\n\s+with --data-root DATA_ROOT holding c4-t5/: 16/16 cells, 80 runs \(5 seeds\), "
                      r"~[\d,]+ GPU-hours \(estimate\); c4-t5/ is C4 en .*\n", block)
    assert given and "spiece.model of google-t5/t5-base" in given.group(0)
    assert given.group(0).rstrip().endswith("made once with: skiplab prepare lm --corpus c4-en --data-dir "
                                            "DATA_ROOT/c4-en --tokenizer sentencepiece:t5-base/spiece.model "
                                            "--out DATA_ROOT/c4-t5")
    hc = out[out.index("hc-table1"):out.index("hc-table2")]
    assert re.search(r"with --data-root DATA_ROOT holding dolma-olmo/: 18/18 cells, 45 runs \(5 seeds\), ~[\d,]+ "
                     r"GPU-hours \(estimate\); ours in perplexity, not the paper's loss; dolma-olmo/ is ", hc)
    assert "--tokenizer hf:olmo/tokenizer.json --out DATA_ROOT/dolma-olmo; skiplab has no loader for OLMo's V2" in hc


# ---- paper scale: the runs read a prepared folder under --data-root ------------------------------------------
def _tiny_sentencepiece(path: Path) -> Path:
    """A tiny sentencepiece model with T5's special ids (pad 0, eos 1, unk 2, no bos)."""
    spm = pytest.importorskip("sentencepiece")
    rng = random.Random(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([_doc(rng) for _ in range(200)]), model_prefix=str(path.with_suffix("")),
        vocab_size=320, model_type="bpe", byte_fallback=True, hard_vocab_limit=False, minloglevel=2, num_threads=1,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    return path


def _tiny_tokenizer_json(path: Path) -> Path:
    """A tiny byte-level BPE tokenizer.json with <|endoftext|> as its one end-of-text token (OLMo's design)."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(1)
    tok.train_from_iterator([_doc(rng) for _ in range(200)], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|padding|>", "<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def _as_needed(monkeypatch, key: str, prepared_dir: Path) -> None:
    """The paper setting ``key`` needing the tokenizer the tiny folder was prepared with (its ids and end of text),
    not the real 32,000 / 50,280: everything else about it as it is."""
    meta = json.loads((prepared_dir / SIDECAR).read_text())
    settings = scale("paper").settings
    s = settings[key]
    monkeypatch.setitem(settings, key, dataclasses.replace(s, prepared=dataclasses.replace(
        s.prepared, vocab_size=meta["vocab_size"], eot=meta["eot"])))


@pytest.fixture(scope="module")
def c4_t5(tmp_path_factory):
    """DATA_ROOT holding a tiny C4 en (c4-en/) and, made from it with a tiny T5-style sentencepiece model by
    skiplab prepare lm, c4-t5/ (the file prepared from lies elsewhere, under another name)."""
    root = tmp_path_factory.mktemp("paper-data")
    write_c4(root)
    model = _tiny_sentencepiece(tmp_path_factory.mktemp("t5-base") / "t5-tiny.model")
    prepare(PrepareConfig(corpus="c4-en", data_dir=str(root / "c4-en"), tokenizer=f"sentencepiece:{model}",
                          out=str(root / "c4-t5")), progress=False)
    return root


def test_paper_scale_c4_cells_train_from_the_prepared_folder_with_the_papers_recipe(c4_t5, monkeypatch):
    _as_needed(monkeypatch, "c4-llama130m", c4_t5 / "c4-t5")
    _as_needed(monkeypatch, "c4-llama1b", c4_t5 / "c4-t5")
    paper, mix = scale("paper"), table("mixln-table1")
    r = resolve(mix, mix.cell("Mix-LN", "LLaMA-130M"), paper, data_root=str(c4_t5))
    cfg = r.config
    assert r.task == "lm" and r.setting.prepared.folder == C4_T5.folder == "c4-t5"
    assert (cfg.data_dir, cfg.corpus, cfg.tokenizer) == (str(c4_t5 / "c4-t5"), "c4-en", "sentencepiece:spiece.model")
    assert (cfg.train_file, cfg.valid_file, cfg.test_file) == ("", "", "")
    m = model_config(cfg.model)
    assert (m.d_model, m.layers, m.ffn_dim, m.context, m.connection) == (768, 12, 2048, 256, "MixLN+RMS")
    assert cfg.batch_size * cfg.grad_accum == 512 and (cfg.batch_size, cfg.grad_accum) == (64, 8)
    assert (cfg.max_steps, cfg.warmup, cfg.lr, cfg.min_lr, cfg.schedule) == (20_000, 2_000, 1e-3, 1e-4, "cosine")
    assert (cfg.adam_betas, cfg.weight_decay, cfg.clip_norm) == ((0.9, 0.999), 0.0, 0.0)
    assert (cfg.eval_every, cfg.valid_tokens) == (1000, 10_000_000)
    assert r.setting.metric == "" and mix.metric == "perplexity"  # ours in the paper's unit: per T5 token
    big = resolve(mix, mix.cell("Pre-LN", "LLaMA-1B"), paper, data_root=str(c4_t5)).config
    assert (big.model, big.batch_size * big.grad_accum, big.max_steps, big.warmup, big.lr, big.min_lr) == (
        "llama-1b(connection=PreRMS)", 512, 100_000, 10_000, 5e-4, 5e-5)
    # the run reads the folder as it is: its check passes, the tokenizer is the folder's (no file read)
    prep = lm_data.prepared(cfg)
    assert prep is not None and prep.root == c4_t5 / "c4-t5"
    assert len(lm_data.prepared_stream(prep, "test", None)) == prep.split("test")["tokens"]
    # where the folder lives is not part of what the run is: the same key with any --data-root
    moved = dataclasses.replace(cfg, data_dir="/elsewhere/c4-t5")
    assert runs_mod.key(moved) == runs_mod.key(cfg)
    assert "--data-dir " + str(c4_t5 / "c4-t5") in report.train_command("lm", cfg)


def test_a_paper_scale_run_trains_one_update_from_the_folder(c4_t5, monkeypatch, tmp_path):
    """The resolved config, its model and budget made tiny (nothing else changed), trains from the prepared folder
    with no tokenizer file anywhere (``sentencepiece:spiece.model`` names none that exists)."""
    _as_needed(monkeypatch, "c4-llama71m", c4_t5 / "c4-t5")
    mix = table("mixln-table1")
    cfg = resolve(mix, mix.cell("Pre-LN", "LLaMA-71M"), scale("paper"), data_root=str(c4_t5), device="cpu").config
    tiny = dataclasses.replace(cfg, model="llama-71m(d_model=32,heads=2,ffn_dim=64,layers=1,context=32)",
                               batch_size=2, grad_accum=2, max_steps=1, warmup=1, eval_every=1, valid_tokens=200,
                               out=str(tmp_path / "run"))
    summary = lm.train(tiny, progress=False)
    assert summary["status"] == "finished" and summary["steps"] == 1
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["data"]["tokenizer"] == "sentencepiece:spiece.model" and config["data"]["eot"] == 1
    assert config["data"]["vocab_size"] == json.loads((c4_t5 / "c4-t5" / SIDECAR).read_text())["vocab_size"]
    assert (tmp_path / "run" / "tokenizer.model").is_file()  # the folder's copy of the model, as a text run keeps


def test_paper_scale_c4_cells_without_the_folder_say_what_it_holds_and_the_command(c4_t5, tmp_path):
    mix, paper = table("mixln-table1"), scale("paper")
    cell = mix.cell("Pre-LN", "LLaMA-71M")
    command = ("skiplab prepare lm --corpus c4-en --data-dir DATA_ROOT/c4-en --tokenizer "
               "sentencepiece:t5-base/spiece.model --out DATA_ROOT/c4-t5")
    why = resolve(mix, cell, paper).why  # no --data-root
    assert why == (f"not available at paper scale: needs DATA_ROOT/c4-t5 (--data-root DATA_ROOT): {C4_T5.needs()}")
    assert why.endswith(f"made once with: {command}") and "google-t5/t5-base" in why and "32,000 ids" in why
    root = tmp_path / "my data"  # absent: the command names this root, quoted as a shell needs it
    why = resolve(mix, cell, paper, data_root=str(root)).why
    assert why.startswith(f"not available at paper scale: needs {root}/c4-t5, which is absent: C4 en (")
    assert f"in {root}/c4-en)" in why
    made = why.split("made once with: ")[1]
    assert shlex.split(made) == ["skiplab", "prepare", "lm", "--corpus", "c4-en", "--data-dir", f"{root}/c4-en",
                                 "--tokenizer", "sentencepiece:t5-base/spiece.model", "--out", f"{root}/c4-t5"]
    # the tiny folder is not T5's tokenizer: 32,000 ids and end of text 1 are what the papers used
    why = resolve(mix, cell, paper, data_root=str(c4_t5)).why
    meta = json.loads((c4_t5 / "c4-t5" / SIDECAR).read_text())
    assert why.startswith(f"not available at paper scale: needs {c4_t5}/c4-t5 made anew (it was prepared with "
                          f"--tokenizer {meta['tokenizer']} ({meta['vocab_size']} ids, end of text 1), not a "
                          "sentencepiece tokenizer of 32,000 ids (end of text 1); move it aside first")
    assert why.endswith(f"--out {c4_t5}/c4-t5")


def test_a_folder_prepared_otherwise_says_so_and_what_is_needed(c4_t5, tmp_path, monkeypatch):
    mix, paper = table("mixln-table1"), scale("paper")
    cell = mix.cell("Mix-LN", "LLaMA-130M")
    other = tmp_path / "other"
    prepare(PrepareConfig(corpus="c4-en", data_dir=str(c4_t5 / "c4-en"), out=str(other / "c4-t5")),
            progress=False)  # bytes
    why = resolve(mix, cell, paper, data_root=str(other)).why
    assert "made anew (it was prepared with --tokenizer bytes (257 ids, end of text 256), not a sentencepiece" in why
    assert "T5's tokenizer (spiece.model of google-t5/t5-base" in why and why.endswith(f"--out {other}/c4-t5")
    (tmp_path / "empty" / "c4-t5").mkdir(parents=True)
    assert f"needs {tmp_path}/empty/c4-t5, which holds no prepared.json: " in resolve(
        mix, cell, paper, data_root=str(tmp_path / "empty")).why
    broken = tmp_path / "broken" / "c4-t5"
    broken.mkdir(parents=True)
    (broken / SIDECAR).write_text("{")
    assert f"made anew ({broken}/prepared.json: not JSON" in resolve(mix, cell, paper, data_root=str(broken.parent)).why
    # another corpus, with the right tokenizer: said too
    _as_needed(monkeypatch, "c4-llama130m", c4_t5 / "c4-t5")
    files = tmp_path / "files"
    for split in ("train", "valid", "test"):
        write_shard(files / f"{split}.jsonl.gz", 5, 3)
    spec = json.loads((c4_t5 / "c4-t5" / SIDECAR).read_text())["tokenizer"]  # the tiny T5-style model's
    prepare(PrepareConfig(corpus="", train_file=str(files / "train.jsonl.gz"), valid_file=str(files / "valid.jsonl.gz"),
                          test_file=str(files / "test.jsonl.gz"), tokenizer=spec,
                          out=str(tmp_path / "files-root" / "c4-t5")), progress=False)
    why = resolve(mix, cell, paper, data_root=str(tmp_path / "files-root")).why
    assert "made anew (it holds files, not c4-en;" in why


def test_paper_scale_olmo_cells_train_from_the_prepared_dolma_folder_and_say_what_stays_unlike(tmp_path, monkeypatch):
    root = tmp_path / "data"
    rng = random.Random(5)
    for split, n in (("train", 40), ("valid", 5), ("test", 5)):  # Dolma's documents: JSON lines with "text"
        folder = root / "dolma" / split
        folder.mkdir(parents=True)
        with gzip.open(folder / "part-0000.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(json.dumps({"id": str(i), "text": _doc(rng), "source": "c4"}) + "\n" for i in range(n))
    tok = _tiny_tokenizer_json(tmp_path / "olmo" / "tokenizer.json")
    t, paper = table("hc-table1"), scale("paper")
    cell = t.cell("DHC×4", "V2 eval loss")
    why = resolve(t, cell, paper, data_root=str(root)).why  # absent
    command = (f"skiplab prepare lm --corpus '' --train-file {root}/dolma/train --valid-file {root}/dolma/valid "
               f"--test-file {root}/dolma/test --tokenizer hf:olmo/tokenizer.json --out {root}/dolma-olmo")
    assert why.startswith(f"not available at paper scale: needs {root}/dolma-olmo, which is absent: the dolma v1.5 ")
    assert f"made once with: {command}; once it is there, skiplab has no loader for OLMo's V2 and V3" in why
    assert "tokenizers/allenai_eleuther-ai-gpt-neox-20b-pii-special.json" in why and "50,280 ids" in why
    # the command, with the tokenizer file where it lies here, makes the folder the cells train from
    args = shlex.split(command)[3:]
    args[args.index("--tokenizer") + 1] = f"hf:{tok}"
    assert cli.main(["prepare", "lm", *args]) == 0
    assert "made anew (it was prepared with --tokenizer hf:" in resolve(t, cell, paper, data_root=str(root)).why
    _as_needed(monkeypatch, "dolma-olmo1b", root / "dolma-olmo")
    r = resolve(t, cell, paper, data_root=str(root))
    cfg = r.config
    assert (cfg.data_dir, cfg.corpus, cfg.tokenizer) == (str(root / "dolma-olmo"), "", "hf:tokenizer.json")
    m = model_config(cfg.model)
    assert (m.d_model, m.layers, m.ffn_dim, m.context, m.tie) == (2048, 16, 8192, 2048, True)
    assert parse_spec(m.connection).options["n"] == 4
    assert cfg.batch_size * cfg.grad_accum * m.context == 2048 * 2048 and cfg.max_steps == OLMO_STEPS == 119_209
    assert abs(OLMO_STEPS * 2048 * 2048 - 500e9) < 2048 * 2048
    assert (cfg.lr, cfg.min_lr, cfg.warmup, cfg.adam_betas, cfg.weight_decay, cfg.clip_norm) == (
        4e-4, 4e-5, 2000, (0.9, 0.95), 0.1, 1.0)
    assert r.setting.metric == "perplexity" and "V2 and V3 validation sets" in r.setting.about
    prep = lm_data.prepared(cfg)  # the run's own check of the folder passes (the file's path is not the runs')
    assert prep is not None and prep.meta["tokenizer"] == f"hf:{tok}" and DOLMA_OLMO.tokenizer == "hf:tokenizer.json"
    assert resolve(t, t.cell("DHC×4", "V3 eval loss"), paper, data_root=str(root)).config == cfg
