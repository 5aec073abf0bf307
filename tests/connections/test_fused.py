"""The fused forms equal the plain formulas, forward and backward (gradcheck in float64 on small shapes),
and the norms hand back the 1/σ they divide by without changing what they compute."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import skiplab
from skiplab.connections import fused
from skiplab.connections.fused import gated_norm_sum, gated_sum, rms_norm, scaled_add
from skiplab.connections.norms import make_norm, norm_sigma, normalize
from skiplab.connections.sas import pool_features, unpool
from tests.conftest import make_branch, make_input, randomise_affine

D64 = dict(dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("gate_shapes,shape", [
    ([(4, 1, 1, 1), (4, 1, 1, 1), (4, 1, 1, 1)], (4, 3, 2, 2)),  # SAS, conv: one gate per example
    ([(2, 3, 1), (2, 3, 1)], (2, 3, 5)),                          # SAS, seq: one gate per position
    ([(4, 3, 1, 1), (4, 3, 2, 2)], (4, 3, 2, 2)),                 # per channel, and full size
    ([(2, 1, 1)], (2, 1, 5)),                                     # a length-1 axis on both sides
])
def test_gated_sum_passes_gradcheck(gate_shapes, shape):
    torch.manual_seed(0)
    pairs = [(torch.rand(g, **D64), torch.randn(shape, **D64)) for g in gate_shapes]
    flat = [x for pair in pairs for x in pair]
    fn = lambda *xs: gated_sum(*zip(xs[0::2], xs[1::2]))  # noqa: E731
    assert torch.autograd.gradcheck(fn, flat)
    torch.testing.assert_close(fn(*flat), sum(g * t for g, t in pairs))


def test_gated_sum_refuses_gates_that_do_not_broadcast_over_trailing_axes():
    t = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="leading axes"):
        gated_sum((torch.rand(1, 3, 1), t))
    with pytest.raises(ValueError, match="one shape"):
        gated_sum((torch.rand(2, 3, 1), t), (torch.rand(2, 3, 1), torch.randn(2, 3, 5)))


@pytest.mark.parametrize("norm,gate,shape", [
    (nn.GroupNorm(1, 3), (4, 1, 1, 1), (4, 3, 2, 2)),   # SAS, conv: one gate per example
    (nn.GroupNorm(1, 3), (4, 3, 1, 1), (4, 3, 2, 2)),   # the transform gate, conv: one per channel
    (nn.LayerNorm(5), (2, 3, 1), (2, 3, 5)),            # SAS, seq: one gate per position
    (nn.LayerNorm(5), (2, 3, 5), (2, 3, 5)),            # the transform gate, seq: full size
    (nn.LayerNorm(5, elementwise_affine=False), (2, 3, 1), (2, 3, 5)),
])
def test_gated_norm_sum_passes_gradcheck_and_equals_the_formula(norm, gate, shape):
    torch.manual_seed(0)
    norm = norm.double()
    randomise_affine(norm)
    params = [p.requires_grad_() for p in norm.parameters()]
    a, b, g = (torch.rand(gate, **D64) for _ in range(3))
    s, f = torch.randn(shape, **D64), torch.randn(shape, **D64)
    fn = lambda *xs: gated_norm_sum(*xs[:5], norm)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (a, s, b, f, g, *params))
    y, y_ref = fn(a, s, b, f, g), a * s + b * f + g * norm(s + f)
    torch.testing.assert_close(y, y_ref)
    dy = torch.randn_like(y)
    inputs = [a, s, b, f, g, *params]
    for got, want in zip(torch.autograd.grad(y, inputs, dy), torch.autograd.grad(y_ref, inputs, dy)):
        torch.testing.assert_close(got, want)


def test_gated_norm_sum_comparison_fails_when_the_fused_backward_drops_a_term(monkeypatch):
    """The check above can fail: with the a ⊙ dy term of ∂/∂s dropped, ∂/∂s no longer matches autograd's."""
    torch.manual_seed(0)
    norm = nn.GroupNorm(1, 3).double()
    a, b, g = (torch.rand(4, 1, 1, 1, **D64) for _ in range(3))
    s, f = torch.randn(4, 3, 2, 2, **D64), torch.randn(4, 3, 2, 2, **D64)
    real = torch.addcmul
    monkeypatch.setattr(fused.torch, "addcmul", lambda t, x, y: t.clone())
    got = torch.autograd.grad(gated_norm_sum(a, s, b, f, g, norm).sum(), s)[0]
    monkeypatch.setattr(fused.torch, "addcmul", real)
    want = torch.autograd.grad((a * s + b * f + g * norm(s + f)).sum(), s)[0]
    assert not torch.allclose(got, want)


