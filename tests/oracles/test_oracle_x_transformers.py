"""skiplab's designs against the x-transformers options that are the same design: ``sandwich_norm`` (skiplab
``SandwichLN``), ``use_layerscale`` (``LayerScale``) and ``add_value_residual`` (``+ValueRes``). Each runs
x-transformers' own stack (``Decoder``, i.e. ``AttentionLayers.forward``, with its norms, residuals and final norm)
against skiplab's connections at width 64 in float64, and compares outputs and gradients (Sandwich-LN: the input's,
the norms', the final norm's, the branches'; LayerScale: the same and the scales'; the value residual: the input's,
the norms', every attention and feed-forward weight's, the learned λ's): for Sandwich-LN and LayerScale the sub-layers are replaced in both by one
shared function, so that what is compared is the connection around them; for the value residual the attention is
x-transformers' own (its softmax set to float64: it computes it in float32), its weights copied into skiplab's.

The value residual is compared at λ = 0.5, at a random λ, and with ``learn=yes`` at a random λ per layer: without
``learned_value_residual_mix`` x-transformers mixes V_1.lerp(V_l, 0.5) (``always(0.5)``); the test replaces that
constant of each attention by a scalar parameter mix_l = 1 − λ_l, so that its own lerp mixes at skiplab's λ and a
learned λ_l's gradient is −mix_l's.

Mapping: x-transformers' norms are bias-free LayerNorms with a unit offset on the gain (gain = ``gamma`` + 1 by
default), skiplab's LayerNorms keep their bias at 0 and take that gain; its LayerScale's λ is ``gamma`` (+ 1 with the
offset). Where they differ: x-transformers has no ReZero option; its ``learned_value_residual_mix`` (on by default)
learns a per-token mix (a sigmoid of a linear map of the input), where skiplab's ``+ValueRes(learn=yes)`` learns
one λ per layer; its ``num_residual_streams`` is a per-stream mHC-like hybrid (sigmoid H^pre, 5 Sinkhorn
iterations from a softmax, H^post = 2σ of a 2σ-scaled term) that is neither skiplab's HC nor its mHC.

Each comparison is shown to fail under a mutation of a constant of its design (the last test).
"""

import copy
import importlib.metadata
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import skiplab
from skiplab import Place
from skiplab.connections import Across, norms, scaled
from skiplab.connections import across as across_mod
from skiplab.models.attention import SelfAttention

Decoder = pytest.importorskip("x_transformers").Decoder

