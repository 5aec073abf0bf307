"""The layer non-linearity probe: a linear layer loses nothing, a needed non-linear one loses clearly."""

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from skiplab.analysis.linearity import LinearLayer, linearity
from skiplab.analysis.trained import Examples
from skiplab.tasks.image import ImageTrained
from skiplab.cli import main
from tests.noise import EPS32, FACTOR, assert_within_noise, noise


def xor_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g) * 2 - 1
    y = ((x[:, 0] > 0) ^ (x[:, 1] > 0)).long()  # no linear map of x separates the classes
    return x[:, :, None, None], y


class Toy(ImageTrained):
    """An 'image' model on 2-d points (1x1 'images'): block.0 linear, block.1 non-linear, a linear head."""

    def examples(self, split, count, seed=0, batch=250, max_tokens=4096, data_dir="", shuffle=False):
        x, y = xor_data(2000, 0) if split == "train" else xor_data(500, 1)
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))[:count] if shuffle else \
            torch.arange(min(count, len(y)))
        for i in range(0, len(order), batch):
            idx = order[i : i + batch]
            yield Examples((x[idx],), y[idx], {})


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(nn.Conv2d(2, 16, 1), nn.Sequential(nn.Conv2d(16, 16, 1), nn.ReLU()))
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        return self.head(self.blocks(x).flatten(1))


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    torch.manual_seed(0)
    tr = Toy(tmp_path_factory.mktemp("toy"), Net(), {"model": "toy"}, {})
    opt = torch.optim.Adam(tr.model.parameters(), lr=0.03)
    for _ in range(4):
        for ex in tr.examples("train", 2000, batch=100, shuffle=True):
            opt.zero_grad()
            tr.losses(ex, tr.forward(ex)).mean().backward()
            opt.step()
    return tr.__class__(tr.path, tr.model.eval(), tr.config, {})


def test_a_linear_layer_loses_nothing_and_a_needed_non_linearity_loses_clearly(toy):
    exact = linearity(toy, ["block.0"], steps=0, sample=1000, progress=False)["layers"][0]
    x, _ = xor_data(2000, 0)
    with torch.no_grad():  # the fit is the layer: its residual is the layer's float32 error, relative
        y, y64 = toy.model.blocks[0](x), copy.deepcopy(toy.model.blocks[0]).double()(x.double())
    assert exact["lsq_relative_residual"] <= FACTOR * ((y - y64).norm() / y64.norm()).item()
    assert abs(exact["delta_pct"]) < 1e-6
    result = linearity(toy, ["block.0", "block.1"], steps=30, sample=1000, progress=False)
    assert result["metric"] == "error" and 0 < result["untouched"] < 10  # the toy learned XOR
    linear, nonlinear = result["layers"]
    assert linear["error"] <= result["untouched"] + 0.5  # training it in place loses nothing either
    assert nonlinear["error"] > 30 and nonlinear["delta_pct"] > 200  # XOR needs the ReLU
    assert isinstance(toy.model.blocks[1], nn.Sequential)  # the original is back in place


def test_least_squares_recovers_a_linear_map_and_splits_pairs():
    orig = nn.Identity()
    lin = LinearLayer(orig, 6, 6, n_state=2, widths=[3, 3])
    w, b = torch.randn(6, 6), torch.randn(6)
    x = torch.randn(200, 6)
    y, y64 = x @ w.T + b, x.double() @ w.double().T + b.double()
    # y64 is linear in x: no fit of float32 y leaves more than y's distance from it (plus float64 rounding)
    assert lin.fit(x, y) <= ((y - y64).norm() / y64.norm()).item() + 1e-12
    assert lin.fit(x, y64) < 1e-12  # exact data: the map itself, to float32 rounding
    torch.testing.assert_close(lin.map.weight, w, rtol=EPS32, atol=0)
    torch.testing.assert_close(lin.map.bias, b, rtol=EPS32, atol=0)
    out, cell = lin(x[:, :3], x[:, 3:], "ignored mask")
    got = torch.cat([out, cell], -1)
    assert_within_noise(got, y, noise((y, y64), (got, y64)))


def test_cli_probes_translation_layers_of_both_families(mt_runs, capsys):
    for name, layers in (("sas", "encoder.0,decoder.1"), ("dwlstm", "encoder.1,decoder.0")):
        run = mt_runs / name
        assert main(["analyze", "linearity", str(run), "--layers", layers, "--steps", "2", "--sample", "300",
                     "--beam", "1"]) == 0
        result = json.loads((run / "analysis" / "linearity.json").read_text())
        assert [r["layer"] for r in result["layers"]] == layers.split(",")
        assert result["metric"] == "bleu" and result["examples"] == 8 and result["steps"] == 2
    assert "Δ (%)" in capsys.readouterr().out
    assert main(["analyze", "linearity", str(mt_runs / "sas"), "--layers", "encoder.9", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "no layer encoder.9; its layers: encoder.0, encoder.1, decoder.0, decoder.1" in err and err.count("\n") == 1


def test_linearity_needs_layers():
    with pytest.raises(SystemExit):
        main(["analyze", "linearity", str(Path("."))])
