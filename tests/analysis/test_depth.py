"""``skiplab analyze redundancy`` and ``norms``: against hand computation and direct hooks on tiny LM runs."""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from skiplab.analysis.norms import norms
from skiplab.analysis.redundancy import angular_distance, redundancy
from skiplab.cli import main
from skiplab.tasks import load_trained
from tests.analysis.conftest import TINY_GPT as TINY, tiny_lm_runs

# float64 rounding of arccos near cos = 1: arccos(1 − ε) ≈ √(2ε), ε ~ 1e-16 -> ~1.5e-8, / π
ARCCOS64 = 1e-7


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory):
    """Tiny GPT runs (a few updates): 2-layer PreLN, 3-layer PostLN, 2-layer HC(n=2)."""
    return tiny_lm_runs(tmp_path_factory.mktemp("depth"), {
        name: TINY.format(layers=layers, conn=conn)
        for name, layers, conn in (("preln", 2, "PreLN"), ("postln", 3, "PostLN"), ("hc", 2, "HC(n=2)"))})


def test_angular_distance_of_same_opposite_and_orthogonal_states():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, generator=g) * 3.0
    assert angular_distance(x, x).abs().max() < ARCCOS64
    assert angular_distance(x, 2.5 * x).abs().max() < ARCCOS64  # the scale does not count
    assert (angular_distance(x, -x) - 1).abs().max() < ARCCOS64
    e = torch.eye(3)
    assert torch.allclose(angular_distance(e, e.roll(1, 0)), torch.full((3,), 0.5, dtype=torch.float64))
    assert torch.isnan(angular_distance(torch.zeros(1, 3), torch.ones(1, 3))).all()


def _batches(tr, examples):
    return list(tr.examples("test", examples, 0))


def test_redundancy_against_a_forward_pass_by_hand(lm_runs):
    tr = load_trained(lm_runs / "preln")
    result = redundancy(tr, examples=6, progress=False)
    model = tr.model
    batches = _batches(tr, 6)
    assert result["examples"] == sum(len(ex) for ex in batches) == 6

    def loss_and_states(skip=None):
        total, tokens, states = 0.0, 0, []
        with torch.no_grad():
            for ex in batches:
                (x,) = ex.inputs
                h = model.embed_norm(model.embed(x))  # PreLN: the identity; rope positions: none added here
                hs = [h]
                for i, layer in enumerate(model.layers):
                    h = h if i == skip else layer(h)
                    hs.append(h)
                logits = F.linear(model.norm(h), model.embed.weight)
                total += F.cross_entropy(logits.double().transpose(1, 2), ex.target, reduction="sum").item()
                tokens += ex.target.numel()
                states.append(torch.stack(hs))
        return total / tokens, torch.cat([s.flatten(1, 2) for s in states], 1)  # (L+1, N, D)

    full, states = loss_and_states()
    assert result["loss"] == pytest.approx(full, rel=1e-6)
    for i, row in enumerate(result["blocks"]):
        without, _ = loss_and_states(skip=i)
        assert row["loss_skipped"] == pytest.approx(without, rel=1e-6)
        assert row["loss_increase"] == pytest.approx(without - full, abs=1e-6 * full)
    for l in range(3):
        for m in range(3):
            expected = angular_distance(states[l], states[m]).mean().item()
            assert result["distance"]["layer"][l][m] == pytest.approx(expected, abs=1e-6)
    assert result["blocks"][0]["distance_next"] == result["distance"]["layer"][0][1]
    assert result["blocks"][1]["distance_next"] > 0


def test_redundancy_spans_k_and_sums_hyper_connection_streams(lm_runs):
    tr = load_trained(lm_runs / "postln")
    result = redundancy(tr, examples=4, k=2, progress=False)
    d = result["distance"]["layer"]
    assert [b["distance_k"] for b in result["blocks"]] == [d[0][2], d[1][3], None]
    with pytest.raises(ValueError, match="k = 4 is more blocks than a stack has"):
        redundancy(tr, examples=4, k=4, progress=False)
    hc = load_trained(lm_runs / "hc")
    seen = []
    hook = hc.model.layers[1].register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    result = redundancy(hc, examples=4, progress=False)
    hook.remove()
    streams = seen[0]  # the first pass, every block in place: (B, T, n, D)
    assert streams.dim() == 4 and streams.shape[2] == 2
    assert all(math.isfinite(b["loss_increase"]) for b in result["blocks"])
    assert 0 <= result["distance"]["layer"][0][1] <= 1


