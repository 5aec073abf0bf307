"""Depth mixing in ``analyze gates`` (skiplab.analysis.mixing): the "i reads j" matrices of the designs that mix
earlier outputs, from a trained run, against each design's own account of the same batch."""

import json

import pytest
import torch

from skiplab.analysis import mixing
from skiplab.tasks import load_trained
from tests.train.test_lm import args, one_thread, run, text  # noqa: F401  (the fixture)


@pytest.fixture(scope="module")
def trained(text, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("mixing")
    runs = {}
    for name, spec in (("attnres", "PreLN+AttnRes(block=2)"), ("dense", "PreLN+DenseFormer"), ("mudd", "PreLN+MUDD")):
        with one_thread():
            assert run(args(text, root / name, "--connection", spec)) == 0
            assert run(["analyze", "gates", root / name, "--examples", "4", "--split", "valid"]) == 0
        runs[name] = root / name
    return runs


def _gates(out):
    return json.loads((out / "analysis" / "gates.json").read_text())


def test_attention_residuals_rows_are_its_softmax_over_the_batch(trained):
    (entry,) = _gates(trained["attnres"])["mixing"]
    tr = load_trained(trained["attnres"])
    design = tr.model.across.designs[0]
    (ex,) = list(tr.examples("valid", 4))
    mean, std = design.depth_weights(lambda: tr.forward(ex))
    got = torch.tensor(entry["mean"])
    assert got.shape == mean.shape == (2 * 2 + 1, 3)  # 4 sub-layers and the output; b_0 and two blocks of S = 2
    torch.testing.assert_close(got, mean.to(got.dtype), equal_nan=True)
    torch.testing.assert_close(torch.tensor(entry["std"]), std.to(got.dtype), equal_nan=True, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(got.nan_to_num(0).sum(1), torch.ones(5, dtype=got.dtype))  # each row a softmax
    assert entry["targets"] == [0, 1, 2, 3, 4] and entry["stack"] == "layer"
    assert entry["examples"] == _gates(trained["attnres"])["examples"] == 4  # what the title and table count


def test_denseformer_rows_are_its_learned_weights_with_no_spread(trained):
    (entry,) = _gates(trained["dense"])["mixing"]
    design = load_trained(trained["dense"]).model.across.designs[0]
    m = design.reads().double()
    for i, row in zip(entry["targets"], entry["mean"]):
        torch.testing.assert_close(torch.tensor(row[: i + 1], dtype=m.dtype), m[i, : i + 1])
    assert max(max(r[: i + 1]) for i, r in zip(entry["targets"], entry["std"])) == 0.0  # static weights


def test_mudd_gives_a_matrix_per_stream_against_its_own_reads(trained):
    entries = {e["stream"]: e for e in _gates(trained["mudd"])["mixing"]}
    assert set(entries) == {"Q", "K", "V", "R"}
    tr = load_trained(trained["mudd"])
    design = tr.model.across.designs[0]
    (ex,) = list(tr.examples("valid", 4))
    with torch.no_grad(), design.keeping() as kept:
        tr.model.eval()
        tr.forward(ex)
    mean, _ = design.reads(kept)
    r = entries["R"]
    for i, row in zip(r["targets"], r["mean"]):  # row i: layer i's residual input (the last: the output)
        torch.testing.assert_close(torch.tensor(row[: i + 1], dtype=torch.float64), mean[3, i, : i + 1].double(), atol=1e-6, rtol=1e-5)
    assert entries["Q"]["targets"] == [1]  # two layers: layer 1 reads streams; the output has R alone


def test_the_figure_is_drawn_and_a_model_without_mixing_has_none(trained, text, tmp_path):  # noqa: F811
    assert (trained["mudd"] / "analysis" / "gates.png").is_file()
    out = tmp_path / "plain"
    with one_thread():
        assert run(args(text, out, "--connection", "PreLN+ValueRes")) == 0
    assert mixing.mixing(load_trained(out), "valid", 4, progress=False) == []


@pytest.mark.parametrize("spec, keys", [("LAuReL", ("alpha", "beta")), ("LAuReL(form=lr)", ("ba_norm",)),
                                        ("LAuReL(form=pa,k=2)", ("ba_norm", "pa_gamma_0", "pa_gamma_1")),
                                        ("nGPT", ("alpha_mean", "alpha_min", "alpha_max"))])
def test_gates_read_the_newer_connections_learned_values(text, tmp_path, spec, keys):  # noqa: F811
    out = tmp_path / "run"
    with one_thread():
        assert run(args(text, out, "--connection", spec)) == 0
        assert run(["analyze", "gates", out, "--examples", "4", "--split", "valid"]) == 0
    rows = _gates(out)["connections"]
    conns = dict(load_trained(out).model.named_modules())
    assert len(rows) == 4  # two layers, two sub-layers each
    for row in rows:
        stats = conns[row["connection"]].stats()
        for key in keys:
            assert row[key] == pytest.approx(stats[key])
    assert all(k in (out / "analysis" / "gates.md").read_text() for k in keys)


def test_the_gates_table_tells_one_mechanisms_rows_apart_by_block(text, tmp_path):  # noqa: F811
    """The value residual is one module (across.ValueRes) with a row per layer that reads it: the table names each
    row's block, not the same connection name twice."""
    out = tmp_path / "vr"
    with one_thread():
        argv = args(text, out, "--connection", "PreLN+ValueRes")
        argv[argv.index("--model") + 1] = argv[argv.index("--model") + 1].replace("layers=2", "layers=4")
        assert run(argv) == 0
        assert run(["analyze", "gates", out, "--examples", "4", "--split", "valid"]) == 0
    rows = [r for r in _gates(out)["connections"] if r["connection"].startswith("across.")]
    assert len(rows) == 3 and len({r["block"] for r in rows}) == 3  # layers 1-3 read layer 0's values
    table = " ".join((out / "analysis" / "gates.md").read_text().split(" "))
    squeeze = lambda t: " ".join(t.split())  # noqa: E731
    assert "| connection | block | spec |" in squeeze(table)
    for r in rows:
        assert f"| {r['connection']} | {r['block']} |" in squeeze(table)
