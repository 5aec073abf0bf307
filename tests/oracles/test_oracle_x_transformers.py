"""skiplab's designs against the x-transformers options that are the same design: ``sandwich_norm`` (skiplab
``SandwichLN``), ``use_layerscale`` (``LayerScale``) and ``add_value_residual`` with ``learned_value_residual_mix =
False`` (``+ValueRes``, λ = 0.5). Each runs x-transformers' own stack (``Decoder``, i.e. ``AttentionLayers.forward``,
with its norms, residuals and final norm) against skiplab's connections on the same branch functions: the
feed-forward sub-layers (and, but for the value residual, the attention) are replaced in both by one shared
function, so that what is compared is the connection around them; for the value residual the attention is
x-transformers' own, its weights copied into skiplab's.

Mapping: x-transformers' norms are bias-free LayerNorms with a unit offset on the gain (gain = ``gamma`` + 1 by
default), skiplab's LayerNorms keep their bias at 0 and take that gain; its LayerScale's λ is ``gamma`` (+ 1 with the
offset). Where they differ: x-transformers has no ReZero option; its ``learned_value_residual_mix`` (on by default)
learns a per-token mix (a sigmoid of a linear map of the input), where skiplab's ``+ValueRes(learn=yes)`` learns
one λ per layer; its ``num_residual_streams`` is a per-stream mHC-like hybrid (sigmoid H^pre, 5 Sinkhorn
iterations from a softmax, H^post = 2σ of a 2σ-scaled term) that is neither skiplab's HC nor its mHC.
"""

import importlib.metadata

import pytest
import torch
from torch import nn
from x_transformers import Decoder

import skiplab
from skiplab import Place
from skiplab.connections import Across
from skiplab.models.attention import SelfAttention

X_TRANSFORMERS_VERSION = "2.31.10"  # the version these mappings were checked against
D, HEADS = 16, 2


def test_checked_against_the_installed_version():
    assert importlib.metadata.version("x-transformers") == X_TRANSFORMERS_VERSION, (
        "x-transformers changed: check the mappings in this module and update X_TRANSFORMERS_VERSION")


class Branch(nn.Module):
    """A sub-layer of x-transformers' stack replaced by ``f``: the attention returns (out, intermediates)."""

    def __init__(self, f: nn.Module, attention: bool):
        super().__init__()
        self.f, self.attention = f, attention

    def forward(self, x, **kwargs):
        return (self.f(x), None) if self.attention else self.f(x)


def branches(count: int) -> list[nn.Module]:
    torch.manual_seed(1)
    return [nn.Sequential(nn.Linear(D, 2 * D), nn.Tanh(), nn.Linear(2 * D, D)).double() for _ in range(count)]


def gain(norm: nn.Module) -> torch.Tensor:
    """The gain an x-transformers LayerNorm (or LayerScale) multiplies by."""
    return norm.gamma + float(norm.unit_offset)


def randomise(module: nn.Module, seed: int = 2) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def conns(spec: str, layers: int) -> list:
    """skiplab's connections of a GPT-like stack: sub-layers (attention, feed-forward) of each layer."""
    return [skiplab.connection(spec, D, place=Place.decoder_only(layer, layers, s, 2, role)).double()
            for layer in range(1, layers + 1) for s, role in ((1, "attn"), (2, "ffn"))]


def load_norm(ours: nn.Module, theirs: nn.Module) -> None:
    with torch.no_grad():
        ours.weight.copy_(gain(theirs))
        ours.bias.zero_()


def replace(xt: Decoder, fs: list[nn.Module]) -> None:
    """x-transformers' sub-layers (attention, feed-forward, in its order) replaced by the functions ``fs``."""
    for i, ((norms, block, residual), f, kind) in enumerate(zip(xt.layers, fs, xt.layer_types)):
        branch = Branch(f, attention=kind == "a")
        if hasattr(block, "fn"):  # LayerScale(fn): keep the wrapper, replace what it wraps
            block.fn = branch
        else:
            xt.layers[i] = nn.ModuleList([norms, branch, residual])


