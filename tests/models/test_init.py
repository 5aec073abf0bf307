"""Initialisation of the translation families: ``xavier`` (Xavier-uniform linear layers, stacked ones slice by
slice, N(0, d^-1/2) embeddings; the Transformer's default), ``lipschitz`` (U(±1/sqrt(fan_in)) linear layers,
U(±sqrt(2/(V+d))) embeddings, as Neutron; the depth-wise LSTM's default), zero biases in both, and
connections that keep their own initialisation."""

import math

import pytest
import torch
from torch import nn

import skiplab
from skiplab.models import build_model, model_config

V, D, FFN = 400, 64, 128

# layers that compute several of the papers' matrices in one matmul: name suffix -> number of slices
STACKED = {"qkv_proj": 3, "kv_proj": 2, "gates.proj": 3}


def build(spec: str, **kw):
    torch.manual_seed(0)
    fields = dict(vocab_size=V, d_model=D, ffn_dim=FFN, heads=4, encoder_layers=2, decoder_layers=2)
    return build_model(model_config(spec, **{**fields, **kw}))


def own_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The model's linear layers outside its connections, each once (a shared one under its first name)."""
    inside = [name + "." for name, _ in skiplab.iter_connections(model)]
    found, seen = {}, set()
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and not any(name.startswith(c) for c in inside) and id(module) not in seen:
            found[name] = module
            seen.add(id(module))
    return found


def slices(name: str, lin: nn.Linear) -> list[torch.Tensor]:
    parts = next((n for suffix, n in STACKED.items() if name.endswith(suffix)), 1)
    return list(lin.weight.detach().chunk(parts, dim=0))


def check_uniform(w: torch.Tensor, bound: float, where: str) -> None:
    """``w`` looks like n draws of U(-bound, bound): inside the bound, reaching near it, std = bound / sqrt(3).

    The sample std of n uniform draws has a relative standard error of sqrt(μ4/σ^4 - 1) / (2 sqrt(n)) =
    sqrt(9/5 - 1) / (2 sqrt(n)) ≈ 0.447 / sqrt(n); the test allows 6 of those (2.7 % for a 64 x 64 slice).
    PyTorch's default (bound 1/sqrt(fan_in)) and a bound taken over a whole stacked matrix are off by 20 % or
    more for every layer below, so either fails here."""
    n, top, std = w.numel(), w.abs().max().item(), w.std().item()
    assert top <= bound * (1 + 1e-6), (where, top, bound)  # 1e-6: float32 rounding of the bound
    assert top > bound * (1 - 10 / n), (where, top, bound)  # P(all n draws inside (1 - 10/n) b) ≈ e^-10
    tolerance = 6 * math.sqrt(0.8) / (2 * math.sqrt(n))
    assert std == pytest.approx(bound / math.sqrt(3), rel=tolerance), where


def check_family(model: nn.Module, expected_layers: int) -> None:
    linears = own_linears(model)
    assert len(linears) == expected_layers, sorted(linears)
    for name, lin in linears.items():
        assert torch.equal(lin.bias, torch.zeros_like(lin.bias)), name
        if model.cfg.init == "lipschitz":  # one bound for the whole matrix: it depends on fan_in alone
            check_uniform(lin.weight.detach(), lin.in_features ** -0.5, name)
            continue
        for k, w in enumerate(slices(name, lin)):
            fan_out, fan_in = w.shape
            check_uniform(w, math.sqrt(6 / (fan_in + fan_out)), f"{name} slice {k}")
    emb = model.embed.weight.detach()
    assert torch.equal(emb[model.cfg.pad_id], torch.zeros(D))
    rows = torch.cat([emb[: model.cfg.pad_id], emb[model.cfg.pad_id + 1 :]])
    if model.cfg.init == "lipschitz":
        check_uniform(rows, math.sqrt(2 / (V + D)), "embedding")
        return
    # the std of n normal draws has a relative standard error of 1 / sqrt(2n): 6 of those allowed (1.9 %)
    assert rows.std().item() == pytest.approx(D**-0.5, rel=6 / math.sqrt(2 * rows.numel()))
    assert rows.mean().abs().item() < 6 * D**-0.5 / math.sqrt(rows.numel())


