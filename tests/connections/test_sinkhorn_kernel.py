"""mHC's Sinkhorn–Knopp kernel equals its formula (by hand, and the eager unrolled iterations), forward and backward,
for every n it takes and position counts that leave a short last group; mHC runs it where its kernels run."""

import pytest
import torch

from skiplab.connections import hyper
from skiplab.connections.kernels import load
from skiplab.connections.kernels import sinkhorn as skk
from tests.connections.kernel_checks import hyper_case, mutated, ran

needs_kernel = pytest.mark.skipif(load("sinkhorn") is None, reason="no C compiler on this machine")


def logits(*shape, dtype=torch.float64, seed=0, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()


def both(fn, l, g):
    y = fn(l)
    return (y, *torch.autograd.grad(y, l, g))


@needs_kernel
def test_one_iteration_by_hand():
    """2 × 2, one iteration: columns then rows of exp(l − max l) normalised; ∂l through both half-steps by hand."""
    l = torch.tensor([[[0.3, -1.2], [0.8, 0.1]]], dtype=torch.float64, requires_grad=True)
    m = torch.exp(l.detach() - l.detach().max())
    c = m / m.sum(-2, keepdim=True)
    r = c / c.sum(-1, keepdim=True)
    y = skk.sinkhorn(l, 1)
    torch.testing.assert_close(y, r, rtol=1e-15, atol=1e-15)
    g = torch.tensor([[[1.0, -2.0], [0.5, 3.0]]], dtype=torch.float64)
    (dl,) = torch.autograd.grad(y, l, g)
    gc = (g - (g * r).sum(-1, keepdim=True)) / c.sum(-1, keepdim=True)  # through the rows' step
    gm = (gc - (gc * c).sum(-2, keepdim=True)) / m.sum(-2, keepdim=True)  # through the columns' step
    torch.testing.assert_close(dl, gm * m, rtol=1e-14, atol=1e-14)


@needs_kernel
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-13), (torch.float32, 3e-6)])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("lead,iters", [((37,), 20), ((3, 5), 1), ((2, 17), 0), ((1,), 7)])
def test_the_kernel_equals_the_eager_iterations_outputs_and_gradients(dtype, tol, n, lead, iters):
    l = logits(*lead, n, n, dtype=dtype)
    g = torch.randn(*lead, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(dtype)
    got = both(lambda t: skk.sinkhorn(t, iters), l, g)
    want = both(lambda t: hyper.sinkhorn(t, iters), l, g)  # the eager _Sinkhorn
    for u, w in zip(got, want):
        torch.testing.assert_close(u, w, rtol=tol, atol=tol)
    if iters:
        torch.testing.assert_close(got[0].sum(-1), torch.ones(*lead, n, dtype=dtype), rtol=tol, atol=tol)


@needs_kernel
def test_the_kernel_passes_gradcheck():
    l = logits(3, 4, 4)
    assert torch.autograd.gradcheck(lambda t: skk.sinkhorn(t, 5), (l,))
    assert torch.autograd.gradcheck(lambda t: skk.sinkhorn(t, 2), (logits(19, 3, 3),))


@needs_kernel
def test_a_thread_count_gives_the_same_bits():
    """Each group of positions is computed alone, so 1 and 2 threads give the same bits."""
    l = logits(70, 4, 4, dtype=torch.float32)
    g = torch.randn(70, 4, 4)
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(both(lambda t: skk.sinkhorn(t, 20), l, g))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(u, w) for u, w in zip(*runs))