def test_sandwich_norm_is_sandwich_ln():
    layers = 3
    xt = Decoder(dim=D, depth=layers, heads=HEADS, sandwich_norm=True).double()
    randomise(xt)
    fs = branches(2 * layers)
    replace(xt, fs)
    ours = conns("SandwichLN", layers)
    final = skiplab.final_norm("SandwichLN", D, layers=layers).double()
    for conn, (norms, _, _) in zip(ours, xt.layers):
        pre, post, main = norms
        assert main is None  # pre-norm: no norm after the sum
        load_norm(conn.norm_in, pre), load_norm(conn.norm_out, post)
    load_norm(final, xt.final_norm)
    x = torch.randn(2, 7, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    h = skiplab.input_norm("SandwichLN", D)(x)  # none: Sandwich-LN leaves the embeddings as they are
    for conn, f in zip(ours, fs):
        h = conn(h, f)
    y, y_ref = final(h), xt(x_ref)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(4), dtype=y.dtype)
    (y * w).sum().backward()
    grads = {id(f): [p.grad.clone() for p in f.parameters()] for f in fs}
    for f in fs:
        f.zero_grad()
    (y_ref * w).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-10, atol=1e-12)
    for conn, (norms, _, _) in zip(ours, xt.layers):
        torch.testing.assert_close(conn.norm_in.weight.grad, norms[0].gamma.grad, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(conn.norm_out.weight.grad, norms[1].gamma.grad, rtol=1e-10, atol=1e-12)
    for f in fs:
        for got, p in zip(grads[id(f)], f.parameters()):
            torch.testing.assert_close(got, p.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("init", [0.1, 1e-5])
def test_layerscale_option_is_layerscale(init):
    layers = 2
    xt = Decoder(dim=D, depth=layers, heads=HEADS, use_layerscale=True, layerscale_init_value=init).double()
    ours = conns(f"LayerScale(init={init})", layers)
    for conn, (_, block, _) in zip(ours, xt.layers):
        torch.testing.assert_close(conn.scale, gain(block).detach())  # the same start: λ = init on every feature
    randomise(xt)
    fs = branches(2 * layers)
    replace(xt, fs)
    final = skiplab.final_norm("LayerScale", D, layers=layers).double()
    for conn, (norms, block, _) in zip(ours, xt.layers):
        load_norm(conn.norm, norms[0])
        with torch.no_grad():
            conn.scale.copy_(gain(block))
    load_norm(final, xt.final_norm)
    x = torch.randn(2, 7, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    h = x
    for conn, f in zip(ours, fs):
        h = conn(h, f)
    y, y_ref = final(h), xt(x)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(4), dtype=y.dtype)
    (y * w).sum().backward(), (y_ref * w).sum().backward()
    for conn, (_, block, _) in zip(ours, xt.layers):
        assert block.gamma.grad.abs().max() > 1e-6
        torch.testing.assert_close(conn.scale.grad, block.gamma.grad, rtol=1e-10, atol=1e-12)


def test_value_residual_at_one_half_is_valueres():
    layers = 3
    xt = Decoder(dim=D, depth=layers, heads=HEADS, attn_dim_head=D // HEADS, add_value_residual=True,
                 learned_value_residual_mix=False).double()
    randomise(xt)
    ffns = branches(layers)
    attns = []
    for i, (_, block, _) in enumerate(xt.layers):
        if xt.layer_types[i] == "a":  # x-transformers' attention, its weights copied into skiplab's
            attn = SelfAttention(D, HEADS, bias=False).double()
            with torch.no_grad():
                attn.qkv_proj.weight.copy_(torch.cat([block.to_q.weight, block.to_k.weight, block.to_v.weight]))
                attn.out_proj.weight.copy_(block.to_out.weight)
            attns.append(attn)
    replace_ffn = [None if kind == "a" else ffns[i // 2] for i, kind in enumerate(xt.layer_types)]
    for i, f in enumerate(replace_ffn):
        if f is not None:
            norms, _, residual = xt.layers[i]
            xt.layers[i] = nn.ModuleList([norms, Branch(f, attention=False), residual])
    spec = "PreLN+ValueRes"
    ours = conns(spec, layers)
    across = Across(spec, layers)
    final = skiplab.final_norm(spec, D, layers=layers).double()
    for conn, (norms, _, _) in zip(ours, xt.layers):
        load_norm(conn.norm, norms[0])
    load_norm(final, xt.final_norm)
    x = torch.randn(2, 7, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    run, h = across.start(), x
    for i in range(layers):
        h = run.enter(i, h)
        h = ours[2 * i](h, lambda t: attns[i](t, causal=True, values=run.values(i)))
        h = ours[2 * i + 1](h, ffns[i])
        run.leave(i, h)
    y, y_ref = final(h), xt(x)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)  # its attention softmax runs in float32 (attend.py)
    plain = Across("PreLN", layers).start()  # without the value residual the outputs part: the test can fail
    h = x
    for i in range(layers):
        h = ours[2 * i](h, lambda t: attns[i](t, causal=True, values=plain.values(i)))
        h = ours[2 * i + 1](h, ffns[i])
    assert (final(h) - y_ref).abs().max() > 1e-4
