"""Hyper-connections' read and write kernels equal their formulas, forward and backward; the ∂x handed between
them (and to the streams' projection) is the whole gradient; HC and mHC run them only where they can run."""

import pytest
import torch
from torch import nn

import skiplab
from skiplab.connections import hyper_mix
from skiplab.connections.kernels import load
from skiplab.connections.kernels import stream_mix as sm
from tests.connections.kernel_checks import mutated, ran

needs_kernel = pytest.mark.skipif(load("stream_mix") is None, reason="no C compiler on this machine")


def tensors(p, n, d, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()  # noqa: E731
    return make(p, n, d), make(p, n), make(p, n, n), make(p, d), make(p, n)


def by_hand(x, a, m, f, b):
    h0 = torch.einsum("pi,pid->pd", a, x)
    out = torch.einsum("pji,pid->pjd", m, x) + b.unsqueeze(-1) * f.unsqueeze(1)
    return h0, out


def kernels(x, a, m, f, b, slot=None):
    h0 = sm.read(x, a, slot)
    return h0, sm.write(x, m, f, b, slot)


@needs_kernel
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("p,n,d", [(7, 4, 64), (3, 4, 37), (2, 4, 5), (3, 1, 5), (5, 2, 1), (4, 3, 33)])
@pytest.mark.parametrize("handed", [False, True])
def test_read_and_write_equal_their_formulas_outputs_and_gradients(dtype, tol, p, n, d, handed):
    x, a, m, f, b = tensors(p, n, d, dtype)
    gh, go = torch.randn(p, d, dtype=dtype), torch.randn(p, n, d, dtype=dtype)
    want = by_hand(x, a, m, f, b)
    want_grads = torch.autograd.grad(want, (x, a, m, f, b), (gh, go))
    slot = hyper_mix.GradSlot() if handed else None  # the write's ∂x handed to the read's backward, or not
    got = kernels(x, a, m, f, b, slot)  # both outputs get a gradient below: the read's backward runs after the write's
    got_grads = torch.autograd.grad(got, (x, a, m, f, b), (gh, go))
    for u, v in zip((*got, *got_grads), (*want, *want_grads)):
        torch.testing.assert_close(u, v, rtol=tol, atol=tol)
    assert slot is None or slot.grad is None  # consumed


@needs_kernel
def test_read_and_write_pass_gradcheck():
    x, a, m, f, b = tensors(3, 4, 6)
    assert torch.autograd.gradcheck(lambda *t: kernels(*t), (x, a, m, f, b))


    def handed(x, a, m, f, b):  # as HC uses the slot: F depends on h0, so the read's backward runs after the write's
        slot = hyper_mix.GradSlot()
        h0 = sm.read(x, a, slot)
        return sm.write(x, m, f * torch.tanh(h0), b, slot)

    assert torch.autograd.gradcheck(handed, (x, a, m, f, b))


@needs_kernel
def test_with_handoff_the_read_leaves_the_whole_gradient_for_the_projection():
    x, a, m, f, b = tensors(3, 4, 6)
    slot = hyper_mix.GradSlot()
    h0 = sm.read(x, a, slot, handoff=True)
    out = sm.write(x, m, f * h0, b, slot)  # F depends on h0: the read's backward runs after the write's
    (ga,) = torch.autograd.grad(out.sum(), a, retain_graph=True)
    want = torch.autograd.grad(by_hand(x, a, m, f * by_hand(x, a, m, f, b)[0], b)[1].sum(), x)[0]
    torch.testing.assert_close(slot.grad, want)  # the read's and the write's parts, waiting for the projection


@needs_kernel
def test_reaches_finds_the_read_only_where_f_depends_on_it():
    x, a, m, f, b = tensors(3, 2, 4)
    h0 = sm.read(x, a)
    assert sm.reaches((torch.tanh(h0) * 2).grad_fn, h0.grad_fn)
    assert not sm.reaches((f * 2).grad_fn, h0.grad_fn)
    assert not sm.reaches(None, h0.grad_fn)


@needs_kernel
@pytest.mark.parametrize("mutation", [
    ("dm[(pos * n + j) * n + i] = dot(gj, xp + i * d, d);", "dm[(pos * n + j) * n + i] = dot(gj, xp + j * d, d);", 3),
    ("adm[j * 4 + i] += g[j] * x[i];", "adm[j * 4 + i] += g[i] * x[j];", 4),  # n = 4's ∂M transposed
    ("axpy(dxi, a[pos * n + i], gp, d, !accumulate);", "axpy(dxi, 1, gp, d, !accumulate);", 3),
    ("axpy(oj, mp[j * n + i], xp + i * d, d, 0);", "axpy(oj, mp[i * n + j], xp + i * d, d, 0);", 3),
    ("vstore(op + j * d + k, bp[j] * f + mp[4 * j] * x0 + mp[4 * j + 1] * x1",
     "vstore(op + j * d + k, bp[j] * f + mp[4 * j] * x0 + mp[4 + j] * x1", 4),  # n = 4's write: M[1, j] for M[j, 1]
    ("acc[i] += vload(xp + i * d + k) * g;", "acc[i] += vload(xp + k) * g;", 4),  # n = 4's ∂a from the first stream
])
def test_the_comparison_fails_for_a_mutated_kernel(mutation, monkeypatch, tmp_path):
    """The oracle can fail: each mutation of the C source (∂M from the wrong stream, in the general and the n = 4
    backward; ∂x without a_i; M transposed in the write, in the general and the n = 4 forward; the n = 4 read's ∂a
    from one stream), built and run in its place, is caught."""
    lib = mutated("stream_mix", sm.SIGNATURES, *mutation[:2], tmp_path)
    monkeypatch.setattr(sm, "_kernel", lambda: lib)
    n = mutation[2]
    x, a, m, f, b = tensors(5, n, 19)
    got, want = kernels(x, a, m, f, b, hyper_mix.GradSlot()), by_hand(x, a, m, f, b)
    dy = (torch.randn(5, 19, dtype=torch.float64), torch.randn(5, n, 19, dtype=torch.float64))
    pairs = list(zip(got, want)) + list(zip(torch.autograd.grad(got, (x, a, m, f, b), dy),
                                            torch.autograd.grad(want, (x, a, m, f, b), dy)))
    assert not all(torch.allclose(u, v) for u, v in pairs)


# HC and mHC with the kernels against the same connections with hyper_mix's products.

def ran_kernel(y):
    return ran(y, "_WriteKernelBackward")


def conn_and_branch(spec, dtype=torch.float64, ignores_input=False):
    torch.manual_seed(0)
    conn = skiplab.connection(spec, dim=16).to(dtype)
    with torch.no_grad():
        for p in conn.parameters():
            p.add_(0.1 * torch.randn_like(p))
    layer = nn.Sequential(nn.Linear(16, 16), nn.Tanh()).to(dtype)
    const = torch.randn(16, dtype=dtype, requires_grad=True)
    branch = (lambda h: const.expand_as(h) * 1.0) if ignores_input else layer
    return conn, branch, [*conn.parameters(), *layer.parameters(), const]


@needs_kernel
@pytest.mark.parametrize("spec", ["HC", "HC(kind=static)", "HC(tanh=no)", "HC+RMS", "mHC", "mHC(n=2)"])
@pytest.mark.parametrize("ignores_input", [False, True])
def test_connections_with_the_kernels_equal_hyper_mix(spec, ignores_input):
    conn, branch, params = conn_and_branch(spec, ignores_input=ignores_input)
    x = torch.randn(3, 5, conn.n, 16, dtype=torch.float64, requires_grad=True)
    y = conn(x, branch)
    assert ran_kernel(y)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, *params], dy, allow_unused=True)
    conn.kernel = None
    y_ref = conn(x, branch)
    assert not ran_kernel(y_ref)
    want = torch.autograd.grad(y_ref, [x, *params], dy, allow_unused=True)
    torch.testing.assert_close(y, y_ref)
    for u, v in zip(got, want):
        assert (u is None) == (v is None)
        if u is not None:
            torch.testing.assert_close(u, v)


def test_connections_run_hyper_mix_where_the_kernels_cannot(monkeypatch):
    conn, branch, _ = conn_and_branch("HC", torch.float32)
    x = torch.randn(2, 3, 4, 16, requires_grad=True)
    if load("stream_mix") is not None:
        assert ran_kernel(conn(x, branch))
    conn16, branch16, _ = conn_and_branch("HC", torch.bfloat16)
    assert not ran_kernel(conn16(x.bfloat16(), branch16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not ran_kernel(conn(x, branch))
    monkeypatch.setenv("SKIPLAB_KERNELS", "0")
    assert not ran_kernel(conn(x, branch))


@pytest.mark.parametrize("spec", ["HC", "mHC"])
def test_under_compile_the_connection_traces_hyper_mix_without_a_graph_break(spec):
    torch._dynamo.reset()
    conn, branch, _ = conn_and_branch(spec, torch.float32)
    x = torch.randn(2, 3, conn.n, 16)
    explained = torch._dynamo.explain(lambda t: conn(t, branch))(x)
    assert explained.graph_break_count == 0
    torch._dynamo.reset()