@needs_kernel
def test_usable_only_where_it_can_run_and_bad_calls_are_refused():
    l = torch.randn(5, 4, 4)
    assert skk.usable(l) and skk.usable(l.double()) and skk.usable(torch.randn(8, 8))
    assert not skk.usable(l.bfloat16())
    assert not skk.usable(torch.randn(5, 4, 3))
    assert not skk.usable(torch.randn(2, 9, 9))  # past MAX_N
    assert not skk.usable(l[:0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not skk.usable(l)
    with pytest.raises(ValueError, match="iters = -1"):
        skk.sinkhorn(l, -1)


@needs_kernel
@pytest.mark.parametrize("mutation", [
    ("for (int b = 1; b < n; b++) sum += m[first + b * stride];",
     "for (int b = 2; b < n; b++) sum += m[first + b * stride];"),             # a sum missing its second term
    ("(g[first + b * stride] - dot) * inv", "g[first + b * stride] * inv"),     # the backward without its sum
    ("half_step(y, ss + h * n, (int)(h % 2), n, divide, bad);",
     "half_step(y, ss + h * n, 0, n, divide, bad);"),                          # backward: columns only
    ("lane[l] = src[(p0 + (l < count ? l : 0)) * nn + e];", "lane[l] = src[(p0 + (l < count ? 0 : 0)) * nn + e];"),
])
def test_the_comparison_fails_for_a_mutated_kernel(mutation, monkeypatch, tmp_path):
    """The oracle can fail: each mutation of the C source (a sum short of a term, the backward's subtraction
    dropped, the backward's recomputed forward normalising columns only, every lane of a group reading its first
    position), built and run in its place, is caught."""
    lib = mutated("sinkhorn", skk.SIGNATURES, *mutation, tmp_path, native=True)
    monkeypatch.setattr(skk, "_kernel", lambda: lib)
    l = logits(37, 4, 4)
    g = torch.randn(37, 4, 4, dtype=torch.float64)
    got = both(lambda t: skk.sinkhorn(t, 3), l, g)
    want = both(lambda t: hyper.sinkhorn(t, 3), l, g)
    assert not all(torch.allclose(u, w) for u, w in zip(got, want))


def underflowing(dtype):
    """Logits whose exponentials underflow: position 0 has a column whose sum is subnormal (its reciprocal
    overflows), position 1 one whose every entry is 0 (0/0 in the formula itself), position 2 is ordinary."""
    far = 95.0 if dtype == torch.float32 else 720.0  # exp(-far) subnormal
    gone = 120.0 if dtype == torch.float32 else 760.0  # exp(-gone) = 0
    rows = [[[0.0, -far], [-far, -far]], [[0.0, -gone], [-gone, -gone]], [[0.3, -1.2], [0.8, 0.1]]]
    return torch.tensor(rows, dtype=dtype).repeat(7, 1, 1).requires_grad_()  # 21 positions: every lane of a group


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sums_that_underflow_give_what_the_eager_iterations_give(dtype):
    """Where a column's sum is subnormal the kernel's 1/s overflowed and 0 · ∞ made NaN where the eager quotient
    is finite: the kernel now divides there, so it gives the eager form's values (finite for position 0, NaN
    where the eager form's 0/0 is), and the ordinary positions sharing its lanes are untouched."""
    l = underflowing(dtype)
    g = torch.randn(l.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
    got = both(lambda t: skk.sinkhorn(t, 20), l, g)
    want = both(lambda t: hyper.sinkhorn(t, 20), l, g)
    for u, w in zip(got, want):
        torch.testing.assert_close(u, w, rtol=1e-5, atol=0, equal_nan=True)
    assert torch.isfinite(got[0][0::3]).all() and got[0][1::3].isnan().any()
    torch.testing.assert_close(got[0][2::3], want[0][2::3])


@needs_kernel
def test_the_underflow_comparison_fails_without_the_division_fallback(monkeypatch, tmp_path):
    """The check above can fail: with the overflow check dropped, the kernel gives NaN at position 0."""
    lib = mutated("sinkhorn", skk.SIGNATURES, "static inline int overflowed(vreal bad) { return vsum(bad) != 0; }",
                  "static inline int overflowed(vreal bad) { return 0 * vsum(bad) > 1; }", tmp_path, native=True)
    monkeypatch.setattr(skk, "_kernel", lambda: lib)
    assert skk.sinkhorn(underflowing(torch.float32), 20)[0].isnan().any()


@needs_kernel
def test_the_generic_build_equals_the_eager_iterations_too(monkeypatch, tmp_path):
    """Built without -march=native (32-byte vectors: an AVX2 machine's lanes)."""
    lib = mutated("sinkhorn", skk.SIGNATURES, "", "", tmp_path)
    monkeypatch.setattr(skk, "_kernel", lambda: lib)
    for n, count in ((4, 13), (3, 9)):
        l = logits(count, n, n)
        g = torch.randn(count, n, n, dtype=torch.float64)
        for u, w in zip(both(lambda t: skk.sinkhorn(t, 20), l, g), both(lambda t: hyper.sinkhorn(t, 20), l, g)):
            torch.testing.assert_close(u, w, rtol=1e-13, atol=1e-13)


@needs_kernel
@pytest.mark.parametrize("spec", ["mHC", "mHC(n=2)"])
def test_mhc_runs_it_where_its_kernels_run_and_equals_its_eager_form(spec):
    conn, layer, params, x, dy = hyper_case(spec)
    y = conn(x, layer)
    assert ran(y, "_SinkhornKernelBackward")
    got = (y, *torch.autograd.grad(y, [x, *params], dy))
    conn.kernel = None
    y_ref = conn(x, layer)
    assert not ran(y_ref, "_SinkhornKernelBackward") and ran(y_ref, "_SinkhornBackward")
    want = (y_ref, *torch.autograd.grad(y_ref, [x, *params], dy))
    for u, w in zip(got, want):
        torch.testing.assert_close(u, w)
    conn.kernel = "stream_mix"
    conn.sinkhorn_kernel = False  # the iterations as operators, the other kernels on
    y_ops = conn(x, layer)
    assert ran(y_ops, "_SinkhornBackward") and ran(y_ops, "_NormProjectKernelBackward")
    assert not ran(y_ops, "_SinkhornKernelBackward")
    torch.testing.assert_close(y_ops, got[0])
    conn.sinkhorn_kernel = True
    conn.float(), layer.float()
    assert ran(conn(x.float(), layer), "_SinkhornKernelBackward")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not ran(conn(x.float(), layer), "_SinkhornKernelBackward")