X_TRANSFORMERS_VERSION = "2.31.10"  # the version these mappings were checked against
D, HEADS = 64, 4


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
    torch.testing.assert_close(final.weight.grad, xt.final_norm.gamma.grad, rtol=1e-10, atol=1e-12)
    for f in fs:
        for got, p in zip(grads[id(f)], f.parameters()):
            torch.testing.assert_close(got, p.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("spec", ["SandwichLN", "PeriLN", "PreLN", "LNS"])
def test_the_additive_form_the_mixes_call_is_the_checked_forward(spec):
    """A design across the stack that replaces the residual sum (AttnRes, MUDD) calls the connection's additive form
    y = x + branch_output(F(branch_input(x))) on its own inputs: with every norm randomised, that form is the
    forward compared with x-transformers above (Sandwich-LN's output norm, not its input norm, on F)."""
    conn = skiplab.connection(spec, D).double()
    randomise(conn, seed=5)
    (f,) = branches(1)
    x = torch.randn(2, 7, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    torch.testing.assert_close(x + conn.branch_output(f(conn.branch_input(x))), conn(x, f), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("init", ["depth", 1e-5])
def test_layerscale_option_is_layerscale(init):
    layers = 2
    value = 0.1 if init == "depth" else init  # CaiT's rule: 0.1 up to 18 layers
    xt = Decoder(dim=D, depth=layers, heads=HEADS, use_layerscale=True, layerscale_init_value=value).double()
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
    x = torch.randn(2, 7, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    h = x
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
    pairs = [(x.grad, x_ref.grad), (final.weight.grad, xt.final_norm.gamma.grad)]
    for conn, (norms, block, _) in zip(ours, xt.layers):
        pairs += [(conn.scale.grad, block.gamma.grad), (conn.norm.weight.grad, norms[0].gamma.grad)]
    for f in fs:
        pairs += [(got, p.grad) for got, p in zip(grads[id(f)], f.parameters())]
    for got, want in pairs:
        assert want.abs().max() > 1e-6  # a gradient to compare
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


class Mix(nn.Module):
    """x-transformers' value-residual mix of one attention (its ``to_value_residual_mix``, ``always(0.5)`` without
    ``learned_value_residual_mix``) as one scalar parameter: its ``V_1.lerp(V_l, mix)`` weighs V_l by ``mix``, so
    mix = 1 − λ, and a learned λ_l (skiplab's ``learn=yes``) is a learned mix_l whose gradient is −λ_l's."""

    def __init__(self, mix: float):
        super().__init__()
        self.mix = nn.Parameter(torch.tensor(mix, dtype=torch.float64))

    def forward(self, x):
        return self.mix


def compare_value_residual(lams: list[float], learn: bool) -> None:
    """x-transformers' decoder with ``add_value_residual`` (its own attention, layer l ≥ 2 mixing with weight
    ``lams[l - 2]`` on V_1) against skiplab's ``PreLN+ValueRes`` with those λ and x-transformers' attention
    weights copied: outputs and gradients (the input, every attention and feed-forward weight, the norms, and
    with ``learn`` each λ_l)."""
    layers = len(lams) + 1
    xt = Decoder(dim=D, depth=layers, heads=HEADS, attn_dim_head=D // HEADS, add_value_residual=True,
                 learned_value_residual_mix=False).double()
    randomise(xt)
    ffns = branches(layers)
    attn_blocks = [block for (_, block, _), kind in zip(xt.layers, xt.layer_types) if kind == "a"]
    attns = []
    for j, block in enumerate(attn_blocks):  # x-transformers' attention, its weights copied into skiplab's
        if j >= 1:  # the first attention has no value residual
            block.to_value_residual_mix = Mix(1 - lams[j - 1])
        block.attend.attn_fn = partial(F.softmax, dim=-1)  # its softmax in float64, not float32 (attend.py)
        attn = SelfAttention(D, HEADS, bias=False).double()
        with torch.no_grad():
            attn.qkv_proj.weight.copy_(torch.cat([block.to_q.weight, block.to_k.weight, block.to_v.weight]))
            attn.out_proj.weight.copy_(block.to_out.weight)
        attns.append(attn)
    ffns_ref = [copy.deepcopy(f) for f in ffns]  # each side's own copy: its own gradients
    for i, kind in enumerate(xt.layer_types):
        if kind == "f":
            norms, _, residual = xt.layers[i]
            xt.layers[i] = nn.ModuleList([norms, Branch(ffns_ref[i // 2], attention=False), residual])
    spec = f"PreLN+ValueRes(lambda={lams[0]},learn={'yes' if learn else 'no'})"
    ours = conns(spec, layers)
    across = Across(spec, layers).double()
    if learn:
        with torch.no_grad():
            across.designs[0].lam.copy_(torch.tensor(lams, dtype=torch.float64))
    assert across.designs[0].lam.tolist() == pytest.approx(lams, rel=1e-15)
    final = skiplab.final_norm(spec, D, layers=layers).double()
    for conn, (norms, _, _) in zip(ours, xt.layers):
        load_norm(conn.norm, norms[0])
    load_norm(final, xt.final_norm)
    x = torch.randn(2, 7, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    run, h = across.start(), x
    for i in range(layers):
        h = run.enter(i, h)
        h = ours[2 * i](h, lambda t: attns[i](t, causal=True, values=run.values(i)))
        h = ours[2 * i + 1](h, ffns[i])
        run.leave(i, h)
    y, y_ref = final(h), xt(x_ref)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(4), dtype=y.dtype)
    (y * w).sum().backward(), (y_ref * w).sum().backward()
    pairs = [(x.grad, x_ref.grad), (final.weight.grad, xt.final_norm.gamma.grad)]
    for attn, block in zip(attns, attn_blocks):
        want = torch.cat([block.to_q.weight.grad, block.to_k.weight.grad, block.to_v.weight.grad])
        pairs += [(attn.qkv_proj.weight.grad, want), (attn.out_proj.weight.grad, block.to_out.weight.grad)]
    for f, f_ref in zip(ffns, ffns_ref):
        pairs += [(p.grad, q.grad) for p, q in zip(f.parameters(), f_ref.parameters())]
    for conn, (norms, _, _) in zip(ours, xt.layers):
        pairs.append((conn.norm.weight.grad, norms[0].gamma.grad))
    if learn:  # dλ_l = −d mix_l
        pairs.append((across.designs[0].lam.grad, -torch.stack([b.to_value_residual_mix.mix.grad
                                                                for b in attn_blocks[1:]])))
    for got, want in pairs:
        assert want.abs().max() > 1e-6  # a gradient to compare
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


LAMS = [0.5, 0.5]  # the paper's λ, fixed
# λ in (0, 1), float32 numbers: the spec's λ is held in the stack's float32 buffer before the model is made float64
RANDOM_LAMS = torch.rand(3, generator=torch.Generator().manual_seed(11)).tolist()


@pytest.mark.parametrize("lams,learn", [(LAMS, False), (RANDOM_LAMS[:1] * 3, False), (RANDOM_LAMS, True)],
                         ids=["lambda=0.5", "random lambda", "learn=yes, a random lambda per layer"])
def test_value_residual_gives_x_transformers_outputs_and_gradients(lams, learn):
    compare_value_residual(lams, learn)


# --- each comparison fails when the design is mutated ---------------------------------------------------------------

def test_the_comparisons_fail_when_a_constant_of_the_design_is_mutated(monkeypatch):
    """Sandwich-LN with its norms' ε 1e-3 (for 1e-5), LayerScale with CaiT's depth rule giving 0.101 (for 0.1), the
    value residual with λ and 1 − λ swapped (V' = (1 − λ) V_1 + λ V_l): each comparison fails. The last one is
    invisible at λ = 0.5: the reason the value residual is compared at a random λ."""
    with monkeypatch.context() as m:
        m.setattr(norms, "EPS", 1e-3)
        with pytest.raises(AssertionError):
            test_sandwich_norm_is_sandwich_ln()
    with monkeypatch.context() as m:
        m.setattr(scaled, "layerscale_init", lambda depth: 0.101)
        with pytest.raises(AssertionError):
            test_layerscale_option_is_layerscale("depth")

    def swapped(self, i, v, state):
        if i == 0:
            state["v1"] = v
            return v
        return torch.lerp(state["v1"], v, self.lam[i - 1].to(v.dtype))

    with monkeypatch.context() as m:
        m.setattr(across_mod.ValueRes, "values", swapped)
        for lams, learn in ((RANDOM_LAMS[:1] * 3, False), (RANDOM_LAMS, True)):
            with pytest.raises(AssertionError):
                compare_value_residual(lams, learn)
        compare_value_residual(LAMS, False)  # λ = 1 − λ: the mutation passes unseen