def test_gated_norm_sum_has_the_formulas_second_derivatives():
    """Its backward, asked for a graph, is the formula's own (tests/connections/test_second_order.py over every
    design): second derivatives in every input, against finite differences."""
    norm = nn.LayerNorm(5).double()
    a, b, g = (torch.rand(2, 3, 1, **D64) for _ in range(3))
    s, f = torch.randn(2, 3, 5, **D64), torch.randn(2, 3, 5, **D64)
    assert torch.autograd.gradgradcheck(lambda *t: gated_norm_sum(t[0], t[1], t[2], t[3], t[4], norm),
                                        (a, s, b, f, g))


def test_gated_norm_sum_falls_back_to_the_formula_for_other_norms():
    torch.manual_seed(0)
    norm = make_norm("RMS", 5).double()
    a, b, g = (torch.rand(2, 3, 1, dtype=torch.float64) for _ in range(3))
    s, f = torch.randn(2, 3, 5, dtype=torch.float64), torch.randn(2, 3, 5, dtype=torch.float64)
    torch.testing.assert_close(gated_norm_sum(a, s, b, f, g, norm), a * s + b * f + g * norm(s + f))
    with pytest.raises(ValueError, match="leading axes"):
        gated_norm_sum(torch.rand(1, 3, 1, dtype=torch.float64), s, b, f, g, nn.LayerNorm(5).double())


@pytest.mark.parametrize("lam,phi", [(1.0, 1.0), (2.0, 1.0), (1.0, 0.5), (0.5, 2.0)])
def test_scaled_add_is_lambda_x_plus_phi_f(lam, phi):
    s, f = torch.randn(3, 4, **D64), torch.randn(3, 4, **D64)
    assert torch.autograd.gradcheck(lambda a, b: scaled_add(a, lam, b, phi), (s, f))
    torch.testing.assert_close(scaled_add(s, lam, f, phi), lam * s + phi * f)


def reference(conn, x, fx):
    """The plain formula of each fused design, on the connection's own parameters."""
    name = type(conn).__name__
    if name == "SelfAdaptiveScaling":
        px, pf = pool_features(x, conn.layout), pool_features(fx, conn.layout)
        a = unpool(conn.alpha(px, pf), conn.layout, x)
        b = unpool(conn.beta(px, pf), conn.layout, x)
        g = (1 - a) * (1 - b) if conn.gamma is None else unpool(conn.gamma(px, pf), conn.layout, x)
        return a * x + b * fx + g * conn.norm(x + fx)
    if name == "Highway":
        t = unpool(torch.sigmoid(conn.transform(pool_features(x, conn.layout))), conn.layout, x)
        return t * fx + (1 - t) * x
    if name == "ExpandedSkip":
        h = conn.lam * x + conn.f * fx
        return h if conn.norm is None else conn.norm(h)
    if name == "WeightedSkip":
        w = conn.weight if conn.layout == "seq" else conn.weight.view(-1, 1, 1)
        return conn.norm(w * x + fx)
    raise AssertionError(name)


@pytest.mark.parametrize("spec", ["SAS", "SAS(gamma=free)", "SAS(gate=single)", "Highway", "2xSkip",
                                  "0.5xSkip+LN(f=2)", "1xSkip(f=2)", "wSkip+LN(init=2)"])
