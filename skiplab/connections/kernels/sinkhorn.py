"""mHC's Sinkhorn–Knopp projection as a CPU kernel (``sinkhorn.c``), the positions in the vector lanes.

The same formula as :func:`skiplab.connections.hyper.sinkhorn` (mHC's Eq. 9): M⁰ = exp(l − max l), then ``iters``
times the columns and the rows normalised to sum 1, each half-step y = m / s; backward, the unrolled iterations'
vector-Jacobian products ∂m = (g − Σ_k g ⊙ y) / s, last half-step first, and ∂l = g ⊙ M⁰.

Why: the eager form runs two operators a half-step (a sum and a division), 80 a call forward and about twice that
backward, each over a few hundred kilobytes (a position's n × n entries across the positions): on the CPU its time
is the operators' overhead, not arithmetic. The kernel takes as many positions at once as a vector has lanes, keeps
their n² entries in registers through all the iterations, and recomputes the forward in the backward (keeping the
half-steps of one group of positions in cache), so it saves nothing but M⁰; the exponential stays PyTorch's
(vectorised) operator. A Sinkhorn kernel that went one position's matrix at a time was slower than the operators
(docs/performance.md).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from ..second_order import graph_wanted, plain, vjp
from .build import load, typed

_P, _I, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
SIGNATURES = {"forward": ([_P, _I, _I, _I, _P, _C], _C),
              "backward": ([_P, _P, _I, _I, _I, _P, _C], _C)}
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
MAX_N = 8  # MAX_N in sinkhorn.c


def _kernel():
    return typed(load("sinkhorn"), SIGNATURES)


def usable(logits: Tensor) -> bool:
    """Whether the kernel can project ``logits`` (..., n, n) here: on the CPU, float32 or float64, n ≤ ``MAX_N``,
    at least one matrix; not while compiling (the compiler fuses the eager loop) nor under CPU autocast; and the
    kernel built on this machine."""
    return (logits.dtype in _SUFFIX and logits.device.type == "cpu" and logits.dim() >= 2
            and logits.shape[-1] == logits.shape[-2] and 1 <= logits.shape[-1] <= MAX_N and logits.numel() > 0
            and not plain() and not torch.is_autocast_enabled("cpu")
            and _kernel() is not None)


class _SinkhornKernel(torch.autograd.Function):
    """The iterations from M⁰ (the exponential stays an operator: PyTorch's is vectorised)."""

    @staticmethod
    def forward(ctx, m0: Tensor, iters: int) -> Tensor:
        given, m0 = m0, m0.contiguous()  # the tensor as given kept too: a second derivative's graph starts there
        n = m0.shape[-1]
        out = torch.empty_like(m0)
        fn = getattr(_kernel(), f"forward_{_SUFFIX[m0.dtype]}")
        if fn(m0.data_ptr(), m0.numel() // (n * n), n, iters, out.data_ptr(), torch.get_num_threads()):
            raise ValueError(f"sinkhorn kernel: n = {n} and iters = {iters} (n must be 1..{MAX_N}, iters >= 0)")
        ctx.save_for_backward(m0, given)
        ctx.iters = iters
        return out

    @staticmethod
    def formula(m0: Tensor, iters: int) -> Tensor:
        """The iterations as PyTorch operators, for a second derivative (:mod:`~skiplab.connections.second_order`)."""
        return iterate(m0, iters)

    @staticmethod
    def backward(ctx, grad: Tensor):
        m0, given = ctx.saved_tensors
        if graph_wanted():  # C code: no graph to a second order
            return vjp(_SinkhornKernel.formula, (given, ctx.iters), ctx.needs_input_grad, (grad,))
        grad = grad.to(m0.dtype).contiguous()
        n = m0.shape[-1]
        dm0 = torch.empty_like(m0)
        fn = getattr(_kernel(), f"backward_{_SUFFIX[m0.dtype]}")
        if fn(m0.data_ptr(), grad.data_ptr(), m0.numel() // (n * n), n, ctx.iters, dm0.data_ptr(),
              torch.get_num_threads()):
            raise MemoryError("the sinkhorn kernel could not allocate its buffer")
        return dm0, None


def iterate(m: Tensor, iters: int) -> Tensor:
    """``iters`` Sinkhorn–Knopp steps from M⁰ = ``m`` (..., n, n) as PyTorch operators: the columns normalised to sum
    1, then the rows (the form ``torch.compile`` fuses and a second derivative differentiates)."""
    for _ in range(iters):
        m = m / m.sum(-2, keepdim=True)
        m = m / m.sum(-1, keepdim=True)
    return m


def sinkhorn(logits: Tensor, iters: int = 20) -> Tensor:
    """The doubly stochastic projection of exp(``logits``) (..., n, n), as :func:`skiplab.connections.hyper.sinkhorn`
    computes it: M⁰ = exp(l − max l) by PyTorch's operators (the max detached: the projection does not change when
    M⁰ is scaled, as in the eager form), the iterations by the kernel. Check :func:`usable` first."""
    m0 = torch.exp(logits - logits.detach().amax(dim=(-2, -1), keepdim=True))
    return _SinkhornKernel.apply(m0, int(iters))
