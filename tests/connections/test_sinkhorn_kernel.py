"""mHC's Sinkhorn–Knopp kernel equals the projection (by hand, and the operator form), forward and backward; mHC runs
it where its kernels run and the operator form elsewhere."""

import pytest
import torch

import skiplab
from skiplab.connections.hyper import sinkhorn
from skiplab.connections.kernels import load
from skiplab.connections.kernels import sinkhorn as sk
from tests.connections.kernel_checks import mutated, ran

needs_kernel = pytest.mark.skipif(load("sinkhorn") is None, reason="no C compiler on this machine")


def by_hand(logits, iters):
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iters):
        m = m / m.sum(-2, keepdim=True)
        m = m / m.sum(-1, keepdim=True)
    return m


@needs_kernel
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize("shape", [(3, 5, 4, 4), (7, 2, 2), (4, 3, 3), (2, 1, 1), (6, 8, 8)])
@pytest.mark.parametrize("iters", [20, 1, 3])
def test_the_kernel_equals_the_projection_outputs_and_gradients(dtype, tol, shape, iters):
    g = torch.Generator().manual_seed(0)
    logits = (2 * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()
    dy = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
    got = sk.sinkhorn(logits, iters)
    got_grad = torch.autograd.grad(got, logits, dy)[0]
    for want in (sinkhorn(logits, iters), by_hand(logits, iters)):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        torch.testing.assert_close(got_grad, torch.autograd.grad(want, logits, dy)[0], rtol=tol, atol=tol)


@needs_kernel
def test_a_two_by_two_by_hand_and_gradcheck():
    # exp of [[0, log 3], [0, 0]] = [[1, 3], [1, 1]]: columns to [[1/2, 3/4], [1/2, 1/4]], then rows to
    # [[2/5, 3/5], [2/3, 1/3]]
    logits = torch.tensor([[1.0, 3.0], [1.0, 1.0]], dtype=torch.float64).log()
    torch.testing.assert_close(sk.sinkhorn(logits, 1), torch.tensor([[0.4, 0.6], [2 / 3, 1 / 3]], dtype=torch.float64))
    x = torch.randn(3, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: sk.sinkhorn(t, 5), (x,))


def test_usable_only_where_it_can_run():
    x = torch.randn(2, 4, 4)
    if load("sinkhorn") is None:
        assert not sk.usable(x)
        return
    assert sk.usable(x) and sk.usable(x.double())
    assert not sk.usable(x.bfloat16()) and not sk.usable(torch.randn(2, 4, 3)) and not sk.usable(x[:0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not sk.usable(x)


@needs_kernel
@pytest.mark.parametrize("mutation", [
    ("half_step(ys + h * nn, ys + (h + 1) * nn, ss + h * n, n, h % 2 ? n : 1, h % 2 ? 1 : n);",
     "half_step(ys + h * nn, ys + (h + 1) * nn, ss + h * n, n, h % 2 ? 1 : n, h % 2 ? n : 1);"),  # rows first
    ("g[o * os + e * es] = (g[o * os + e * es] - t) / s[o];", "g[o * os + e * es] = g[o * os + e * es] / s[o];"),
    ("dlogits[pos * nn + e] = (REAL)(g[e] * ys[e]);", "dlogits[pos * nn + e] = (REAL)g[e];"),
])
def test_the_comparison_fails_for_a_mutated_kernel(mutation, monkeypatch, tmp_path):
    """The oracle can fail: each mutation of the C source (the rows normalised before the columns, the backward
    without its projection term, ∂l without the factor M⁰), built and run in its place, is caught."""
    lib = mutated("sinkhorn", sk.SIGNATURES, *mutation, tmp_path)
    monkeypatch.setattr(sk, "_kernel", lambda: lib)
    logits = torch.randn(5, 4, 4, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(5, 4, 4, dtype=torch.float64)
    got, want = sk.sinkhorn(logits, 3), sinkhorn(logits, 3)
    same = torch.allclose(got, want) and torch.allclose(torch.autograd.grad(got, logits, dy)[0],
                                                        torch.autograd.grad(want, logits, dy)[0])
    assert not same


@needs_kernel
def test_mhc_runs_it_where_its_kernels_run():
    torch.manual_seed(0)
    conn = skiplab.connection("mHC", dim=8)
    x = torch.randn(2, 3, 4, 8)
    layer = torch.nn.Linear(8, 8)
    assert ran(conn(x, layer), "_SinkhornKernelBackward")
    conn.kernel = None
    assert not ran(conn(x, layer), "_SinkhornKernelBackward")
    conn.kernel = "stream_mix"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not ran(conn(x, layer), "_SinkhornKernelBackward")
