"""mHC's Sinkhorn–Knopp projection as a CPU kernel (``sinkhorn.c``).

From logits l ∈ R^{n×n} per position: M⁰ = exp(l − max l), then ``iters`` times T_c (each column divided by its sum)
and T_r (each row divided by its sum) — :func:`skiplab.connections.hyper.sinkhorn`, mHC's Eq. 9 — with the
unrolled iterations' gradient, half-step by half-step ∂M = (∂Y − Σ ∂Y ⊙ Y) / s along the axis of the sum s, and
∂l = ∂M⁰ ⊙ M⁰.

Why: the operator form makes 2·iters small operations forward and about twice that backward, each over every
position's n × n entries (40 divisions and 40 sums at mHC's 20 iterations): at a few microseconds of overhead and a
pass over memory each, tens of milliseconds a training step of a 4-layer decoder (the step profile of
docs/performance.md). Here each position's matrix is projected in registers and cache, forward once, and its
backward recomputes the forward's half-steps (n² values each) rather than keeping them.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .build import load, typed

_P, _I, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
SIGNATURES = {"forward": ([_P, _P, _I, _I, _I, _P, _C], None), "backward": ([_P, _P, _P, _I, _I, _I, _P, _C], None),
              "scratch": ([_I, _I], _I)}
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


def _kernel():
    return typed(load("sinkhorn"), SIGNATURES)


def _fn(name: str, dtype: torch.dtype):
    return getattr(_kernel(), f"{name}_{_SUFFIX[dtype]}")


def usable(logits: Tensor) -> bool:
    """Whether the kernel can project ``logits`` (..., n, n) here: on the CPU, float32 or float64, at least one
    position; not while compiling or under CPU autocast; and the kernel built on this machine."""
    return (logits.dtype in _SUFFIX and logits.device.type == "cpu" and logits.dim() >= 2
            and logits.shape[-1] == logits.shape[-2] and logits.numel() > 0 and not torch.compiler.is_compiling()
            and not torch.is_autocast_enabled("cpu") and _kernel() is not None)


def _scratch(dtype: torch.dtype, n: int, iters: int, threads: int) -> Tensor:
    return torch.empty(threads * _fn("scratch", dtype)(n, iters), dtype=torch.float64)


class _SinkhornKernel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, iters: int) -> Tensor:
        n = logits.shape[-1]
        flat = logits.contiguous().view(-1, n, n)
        out = torch.empty_like(flat)
        threads = torch.get_num_threads()
        scratch = _scratch(flat.dtype, n, iters, threads)  # alive until the call returns
        _fn("forward", flat.dtype)(flat.data_ptr(), out.data_ptr(), flat.shape[0], n, iters, scratch.data_ptr(),
                                   threads)
        ctx.save_for_backward(flat)
        ctx.iters, ctx.shape = iters, logits.shape
        return out.view(logits.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (flat,) = ctx.saved_tensors
        n = flat.shape[-1]
        g = grad.to(flat.dtype).contiguous().view(-1, n, n)
        dl = torch.empty_like(flat)
        threads = torch.get_num_threads()
        scratch = _scratch(flat.dtype, n, ctx.iters, threads)
        _fn("backward", flat.dtype)(flat.data_ptr(), g.data_ptr(), dl.data_ptr(), flat.shape[0], n, ctx.iters,
                                    scratch.data_ptr(), threads)
        return dl.view(ctx.shape), None


def sinkhorn(logits: Tensor, iters: int) -> Tensor:
    """The Sinkhorn–Knopp projection of exp(``logits``) (..., n, n), ``iters`` column-then-row steps, as
    :func:`skiplab.connections.hyper.sinkhorn` computes it. Check :func:`usable` first."""
    return _SinkhornKernel.apply(logits, int(iters))
