import copy
import json

import pytest
import torch
from torch import nn

from skiplab.analysis.gradient_flow import GradientFlowConfig, measure, run
from tests.noise import assert_within_noise, noise


def input_grad(layers, x, readout) -> float:
    """mean |∂(h · readout)/∂x| through h = tanh(layer(h)), layer by layer."""
    x = x.detach().requires_grad_()
    h = x
    for layer in layers:
        h = torch.tanh(layer(h))
    (h * readout).sum().backward()
    return x.grad.abs().mean().item()


def test_noskip_is_the_tutorials_network_without_residuals():
    cfg = GradientFlowConfig(depth=5, width=12, batch=3, seed=7)
    torch.manual_seed(cfg.seed)
    layers = [nn.Linear(12, 12) for _ in range(5)]
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    x = torch.randn(3, 12, generator=gen, requires_grad=True)
    readout = torch.randn(3, 12, generator=gen)
    by_hand = input_grad(layers, x, readout)
    by_hand64 = input_grad([copy.deepcopy(m).double() for m in layers], x.double(), readout.double())  # noise
    grads = measure("NoSkip", cfg)
    assert_within_noise(grads[0], by_hand, noise((by_hand, by_hand64)))
    assert grads[-1] == pytest.approx(readout.abs().mean().item())


def test_run_writes_table_json_and_plot(tmp_path, capsys):
    cfg = GradientFlowConfig(designs=("NoSkip", "1xSkip", "2xSkip", "2rSkip+LN"), depth=10, width=16, batch=4, out=str(tmp_path))
    grads = run(cfg)
    out = capsys.readouterr().out
    for spec in cfg.designs:
        assert f"| {spec}" in out
        assert len(grads[spec]) == cfg.depth + 1
    # the same read-out reaches the output of every design; skips decide what reaches the input
    assert len({round(g[-1], 6) for g in grads.values()}) == 1
    assert grads["2xSkip"][0] > grads["1xSkip"][0] > grads["NoSkip"][0]
    record = json.loads((tmp_path / "gradient_flow.json").read_text())
    assert record["config"]["seed"] == 0 and record["config"]["designs"] == list(cfg.designs)
    assert record["grad_mean_abs"]["1xSkip"] == pytest.approx(grads["1xSkip"])
    assert (tmp_path / "gradient_flow.png").read_bytes()[:4] == b"\x89PNG"
    head, blank, table = (tmp_path / "gradient_flow.md").read_text().split("\n", 2)
    assert head.startswith("mean |dL/dh| at the input of block l; 10 tanh blocks of width 16") and "code " in head
    assert blank == "" and table.startswith("| connection")


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="--depth must be >= 1, got 0"):
        GradientFlowConfig(depth=0)
