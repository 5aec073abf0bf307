"""Dynamic hyper-connections' stream norm and projection as a CPU kernel (``norm_project.c``).

For rows x ∈ R^F (HC: each stream of a position, F = D; mHC: a position's n streams flattened, F = nD) and the
projection's rows V ∈ R^{K×F} (HC: W_m, W_r, W_β times the stream norm's gain, K = n + 2; mHC: φ's columns,
K = 2n + n²), with μ the row's mean where the norm centres (LayerNorm) and 0 where it does not (RMSNorm), and
r = (σ² + ε)^(-1/2) with σ² the row's variance or mean square:

    t_j = r (⟨x, V_j⟩ − μ ΣV_j)
    ∂x = Σ_j ∂u_j V_j + α x + β,   ∂V_j = Σ_rows ∂u_j (x − μ)

with ∂u = r ∂t, α = −r² ⟨∂t, t⟩ / F and, where the norm centres, β = (−⟨∂u, V1⟩ − α μ F) / F (else β = 0): the
formula of :class:`~skiplab.connections.hyper_mix._NormProject`, whose eager form makes a product for the
projection and a pass for the rows' norms forward, and backward a product into ∂x, an in-place update of ∂x with
α x and a product for ∂V, each a pass over the streams. Here the forward reads the rows once, and the backward
reads x and ∂x once and writes ∂x once, making ∂V in the same pass (see ``norm_project.c``). ∂x is added onto the
part of the same streams' gradient that the write and the read handed over
(:class:`~skiplab.connections.hyper_mix.GradSlot`), as the eager backward does; where the read was a kernel too, it
left its own part, a_i ∂h₀, for this pass to add, so that ∂x is read and written once for both.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import Tensor

from ..second_order import graph_wanted, plain, vjp
from .build import load, typed

_P, _I, _C, _D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double
SIGNATURES = {"forward": ([_P, _P, _P, _I, _I, _I, _C, _D, _P, _P, _P, _P, _C], _C),
              "backward": ([_P] * 7 + [_I, _I, _I, _C, _C, _P, _P, _P, _P, _I, _I, _P, _C], _C),
              "forward_scratch": ([_I], _I), "backward_scratch": ([_I], _I)}
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
ROWS = 8  # rows a block, at least (RB in norm_project.c: 8, or 16 with AVX-512): a thread takes whole blocks


def _kernel():
    return typed(load("norm_project"), SIGNATURES)


def _fn(name: str, dtype: torch.dtype):
    return getattr(_kernel(), f"{name}_{_SUFFIX[dtype]}")


def usable(x: Tensor, v: Tensor) -> bool:
    """Whether the kernel can project rows ``x`` (R, F) on ``v`` (K, F) here: on the CPU, one dtype (float32 or
    float64), at least one row and one column; not while compiling or under CPU autocast; and the kernel built on
    this machine."""
    dtype = x.dtype
    return (dtype in _SUFFIX and x.device.type == "cpu" and v.device.type == "cpu" and v.dtype == dtype
            and x.dim() == 2 and v.dim() == 2 and x.shape[1] == v.shape[1] and x.shape[0] > 0 and x.shape[1] > 0
            and v.shape[0] > 0 and not plain() and not torch.is_autocast_enabled("cpu")
            and _kernel() is not None)


def _threads(rows: int) -> int:
    return max(1, min(torch.get_num_threads(), -(-rows // ROWS)))


class _NormProjectKernel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, v: Tensor, centre: bool, eps: float, slot) -> Tensor:
        r, f = x.shape
        k = v.shape[0]
        vs = v.sum(-1)
        t, rr, mu = x.new_empty(r, k), x.new_empty(r), x.new_empty(r)
        threads = _threads(r)
        scratch = torch.empty(threads * _fn("forward_scratch", x.dtype)(k), dtype=torch.uint8)
        _fn("forward", x.dtype)(x.data_ptr(), v.data_ptr(), vs.data_ptr(), r, f, k, int(centre), eps, t.data_ptr(),
                                rr.data_ptr(), mu.data_ptr(), scratch.data_ptr(), threads)
        ctx.save_for_backward(x, v, vs, rr, t, mu)
        ctx.centre, ctx.slot, ctx.eps = centre, slot, eps
        if slot is not None:
            slot.fuse = True  # the read of the same streams may leave its part of ∂x for this backward (GradSlot)
        return t

    @staticmethod
    def formula(x: Tensor, v: Tensor, centre: bool, eps: float, slot) -> Tensor:
        """N(x) Vᵀ as PyTorch operators, for a second derivative (:mod:`~skiplab.connections.second_order`)."""
        return reference(x, v, centre, eps)

    @staticmethod
    def backward(ctx, g: Tensor):
        x, v, vs, rr, t, mu = ctx.saved_tensors
        want_x, want_v = ctx.needs_input_grad[:2]
        if graph_wanted():  # the statistics are the kernel's, the gradient C code: no graph to a second order
            return vjp(_NormProjectKernel.formula, (x, v, ctx.centre, ctx.eps, None), ctx.needs_input_grad, (g,))
        if not (want_x or want_v):
            return None, None, None, None, None
        g = g.to(x.dtype).contiguous()
        r, f = x.shape
        k = v.shape[0]
        slot = ctx.slot
        acc = read = None
        if want_x and slot is not None and slot.ok:
            if slot.grad is not None:
                acc, slot.grad = slot.grad.view(x.shape), None  # the read's (or write's) part of ∂x (see GradSlot)
            read, slot.read = slot.read, None  # (a, ∂h₀): the read's a_i ∂h₀, left for this pass
        dx = acc if acc is not None else torch.empty_like(x)  # written where there is no part to add onto
        ra = g0 = None
        per = seg = 1
        if read is not None:
            ra, g0 = (u.to(x.dtype).contiguous() for u in read)
            per, seg = r // ra.shape[0], f // g0.shape[1]  # HC: a row a stream (per = n); mHC: a row a position
        threads = _threads(r)
        parts = torch.zeros(threads, k, f, dtype=x.dtype) if want_v else None
        scratch = x.new_empty(threads * _fn("backward_scratch", x.dtype)(k))
        status = _fn("backward", x.dtype)(
            g.data_ptr(), x.data_ptr(), v.data_ptr(), vs.data_ptr(), rr.data_ptr(), t.data_ptr(), mu.data_ptr(), r, f,
            k, int(ctx.centre), int(acc is not None), dx.data_ptr(), parts.data_ptr() if parts is not None else None,
            ra.data_ptr() if ra is not None else None, g0.data_ptr() if g0 is not None else None, per, seg,
            scratch.data_ptr(), threads)
        if status:
            raise RuntimeError(f"norm_project kernel: the read's term ({tuple(ra.shape)}, {tuple(g0.shape)}) does not "
                               f"match rows ({r}, {f})")
        dv = None if parts is None else parts[0] if threads == 1 else parts.sum(0)  # in thread order
        return (dx if want_x else None), dv, None, None, None


def reference(x: Tensor, v: Tensor, centre: bool, eps: float) -> Tensor:
    """N(x) Vᵀ as PyTorch operators, r·(x Vᵀ − μ·V1) with the statistics as reductions (what ``torch.compile`` fuses
    and a second derivative differentiates)."""
    if centre:
        var, mu = torch.var_mean(x, -1, correction=0, keepdim=True)
        return (F.linear(x, v) - mu * v.sum(-1)) * torch.rsqrt(var + eps)
    return F.linear(x, v) * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


def norm_project(x: Tensor, v: Tensor, centre: bool, eps: float, slot=None) -> Tensor:
    """N(x) Vᵀ for rows ``x`` (R, F) and ``v`` (K, F) as :func:`~skiplab.connections.hyper_mix.norm_project`
    computes it (``centre``: LayerNorm's centring; ``slot``: the read's part of ∂x to add onto). Check
    :func:`usable` first."""
    return _NormProjectKernel.apply(x.contiguous(), v.contiguous(), bool(centre), float(eps), slot)
