"""``reproduce``'s DeepNet and Peri-LN tables: the transcribed numbers, what each cell runs at each scale, shared runs."""

from __future__ import annotations

import pytest

from skiplab import cli
from skiplab.connections import parse_spec
from skiplab.models import model_config
from skiplab.reproduce import TABLES, resolve, scale

# DeepNet (arXiv 2203.00555v1), Table 1, copied again by hand: None where the paper prints "diverged"
DEEPNET = {
    "Vanilla Post-LN": [28.1, None, None, None], "DS-Init": [27.9, None, None, None],
    "Admin": [27.9, 28.8, None, None], "ReZero": [26.9, None, None, None], "R-Fixup": [27.5, 28.4, 27.7, None],
    "T-Fixup": [27.5, 28.4, 27.9, None], "Vanilla Pre-LN": [27.0, 28.1, 28.0, 27.4],
    "DLCL": [27.4, 28.2, None, 27.5], "NormFormer": [27.0, 28.3, 27.8, None], "DeepNet": [27.8, 28.8, 29.0, 28.9]}


def test_deepnet_table_transcribed_with_its_diverged_cells():
    t = TABLES["deepnet-table1"]
    assert t.columns == ["6L-6L", "18L-18L", "50L-50L", "100L-100L"] and t.rows == list(DEEPNET)
    for row, values in DEEPNET.items():
        cells = [t.cell(row, c) for c in t.columns]
        assert [c.paper for c in cells] == values
        for c in cells:
            if c.paper is None:
                assert "diverged in the paper" in c.why
    assert all(c.run is None and "skiplab has no" in c.why
               for c in t.cells if c.row in ("DS-Init", "R-Fixup", "T-Fixup", "DLCL", "NormFormer"))


@pytest.mark.parametrize("name", ["smoke", "cpu", "paper"])
def test_deepnet_rows_run_their_designs_at_the_scales_depth(name):
    t, sc = TABLES["deepnet-table1"], scale(name)
    depths = {"smoke": (1, 2, 3, 4), "cpu": (1, 3, 8, 16), "paper": (6, 18, 50, 100)}[name]
    for row, design in (("Vanilla Post-LN", "PostLN"), ("Admin", "Admin"), ("ReZero", "ReZero"),
                        ("Vanilla Pre-LN", "PreLN"), ("DeepNet", "DeepNorm")):
        for column, layers in zip(t.columns, depths):
            r = resolve(t, t.cell(row, column), sc)
            m = model_config(r.config.model, vocab_size=100)
            assert (m.encoder_layers, m.decoder_layers) == (layers, layers)
            assert parse_spec(m.connection).name == parse_spec(design).name and m.dropout == 0.4
    if name == "paper":
        cfg = resolve(t, t.cell("DeepNet", "6L-6L"), sc).config
        assert (cfg.lr, cfg.warmup, cfg.max_steps, cfg.max_tokens * cfg.update_freq) == (1.5e-3, 4000, 100_000,
                                                                                         128 * 4096)
        assert (cfg.adam_eps, cfg.weight_decay, cfg.clip_norm, cfg.corpus) == (1e-8, 1e-4, 0.0, "wmt14-en-de")


def test_peri_ln_cells_share_the_llama_miniatures_runs_at_cpu_scale():
    """Post-LN and Pre-LN at the 400M column are the runs of mixln-table1's 71M cells (the same 12-layer miniature);
    Peri-LN is PeriLN+RMS; the paper's numbers are not entered and the paper scale says why."""
    peri, mix, cpu = TABLES["peri-table1"], TABLES["mixln-table1"], scale("cpu")
    assert all(c.paper is None and "could not be read" in c.why for c in peri.cells)
    assert resolve(peri, peri.cell("Pre-LN", "400M"), cpu).config == resolve(mix, mix.cell("Pre-LN", "LLaMA-71M"),
                                                                             cpu).config
    assert resolve(peri, peri.cell("Post-LN", "1.5B"), cpu).config == resolve(mix, mix.cell("Post-LN", "LLaMA-1B"),
                                                                              cpu).config
    m = model_config(resolve(peri, peri.cell("Peri-LN", "400M"), cpu).config.model, vocab_size=257)
    assert parse_spec(m.connection).name == "PeriLN" and m.norm == "RMS" and m.layers == 12
    assert resolve(peri, peri.cell("Peri-LN", "3.2B"), cpu).config is None
    assert "not read here" in resolve(peri, peri.cell("Pre-LN", "400M"), scale("paper")).why


def test_list_shows_the_peri_ln_and_deepnet_tables(capsys):
    assert cli.main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    assert "peri-table1" in out and "deepnet-table1" in out
    assert "Vanilla Post-LN, DS-Init, Admin, ReZero" in out