def test_hand_bounds_of_the_layers():
    """The bounds sqrt(6 / (fan_in + fan_out)) for D = 64, FFN = 128, worked out by hand."""
    model = build("transformer-small")
    layer = model.decoder.layers[0]
    for w, bound in [(layer.self_attn.qkv_proj.weight[:D], 0.21650635),  # sqrt(6 / 128): a 64 x 64 slice
                     (layer.self_attn.qkv_proj.weight[2 * D :], 0.21650635),
                     (layer.cross_attn.kv_proj.weight[D:], 0.21650635),
                     (layer.self_attn.out_proj.weight, 0.21650635),
                     (layer.ffn[0].weight, 0.17677670),  # sqrt(6 / 192): 64 -> 128
                     (layer.ffn[2].weight, 0.17677670)]:
        check_uniform(w.detach(), bound, str(tuple(w.shape)))
    dw = build("dwlstm-small", merge="concat", hidden_layers=2, init="xavier")
    enc, dec = dw.encoder.layers[0].lstm, dw.decoder.layers[0].lstm
    check_uniform(enc.gates.proj.weight[D : 2 * D].detach(), 0.17677670, "encoder W_f")  # sqrt(6 / (128 + 64))
    check_uniform(dec.gates.proj.weight[2 * D :].detach(), 0.15309311, "decoder W_o")  # sqrt(6 / (192 + 64))
    check_uniform(dec.hidden.proj.weight.detach(), 0.13693064, "decoder W_h1")  # sqrt(6 / (192 + 128))
    check_uniform(dec.hidden.out.weight.detach(), 0.17677670, "decoder W_h2")  # sqrt(6 / (128 + 64))


def test_hand_bounds_of_neutrons_initialisation():
    """The depth-wise LSTM's default: 1 / sqrt(fan_in) for D = 64, FFN = 128, and sqrt(2 / (V + D)) for the
    embedding, worked out by hand (Neutron utils/init/base.py: Kaiming-uniform with gain sqrt(1/3), Glorot-uniform
    with gain sqrt(1/3))."""
    dw = build("dwlstm-small", merge="concat", hidden_layers=2)
    assert dw.cfg.init == "lipschitz"
    enc, dec = dw.encoder.layers[0], dw.decoder.layers[0]
    for w, bound in [(enc.lstm.gates.proj.weight, 0.08838835),  # 1 / sqrt(128): [x ; out], all three gates
                     (dec.lstm.gates.proj.weight, 0.07216878),  # 1 / sqrt(192): [s ; a ; out]
                     (dec.lstm.hidden.proj.weight, 0.07216878),
                     (dec.lstm.hidden.out.weight, 0.08838835),  # 1 / sqrt(128): the inner width
                     (dec.self_attn.qkv_proj.weight, 0.125),  # 1 / sqrt(64)
                     (dec.cross_attn.kv_proj.weight, 0.125),
                     (dw.embed.weight[1:], 0.06565322)]:  # sqrt(2 / (400 + 64))
        check_uniform(w.detach(), bound, str(tuple(w.shape)))

@pytest.mark.parametrize("init", ["xavier", "lipschitz"])
@pytest.mark.parametrize("connection", ["PostLN", "PreLN", "2rSkip+LN"])
def test_transformer_linears_and_embeddings(connection, init):
    # per encoder layer: qkv, out, 2 FFN; per decoder layer: qkv, out, q, kv, out, 2 FFN
    model = build("transformer-small", connection=connection, **({"init": init} if init != "xavier" else {}))
    assert model.cfg.init == init  # xavier is the Transformer's default
    check_family(model, expected_layers=2 * 4 + 2 * 7)


@pytest.mark.parametrize("options,lstm_layers", [
    ({}, 1 + 2 * 2 + 1 + 2 * 2),  # share=gates: one gate layer per stack, W_h1 and W_h2 per layer
    ({"share": "none", "merge": "concat", "hidden_layers": 1}, 2 * 2 + 2 * 2),  # gates and W_h per layer
    ({"share": "all"}, 3 + 3),  # one whole unit per stack
])
@pytest.mark.parametrize("init", ["lipschitz", "xavier"])
def test_dwlstm_linears_and_embeddings(options, lstm_layers, init):
    attention = 2 * 2 + 2 * 5  # encoder: qkv, out; decoder: qkv, out, q, kv, out
    check_family(build("dwlstm-small", **options, init=init), expected_layers=attention + lstm_layers)


@pytest.mark.parametrize("init", ["xavier", "lipschitz"])
def test_connections_keep_their_own_initialisation(init):
    sas = build("transformer-small", connection="SAS", init=init)
    for _, conn in skiplab.iter_connections(sas):
        assert torch.equal(conn.alpha.out.bias, torch.full_like(conn.alpha.out.bias, 3.0))  # SAS paper, Section 4.2
        assert torch.equal(conn.beta.out.bias, torch.full_like(conn.beta.out.bias, -3.0))
    highway = build("transformer-small", connection="Highway", init=init)
    for _, conn in skiplab.iter_connections(highway):
        assert torch.equal(conn.transform.bias, torch.full_like(conn.transform.bias, -2.0))
        # PyTorch's nn.Linear default, U(-1/sqrt(D), 1/sqrt(D)), not Xavier's sqrt(6 / 2D)
        assert conn.transform.weight.abs().max().item() <= D**-0.5