def test_norms_against_direct_hooks(lm_runs):
    tr = load_trained(lm_runs / "postln")
    result = norms(tr, examples=6, ratio=3.0, progress=False)
    model, entering, attn, mlp = tr.model, [], [], []
    hooks = [layer.register_forward_pre_hook(lambda m, a: entering.append(a[0])) for layer in model.layers]
    hooks += [model.layers[-1].register_forward_hook(lambda m, a, o: entering.append(o))]
    hooks += [layer.attn.register_forward_hook(lambda m, a, o: attn.append(o)) for layer in model.layers]
    hooks += [layer.mlp.register_forward_hook(lambda m, a, o: mlp.append(o)) for layer in model.layers]
    with torch.no_grad():
        for ex in _batches(tr, 6):
            tr.forward(ex)
    for h in hooks:
        h.remove()
    states = [torch.cat([entering[j] for j in range(i, len(entering), 4)]).double().flatten(0, 1) for i in range(4)]
    assert [s["state"] for s in result["states"]] == ["layer.0", "layer.1", "layer.2", "layer.out"]
    for row, h in zip(result["states"], states):
        rms = h.pow(2).mean(-1).sqrt()
        assert row["rms_mean"] == pytest.approx(rms.mean().item(), rel=1e-9)
        assert row["rms_max"] == pytest.approx(rms.max().item(), rel=1e-9)
        assert row["max_abs"] == pytest.approx(h.abs().max().item(), rel=1e-9)
        assert row["positions"] == h.shape[0]
    # one batch here (6 windows of 16 tokens): the share against that batch's median, by hand
    h = states[0].abs()
    assert result["states"][0]["massive_share"] == pytest.approx((h > 3.0 * h.median()).double().mean().item())
    subs = {r["connection"]: r for r in result["sublayers"]}
    assert list(subs) == [f"layers.{i}.{c}" for i in range(3) for c in ("conn_attn", "conn_mlp")]
    for i in range(3):  # dropout is off in evaluation mode: the branch returns the attention's / MLP's output
        for name, outs in (("conn_attn", attn), ("conn_mlp", mlp)):
            y = torch.cat(outs[i::3]).double().flatten(0, 1)
            assert subs[f"layers.{i}.{name}"]["rms_mean"] == pytest.approx(y.pow(2).mean(-1).sqrt().mean().item(), rel=1e-9)


def test_both_from_the_command_line_with_an_overlay_and_translation(lm_runs, mt_runs, capsys):
    for name in ("redundancy", "norms"):
        assert main(["analyze", name, str(lm_runs / "preln"), "--compare", str(lm_runs / "hc"), "--examples", "4"]) == 0
        for f in (f"{name}.json", f"{name}.md", f"{name}.png", f"{name}_compare.png"):
            assert (lm_runs / "preln" / "analysis" / f).is_file()
        assert (lm_runs / "hc" / "analysis" / f"{name}.json").is_file()
        assert main(["analyze", name, str(lm_runs / "preln"), "--examples", "4"]) == 2  # no overwrite
        assert "exists; use --overwrite" in capsys.readouterr().err
    for run in ("sas", "dwlstm"):  # both stacks; the depth-wise LSTM's layers return (out, cell)
        result = redundancy(load_trained(mt_runs / run), examples=4, progress=False)
        assert {b["stage"] for b in result["blocks"]} == {"encoder", "decoder"}
        assert all(math.isfinite(b["loss_increase"]) for b in result["blocks"])
        shown = norms(load_trained(mt_runs / run), examples=4, progress=False)
        assert [s["state"] for s in shown["states"]][-3:] == ["decoder.0", "decoder.1", "decoder.out"]
        assert bool(shown["sublayers"]) == (run == "sas")


def test_an_image_run_is_refused_with_the_reason():
    image = SimpleNamespace(kind="image")  # refused before anything of the run is read
    with pytest.raises(ValueError, match="an image model's stages change it"):
        redundancy(image)


def test_redundancy_of_a_value_residual_run_takes_v1_from_the_first_layer_that_runs(tmp_path):
    """Without layer 0 there is no V_1: `analyze redundancy` of a +ValueRes run stopped on a KeyError. The first
    layer that runs gives V_1 there (layer 1, whose own values are then unmixed), and every block's loss increase is
    finite; with every layer in place the model is the one trained."""
    root = tiny_lm_runs(tmp_path, {"vr": TINY.format(layers=3, conn="PreLN+ValueRes")}, steps=2, eval_every=2)
    tr = load_trained(root / "vr")
    assert "ValueRes" in tr.config["model"]
    result = redundancy(tr, examples=4, progress=False)
    assert [b["block"] for b in result["blocks"]][:2] == ["layer.0", "layer.1"]
    assert all(math.isfinite(b["loss_increase"]) for b in result["blocks"])