def test_fused_connections_equal_their_formulas_forward_and_backward(spec, layout):
    conn = skiplab.connection(spec, 6, layout).double()
    randomise_affine(conn)
    branch = make_branch(layout).double()
    x = make_input(layout).detach().double().requires_grad_()
    y = conn(x, branch)
    y_ref = reference(conn, x, branch(x))
    torch.testing.assert_close(y, y_ref)
    dy = torch.randn_like(y)
    params = [x, *conn.parameters(), *branch.parameters()]
    got = torch.autograd.grad(y, params, dy, allow_unused=True)
    want = torch.autograd.grad(y_ref, params, dy, allow_unused=True)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("kind", ["LN", "RMS", "BN"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_normalize_returns_what_the_norm_computes_and_its_inverse_sigma(kind, mode, layout):
    ours, ref = make_norm(kind, 6, layout), make_norm(kind, 6, layout)
    randomise_affine(ours)
    ref.load_state_dict(ours.state_dict())
    if mode == "eval":
        for norm in (ours, ref):
            norm(make_input(layout, seed=5).detach() * 3)  # move the running statistics (BN) off their start
            norm.eval()
    h = make_input(layout)
    (y, inv_sigma), y_ref = normalize(ours, h), ref(h)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(inv_sigma, 1 / norm_sigma(ref, h))
    torch.testing.assert_close(torch.autograd.grad(y.square().sum(), h)[0],
                               torch.autograd.grad(y_ref.square().sum(), h)[0])
    for (name, a), b in zip(ours.state_dict().items(), ref.state_dict().values()):  # running stats moved alike
        torch.testing.assert_close(a, b, msg=name)


def test_normalize_follows_a_cumulative_batchnorm_and_leaves_unknown_layers_alone():
    ours, ref = nn.BatchNorm2d(6, momentum=None), nn.BatchNorm2d(6, momentum=None)
    for seed in range(3):
        h = make_input("conv", seed=seed)
        torch.testing.assert_close(normalize(ours, h)[0], ref(h))
    torch.testing.assert_close(ours.running_var, ref.running_var)
    assert int(ours.num_batches_tracked) == 3
    sync = nn.SyncBatchNorm(6).eval()  # what multi-process training swaps in: called as it is, σ recomputed
    sync.running_var.fill_(4.0)
    h = make_input("conv")
    y, inv_sigma = normalize(sync, h)
    torch.testing.assert_close(y, F.batch_norm(h, sync.running_mean, sync.running_var, sync.weight, sync.bias,
                                               eps=sync.eps))
    torch.testing.assert_close(inv_sigma, torch.full((1, 6, 1, 1), (4.0 + sync.eps) ** -0.5))
    with pytest.raises(TypeError, match="GroupNorm"):
        normalize(nn.GroupNorm(2, 6), h)  # a norm that is not affine per feature has no ratio to read


@pytest.mark.parametrize("shape,dims,wshape", [((3, 4, 6), (-1,), (6,)),            # seq: per position
                                               ((2, 3, 4, 4), (1, 2, 3), (3, 1, 1)),  # conv: per example
                                               ((5, 6), (-1,), None)])               # no gain
def test_fused_rms_norm_passes_gradcheck_and_equals_the_formula(shape, dims, wshape):
    torch.manual_seed(0)
    x = (torch.randn(shape, dtype=torch.float64) * 1.5 + 0.4).requires_grad_()
    w = None if wshape is None else torch.randn(wshape, **D64)
    fn = lambda x, w: rms_norm(x, w, dims, 1e-5)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w))
    expect = x * (x.pow(2).mean(dims, keepdim=True) + 1e-5).rsqrt() * (1 if w is None else w)
    torch.testing.assert_close(fn(x, w), expect)
    torch.testing.assert_close(rms_norm(x, w, dims, 1e-5)[1], (x.pow(2).mean(dims, keepdim=True) + 1e-5).rsqrt())


def test_rms_layers_equal_torchs_and_keep_its_state_dict():
    ours, ref = make_norm("RMS", 6, "seq"), nn.RMSNorm(6, eps=1e-5)
    randomise_affine(ours)
    ref.load_state_dict(ours.state_dict())
    h = make_input("seq")
    torch.testing.assert_close(ours(h), ref(h))
    torch.testing.assert_close(torch.autograd.grad(ours(h).sum() + ours(h).pow(2).sum(), [h, ours.weight]),
                               torch.autograd.grad(ref(h).sum() + ref(h).pow(2).sum(), [h, ref.weight]))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # computed in float32 as F.rms_norm does, given back in bf16
        low = ours(h.detach().bfloat16())
    assert low.dtype == torch.bfloat16
    # a float32 result rounded once to bfloat16: within one bfloat16 ulp, <= eps_bf16 · |x|, of float32's own
    torch.testing.assert_close(low.float(), ref(h.detach().bfloat16().float()), rtol=torch.finfo(torch.bfloat16).eps,
                               atol=0)
