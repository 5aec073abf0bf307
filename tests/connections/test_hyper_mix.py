"""Hyper-connections' fused stream read, write and normalised projection (skiplab.connections.hyper_mix) against the
plain autograd expressions they replace: values and gradients, the shared gradient buffer of the read and the
projection, the expressions ``torch.compile`` traces instead, autocast, and the parameters checkpoints hold."""

import pytest
import torch
import torch.nn.functional as F

import skiplab
from skiplab import Place
from skiplab.connections import hyper_mix
from skiplab.connections.hyper import sinkhorn
from skiplab.models import GPT, GPTConfig
from tests.conftest import make_branch

P, N, D = 7, 3, 5


def gen(seed):
    return torch.Generator().manual_seed(seed)


def leaf(*shape, seed=0, scale=1.0, shift=0.0):
    return (torch.randn(*shape, generator=gen(seed), dtype=torch.float64) * scale + shift).requires_grad_()


def grads(out, inputs, seed=9):
    outs = out if isinstance(out, tuple) else (out,)
    total = sum((o * torch.randn(o.shape, generator=gen(seed + i), dtype=o.dtype)).sum() for i, o in enumerate(outs))
    return torch.autograd.grad(total, inputs, allow_unused=True)


def plain_project(x, v, centre, eps):
    h = x - x.mean(-1, keepdim=True) if centre else x
    return F.linear(h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps), v)


@pytest.mark.parametrize("static", [False, True])
def test_read_and_write_are_the_broadcast_products(static):
    x, f = leaf(P, N, D, shift=0.3), leaf(P, D, seed=1)
    w = leaf(N + 1, N, seed=2) if static else leaf(P, N + 1, N, seed=2)
    b = leaf(N, seed=3) if static else leaf(P, N, seed=3)

    def fused():
        h0, kept = hyper_mix.read(x, w)
        return h0, hyper_mix.write(kept, f, b)

    def plain():
        mix = (w.unsqueeze(-1) * x.unsqueeze(-3)).sum(-2)
        return mix[:, 0], mix[:, 1:] + b.unsqueeze(-1) * f.unsqueeze(-2)

    got, want = fused(), plain()
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)
    for g, e in zip(grads(got, (x, w, f, b)), grads(want, (x, w, f, b))):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda *a: hyper_mix.write(hyper_mix.read(*a[:2])[1], *a[2:]), (x, w, f, b))


def test_the_layer_input_is_written_out_once():
    """h₀ leaves the read contiguous: a strided view of the product was copied by the layer's norm in its forward and
    again in its backward (one copy of the layer's input where there were two, counted by the profiler)."""
    x, w = leaf(P, N, D), leaf(P, N + 1, N, seed=1)
    h0, kept = hyper_mix.read(x, w)
    assert h0.is_contiguous() and h0.shape == (P, D) and kept.shape == (P, N, D)
    norm = torch.nn.LayerNorm(D).double()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        h0, _ = hyper_mix.read(x, w)
        norm(h0).backward(torch.randn(P, D, generator=gen(2), dtype=torch.float64))
    copies = [e for e in prof.events() if e.name == "aten::copy_" and e.input_shapes and list(e.input_shapes[0]) == [P, D]]
    assert len(copies) == 1


def test_the_last_layers_expanded_gradient_is_handled():
    """The streams' sum hands the last layer an expanded (stride-0) gradient."""
    x, w, f, b = leaf(P, N, D), leaf(P, N + 1, N, seed=1), leaf(P, D, seed=2), leaf(P, N, seed=3)
    h0, kept = hyper_mix.read(x, w)
    out = hyper_mix.write(kept, f + h0, b)
    g = torch.randn(P, 1, D, generator=gen(4), dtype=torch.float64).expand(P, N, D)
    got = torch.autograd.grad(out, (x, w, f, b), g)
    mix = (w.unsqueeze(-1) * x.unsqueeze(-3)).sum(-2)
    ref = mix[:, 1:] + b.unsqueeze(-1) * (f + mix[:, 0]).unsqueeze(-2)
    for a, e in zip(got, torch.autograd.grad(ref, (x, w, f, b), g)):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("centre", [True, False])
def test_norm_project_is_the_normalised_rows_projected(centre):
    x = leaf(P * N, D, shift=2.0, scale=1.5)  # off-centre rows: μ matters
    v = leaf(4, D, seed=1)
    got, want = hyper_mix.norm_project(x, v, centre, 1e-5), plain_project(x, v, centre, 1e-5)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for a, e in zip(grads(got, (x, v)), grads(want, (x, v))):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b: hyper_mix.norm_project(a, b, centre, 1e-5), (x, v))


def _composite(x, v, slot):
    """A sub-layer's use of the two: the coefficients from the projection of the streams, then the read."""
    t = hyper_mix.norm_project(x.view(P * N, D), v, True, 1e-5, slot).view(P, N, N + 1)
    h0, kept = hyper_mix.read(x, torch.tanh(t).mT.contiguous(), slot)
    return h0.sin().sum() + (kept * kept).sum()


