"""The streams' norm-and-projection kernel equals its formula (by hand, and hyper_mix's eager form), forward and
backward, with and without the read's part of ∂x to add onto; HC and mHC run it where their kernels run."""

import math

import pytest
import torch

from skiplab.connections import hyper_mix
from skiplab.connections.kernels import load
from skiplab.connections.kernels import norm_project as npk
from skiplab.connections.kernels import stream_mix as sm
from tests.connections.kernel_checks import hyper_case, mutated, ran

needs_kernel = pytest.mark.skipif(load("norm_project") is None, reason="no C compiler on this machine")


def rows(r, f, k, dtype=torch.float64, seed=0, mean=0.0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    x = (mean + spread * torch.randn(r, f, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()
    v = torch.randn(k, f, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    return x, v


def by_hand(x, v, centre, eps):
    mu = x.mean(-1, keepdim=True) if centre else torch.zeros_like(x[:, :1])
    var = (x - mu).square().mean(-1, keepdim=True)
    return ((x - mu) / torch.sqrt(var + eps)) @ v.t()


def run(fn, x, v, centre, eps, g, acc):
    """t and (∂x, ∂V) of ``fn`` with ``acc`` (or None) as the read's part of ∂x in a GradSlot."""
    slot = hyper_mix.GradSlot()
    slot.grad = None if acc is None else acc.clone()
    t = fn(x, v, centre, eps, slot)
    return (t, *torch.autograd.grad(t, (x, v), g))


@needs_kernel
def test_a_row_by_hand():
    x = torch.tensor([[1.0, 3.0]], dtype=torch.float64, requires_grad=True)
    v = torch.eye(2, dtype=torch.float64, requires_grad=True)
    eps = 1e-5
    r = 1 / math.sqrt(1 + eps)  # LayerNorm: mean 2, variance 1
    torch.testing.assert_close(npk.norm_project(x, v, True, eps), torch.tensor([[-r, r]], dtype=torch.float64))
    r = 1 / math.sqrt(5 + eps)  # RMSNorm: mean square 5
    torch.testing.assert_close(npk.norm_project(x, v, False, eps), torch.tensor([[r, 3 * r]], dtype=torch.float64))
    # ∂: t = N(x) for V = I; with g = (1, 0) under RMSNorm, ∂x = r e₁ − r³ x₁ x / F
    dx, dv = torch.autograd.grad(npk.norm_project(x, v, False, eps), (x, v), torch.tensor([[1.0, 0.0]],
                                                                                          dtype=torch.float64))
    torch.testing.assert_close(dx, torch.tensor([[r - r**3 * 1 / 2, -(r**3) * 3 / 2]], dtype=torch.float64))
    torch.testing.assert_close(dv, torch.tensor([[r, 3 * r], [0.0, 0.0]], dtype=torch.float64))


@needs_kernel
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-11), (torch.float32, 2e-5)])
@pytest.mark.parametrize("r,f,k", [(13, 37, 6), (8, 64, 1), (3, 5, 24), (17, 700, 7), (1, 3, 2), (9, 1100, 3)])
@pytest.mark.parametrize("centre", [True, False])
@pytest.mark.parametrize("handed", [False, True])
def test_the_kernel_equals_the_formula_outputs_and_gradients(dtype, tol, r, f, k, centre, handed):
    x, v = rows(r, f, k, dtype, mean=0.5, spread=2.0)
    g = torch.randn(r, k, dtype=dtype)
    acc = torch.randn(r, f, dtype=dtype) if handed else None
    got = run(npk.norm_project, x, v, centre, 1e-5, g, acc)
    want = run(hyper_mix.norm_project, x, v, centre, 1e-5, g, acc)
    t_hand = by_hand(x.double(), v.double(), centre, 1e-5)
    for u, w in zip(got, want):
        torch.testing.assert_close(u, w, rtol=tol, atol=tol)
    torch.testing.assert_close(got[0].double(), t_hand, rtol=tol, atol=tol)


def with_read_term(fn, x, v, centre, g, acc, a, g0):
    """t, ∂x and ∂V of ``fn`` where the read of the same streams left its term a_i ∂h₀ in the slot (the kernel adds
    it; for the eager form it is added here, by hand, onto the read's part it would have handed over)."""
    p, n = a.shape
    slot = hyper_mix.GradSlot()
    if fn is npk.norm_project:
        slot.grad = None if acc is None else acc.clone()
        slot.read = a, g0
    else:  # by hand: stream i of position p gets a[p, i] ∂h₀[p], in either layout of the rows
        term = (a.unsqueeze(-1) * g0.unsqueeze(1)).reshape(x.shape)
        slot.grad = term if acc is None else acc + term
    t = fn(x, v, centre, 1e-5, slot)
    out = (t, *torch.autograd.grad(t, (x, v), g))
    assert slot.read is None and slot.grad is None  # consumed
    return out


@needs_kernel
@pytest.mark.parametrize("layout", ["stream", "position"])  # HC's rows (a stream each), mHC's (a position each)
@pytest.mark.parametrize("handed", [False, True])
def test_the_read_term_left_by_the_read_is_added(layout, handed):
    p, n, d = 5, 3, 37
    x, v = rows(p * n, d, 6) if layout == "stream" else rows(p, n * d, 6)
    g = torch.randn(x.shape[0], 6, dtype=torch.float64)
    acc = torch.randn(x.shape, dtype=torch.float64) if handed else None
    a, g0 = torch.randn(p, n, dtype=torch.float64), torch.randn(p, d, dtype=torch.float64)
    got = with_read_term(npk.norm_project, x, v, True, g, acc, a, g0)
    want = with_read_term(hyper_mix.norm_project, x, v, True, g, acc, a, g0)
    for u, w in zip(got, want):
        torch.testing.assert_close(u, w)


@needs_kernel
def test_the_kernel_passes_gradcheck():
    for centre in (True, False):
        x, v = rows(11, 19, 5)
        assert torch.autograd.gradcheck(lambda a, b: npk.norm_project(a, b, centre, 1e-5), (x, v))


@needs_kernel
def test_float32_is_as_accurate_as_the_eager_form_where_the_mean_dwarfs_the_spread():
    x, v = rows(16, 768, 6, mean=1e4, spread=1.0)
    want = by_hand(x, v, True, 1e-5)
    x32, v32 = x.detach().float(), v.detach().float()
    err_kernel = (npk.norm_project(x32, v32, True, 1e-5).double() - want).abs().max()
    err_eager = (hyper_mix.norm_project(x32, v32, True, 1e-5).double() - want).abs().max()
    assert err_kernel <= max(err_eager, 1e-3 * want.abs().max())


@needs_kernel
def test_a_thread_count_gives_one_result_and_thread_counts_agree():
    x, v = rows(203, 96, 6, torch.float32)
    g = torch.randn(203, 6, generator=torch.Generator().manual_seed(1))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        a, b = run(npk.norm_project, x, v, True, 1e-5, g, None), run(npk.norm_project, x, v, True, 1e-5, g, None)
        torch.set_num_threads(1)
        c = run(npk.norm_project, x, v, True, 1e-5, g, None)
    finally:
        torch.set_num_threads(threads)
    for u, w, z in zip(a, b, c):
        assert torch.equal(u, w)
        torch.testing.assert_close(u, z, rtol=1e-5, atol=1e-5)  # ∂V's sums in another order


def test_usable_only_where_it_can_run():
    x, v = torch.randn(4, 8), torch.randn(3, 8)
    if load("norm_project") is None:
        assert not npk.usable(x, v)
        return
    assert npk.usable(x, v) and npk.usable(x.double(), v.double())
    assert not npk.usable(x.bfloat16(), v.bfloat16())
    assert not npk.usable(x, v.double())
    assert not npk.usable(x, torch.randn(3, 7))
    assert not npk.usable(x[:0], v)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not npk.usable(x, v)


@needs_kernel
@pytest.mark.parametrize("mutation", [
    ("beta[i] = centre ? (REAL)((-gv - a * (double)mu[row] * (double)f) / (double)f) : 0;", "beta[i] = 0;"),
    ("o[i] = alpha[i] * vload(xr[i] + c) + beta[i];", "o[i] = beta[i] + 0 * vload(xr[i] + c);"),
    ("xm[i] = vload(xr[i] + c) - m[i];", "xm[i] = vload(xr[i] + c);"),
    ("for (int64_t c = cv > c0 ? cv : c0; c < c1; c++)", "for (int64_t c = c1; c < c1; c++)"),
    ("b[i] += xi * w1;", "b[i] += xi * w0;"),
    ("const REAL c = ra[pos * n + (row % per) * seg + s];", "const REAL c = ra[pos * n + s];"),
    ("for (int64_t i = 0; i < RB; i++) out[i] = base + (i < rows ? i : 0) * f;",
     "for (int64_t i = 0; i < RB; i++) out[i] = base + (i < rows ? 0 : 0) * f;"),
])
def test_the_comparison_fails_for_a_mutated_kernel(mutation, monkeypatch, tmp_path):
    """The oracle can fail: each mutation of the C source (β dropped, α x dropped, ∂V without the centring, the
    forward's last F mod VL columns skipped, the second of a pair of V's rows read as the first, the read's term
    from each position's first stream, every row of a block read as its first), built and run in its place, is
    caught (the read's term in both layouts of the rows)."""
    lib = mutated("norm_project", npk.SIGNATURES, *mutation, tmp_path, native=True)
    monkeypatch.setattr(npk, "_kernel", lambda: lib)
    x, v = rows(13, 37, 6, mean=0.5)
    g = torch.randn(13, 6, dtype=torch.float64)
    got = run(npk.norm_project, x, v, True, 1e-5, g, None)
    want = run(hyper_mix.norm_project, x, v, True, 1e-5, g, None)
    same = all(torch.allclose(u, w) for u, w in zip(got, want))
    for p, n, d, shape in ((4, 3, 5, (12, 5)), (4, 3, 5, (4, 15))):  # the read's term, HC's and mHC's rows
        x, v = rows(*shape, 6)
        g = torch.randn(shape[0], 6, dtype=torch.float64)
        a, g0 = torch.randn(p, n, dtype=torch.float64), torch.randn(p, d, dtype=torch.float64)
        got = with_read_term(npk.norm_project, x, v, True, g, None, a, g0)
        want = with_read_term(hyper_mix.norm_project, x, v, True, g, None, a, g0)
        same = same and all(torch.allclose(u, w) for u, w in zip(got, want))
    assert not same


@needs_kernel
def test_the_generic_build_equals_the_formula_too(monkeypatch, tmp_path):
    """Built without -march=native (32-byte vectors, 8 rows a block: an AVX2 machine's shape of the kernel), on
    shapes with short blocks and columns past the last whole vector, with and without the read's term."""
    lib = mutated("norm_project", npk.SIGNATURES, "", "", tmp_path)  # no change: the source as it is
    monkeypatch.setattr(npk, "_kernel", lambda: lib)
    assert lib.backward_scratch_f32(1) == 8
    for (r, f, k), centre in (((13, 37, 6), True), ((17, 700, 7), False), ((3, 1100, 24), True)):
        x, v = rows(r, f, k, mean=0.5)
        g = torch.randn(r, k, dtype=torch.float64)
        for u, w in zip(run(npk.norm_project, x, v, centre, 1e-5, g, None),
                        run(hyper_mix.norm_project, x, v, centre, 1e-5, g, None)):
            torch.testing.assert_close(u, w)
    x, v = rows(12, 5, 6)
    g = torch.randn(12, 6, dtype=torch.float64)
    a, g0 = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    for u, w in zip(with_read_term(npk.norm_project, x, v, True, g, None, a, g0),
                    with_read_term(hyper_mix.norm_project, x, v, True, g, None, a, g0)):
        torch.testing.assert_close(u, w)


@needs_kernel
@pytest.mark.parametrize("spec", ["HC", "HC+RMS", "HC(tanh=no)", "mHC", "mHC(n=2)"])
def test_dynamic_connections_run_it_and_equal_their_eager_form(spec, monkeypatch):
    deferred = []  # the read's backward calls that left a_i ∂h₀ to this kernel (no ∂x buffer)
    fn = sm._fn

    def spy(name, dtype):
        kernel = fn(name, dtype)
        if name != "read_backward":
            return kernel
        return lambda *args: deferred.append(args[3] is None) or kernel(*args)

    monkeypatch.setattr(sm, "_fn", spy)
    conn, layer, params, x, dy = hyper_case(spec)
    y = conn(x, layer)
    assert ran(y, "_NormProjectKernelBackward")
    got = (y, *torch.autograd.grad(y, [x, *params], dy))
    assert deferred == [True]
    conn.kernel = None
    y_ref = conn(x, layer)
    assert not ran(y_ref, "_NormProjectKernelBackward")
    want = (y_ref, *torch.autograd.grad(y_ref, [x, *params], dy))
    for u, w in zip(got, want):
        torch.testing.assert_close(u, w)
    conn.kernel = "stream_mix"
    conn.float(), layer.float()
    assert ran(conn(x.float(), layer), "_NormProjectKernelBackward")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not ran(conn(x.float(), layer), "_NormProjectKernelBackward")