def test_the_read_and_the_projection_add_into_one_gradient():
    x, v = leaf(P, N, D, shift=0.5), leaf(N + 1, D, seed=1)
    got = torch.autograd.grad(_composite(x, v, hyper_mix.GradSlot()), (x, v))
    want = torch.autograd.grad(_composite(x, v, None), (x, v))
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b: _composite(a, b, hyper_mix.GradSlot()), (x, v))
    # the projection's weights alone, twice over one graph: the buffer is handed on, not kept
    slot = hyper_mix.GradSlot()
    y = _composite(x, v, slot)
    first, = torch.autograd.grad(y, (v,), retain_graph=True)
    again = torch.autograd.grad(y, (x, v))
    torch.testing.assert_close(first, want[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(again[0], want[0], rtol=1e-12, atol=1e-12)
    assert slot.grad is None


@pytest.mark.parametrize("spec", ["HC", "HC+RMS(n=2,tanh=no)", "HC(kind=static)", "mHC", "mHC+RMS(n=3,iters=4)"])
def test_a_connection_gradient_against_finite_differences(spec):
    torch.manual_seed(0)
    conn = skiplab.connection(spec, D, place=Place(2, "encoder", 4)).double()
    with torch.no_grad():
        for p in conn.parameters():
            p.add_(0.3 * torch.randn_like(p))
    branch = make_branch("seq", D).double()
    n = conn.n
    x = leaf(1, 2, n, D, shift=0.4)
    assert torch.autograd.gradcheck(lambda h: conn(h, branch), (x,))
    params = dict(conn.named_parameters())
    call = lambda *ps: torch.func.functional_call(conn, dict(zip(params, ps)), (x.detach(), branch))  # noqa: E731
    assert torch.autograd.gradcheck(call, tuple(p.detach().requires_grad_() for p in params.values()), fast_mode=True)


def test_the_traced_expressions_are_the_same_functions(monkeypatch):
    """Under torch.compile the functions are plain broadcast expressions (compiling is simulated here)."""
    x, w, f, b = leaf(P, N, D), leaf(P, N + 1, N, seed=1), leaf(P, D, seed=2), leaf(P, N, seed=3)
    v, logits = leaf(N + 1, D, seed=4), leaf(P, N, N, seed=5)

    def run():
        h0, kept = hyper_mix.read(x, w)
        out = hyper_mix.write(kept, f, b)
        proj = [hyper_mix.norm_project(x.view(-1, D), v, c, 1e-5) for c in (True, False)]
        return (h0, out, *proj, sinkhorn(logits, 7))

    eager = run()
    g_eager = grads(eager, (x, w, f, b, v, logits))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    traced = run()
    for a, e in zip(traced, eager):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)
    for a, e in zip(grads(traced, (x, w, f, b, v, logits)), g_eager):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("spec", ["HC", "mHC"])
def test_a_compiled_model_gives_the_eager_outputs_and_gradients(spec):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, d_model=8, heads=2, layers=2, ffn_dim=16, context=6, connection=spec))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "conn" in name:
                p.add_(0.2 * torch.randn_like(p))
    tokens = torch.randint(0, 20, (2, 6), generator=gen(1))
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    outs = []
    for run in (model, compiled):
        model.zero_grad()
        y = run(tokens)
        (y * torch.randn(y.shape, generator=gen(2))).sum().backward()
        outs.append((y.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-6)
    for a, e in zip(outs[1][1], outs[0][1]):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("spec", ["HC", "HC(kind=static)", "mHC"])
def test_under_autocast_the_streams_stay_in_their_dtype(spec):
    conn = skiplab.connection(spec, 8)
    branch = torch.nn.Linear(8, 8)
    x = torch.randn(2, 3, conn.n, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conn(x, branch)
    assert y.dtype == torch.float32
    y.sum().backward()
    assert x.grad.dtype == torch.float32 and torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in conn.parameters())


def test_checkpoints_keep_their_parameters():
    """The fused forms changed no parameter: names and shapes as runs trained before saved them."""
    hc = {k: tuple(v.shape) for k, v in skiplab.connection("HC", 16).state_dict().items()}
    assert hc == {"norm.weight": (16,), "norm.bias": (16,), "a_m": (4,), "a_r": (4, 4), "b": (4,),
                  "stream_norm.weight": (16,), "stream_norm.bias": (16,), "w_m": (16,), "w_r": (16, 4), "w_b": (16,),
                  "s_alpha": (), "s_beta": ()}
    mhc = {k: tuple(v.shape) for k, v in skiplab.connection("mHC", 16).state_dict().items()}
    assert mhc == {"norm.weight": (16,), "norm.bias": (16,), "phi": (64, 24), "alpha": (3,), "b_pre": (4,),
                   "b_post": (4,), "b_res": (4, 4)}


@pytest.mark.parametrize("spec", ["HC", "mHC"])
def test_activation_checkpointing_gives_the_same_gradients(spec):
    """A recomputed layer (GPT.checkpointing) builds its own read and projection, each with its own gradient buffer."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, d_model=8, heads=2, layers=2, ffn_dim=16, context=6, connection=spec))
    tokens = torch.randint(0, 20, (2, 6), generator=gen(1))
    got = []
    for recompute in (False, True):
        model.checkpointing = recompute
        model.zero_grad()
        y = model(tokens)
        (y * torch.randn(y.shape, generator=gen(2))).sum().backward()
        got.append([p.grad.clone() for p in model.parameters()])
    for a, e in zip(*got):
        torch.testing.assert_close(a, e, rtol=0, atol=0)
