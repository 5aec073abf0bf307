"""Hyper-connections' read and write of the n streams as CPU kernels (``stream_mix.c``).

For streams x ∈ R^{n×D} per position and per-position coefficients a ∈ R^n, M ∈ R^{n×n}, b ∈ R^n (HC: a = A_m,
M = A_rᵀ, b = B, Eqs. 5-7 of the hyper-connections paper; mHC: H^pre, H^res, H^post):

    read:   h₀ = Σ_i a_i x_i                  ∂x_i += a_i ∂h₀,   ∂a_i = ⟨x_i, ∂h₀⟩
    write:  x'_j = Σ_i M[j, i] x_i + b_j F    ∂x_i = Σ_j M[j, i] ∂x'_j,   ∂M[j, i] = ⟨∂x'_j, x_i⟩,
                                              ∂F = Σ_j b_j ∂x'_j,   ∂b_j = ⟨∂x'_j, F⟩

Why: :mod:`skiplab.connections.hyper_mix` computes [h₀; Mx] in one batched product and adds b ⊗ F in a second
pass, so the mixed streams Mx (n·D a position) are written out by the read and read back by the write, and the
backward makes a pass over the streams for each product. Here the write mixes the streams itself (reading x again
instead of Mx, and never writing Mx), and each backward is one pass that makes every product of a position while
its rows are in the first-level cache (with n = 4, HC's and mHC's default, the position's four rows are loaded
once a vector and every output made from them in registers). ∂x is one buffer: the write's backward fills it, the
read's adds its part in place (the read runs first forward, so its backward runs after the write's), and where the
streams' norm and projection follow (dynamic HC, mHC) their backward adds theirs into the same buffer
(:class:`~skiplab.connections.hyper_mix.GradSlot`). Where that projection is a kernel too
(:mod:`~skiplab.connections.kernels.norm_project`), the read's backward computes ⟨x_i, ∂h₀⟩ alone and leaves
a_i ∂h₀ to the projection's pass over ∂x, so that ∂x is read and written once for both.
"""

from __future__ import annotations

import collections
import ctypes

import torch
from torch import Tensor

from ..second_order import graph_wanted, plain, vjp
from .build import load, typed

_P, _I, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
SIGNATURES = {"read_forward": ([_P, _P, _P, _I, _I, _I, _C], None),
              "write_forward": ([_P, _P, _P, _P, _P, _I, _I, _I, _C], None),
              "write_backward": ([_P] * 9 + [_I, _I, _I, _C], None),
              "read_backward": ([_P] * 5 + [_I, _I, _I, _C, _C], None)}
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


def _kernel():
    return typed(load("stream_mix"), SIGNATURES)


def _fn(name: str, dtype: torch.dtype):
    return getattr(_kernel(), f"{name}_{_SUFFIX[dtype]}")


def usable(x: Tensor, w: Tensor, b: Tensor) -> bool:
    """Whether the kernels can run streams ``x`` (P, n, D) with W = [a; M] (P, n + 1, n) and b (P, n) here: on the
    CPU, one dtype (float32 or float64), contiguous streams; not while compiling or under CPU autocast; and the
    kernel built on this machine."""
    dtype = x.dtype
    return (dtype in _SUFFIX and x.device.type == "cpu" and x.dim() == 3 and x.is_contiguous()
            and all(t.dtype == dtype and t.device.type == "cpu" for t in (w, b))
            and w.shape[-2:] == (x.shape[1] + 1, x.shape[1]) and b.shape[-1] == x.shape[1]
            and not plain() and not torch.is_autocast_enabled("cpu") and _kernel() is not None)


class _ReadKernel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, a: Tensor, slot, handoff: bool) -> Tensor:
        p, n, d = x.shape
        h0 = x.new_empty(p, d)
        _fn("read_forward", x.dtype)(x.data_ptr(), a.data_ptr(), h0.data_ptr(), p, n, d, torch.get_num_threads())
        ctx.save_for_backward(x, a)
        ctx.slot, ctx.handoff = slot, handoff
        return h0

    @staticmethod
    def formula(x: Tensor, a: Tensor, slot, handoff: bool) -> Tensor:
        """h₀ as PyTorch operators, for a second derivative (:mod:`~skiplab.connections.second_order`)."""
        return (a.unsqueeze(-1) * x).sum(1)

    @staticmethod
    def backward(ctx, g0: Tensor):
        x, a = ctx.saved_tensors
        if graph_wanted():  # C code: no graph to a second order; every part of ∂x returned here, none handed on
            return vjp(_ReadKernel.formula, (x, a, None, False), ctx.needs_input_grad, (g0,))
        g0 = g0.to(x.dtype).contiguous()
        p, n, d = x.shape
        slot = ctx.slot
        da = a.new_empty(p, n)
        if slot is not None and ctx.handoff and slot.ok and slot.fuse:
            # the projection kernel's backward, next, adds a_i ∂h₀ in its own pass over ∂x: ⟨x_i, ∂h₀⟩ alone here
            _fn("read_backward", x.dtype)(g0.data_ptr(), x.data_ptr(), a.data_ptr(), None, da.data_ptr(), p, n, d, 0,
                                          torch.get_num_threads())
            slot.read = a, g0
            return None, da, None, None
        dx = slot.grad if slot is not None and slot.grad is not None else None  # the write's part, to add onto
        accumulate = dx is not None
        if dx is None:
            dx = torch.empty_like(x)
        _fn("read_backward", x.dtype)(g0.data_ptr(), x.data_ptr(), a.data_ptr(), dx.data_ptr(), da.data_ptr(), p, n,
                                      d, int(accumulate), torch.get_num_threads())
        if slot is not None and ctx.handoff and slot.ok:  # the projection's backward adds its part and returns it
            slot.grad = dx
            return None, da, None, None
        if slot is not None:
            slot.grad = None
        return dx, da, None, None


class _WriteKernel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, m: Tensor, f: Tensor, b: Tensor, slot) -> Tensor:
        p, n, d = x.shape
        out = torch.empty_like(x)
        _fn("write_forward", x.dtype)(x.data_ptr(), m.data_ptr(), f.data_ptr(), b.data_ptr(), out.data_ptr(), p, n,
                                      d, torch.get_num_threads())
        ctx.save_for_backward(x, m, f, b)
        ctx.slot = slot
        return out

    @staticmethod
    def formula(x: Tensor, m: Tensor, f: Tensor, b: Tensor, slot) -> Tensor:
        """x' as PyTorch operators, for a second derivative (:mod:`~skiplab.connections.second_order`)."""
        return torch.bmm(m, x) + b.unsqueeze(-1) * f.unsqueeze(1)

    @staticmethod
    def backward(ctx, g: Tensor):
        x, m, f, b = ctx.saved_tensors
        if graph_wanted():  # C code: no graph to a second order; ∂x returned here, not left in the slot
            return vjp(_WriteKernel.formula, (x, m, f, b, None), ctx.needs_input_grad, (g,))
        g = g.to(x.dtype).contiguous()
        p, n, d = x.shape
        dx, dm, df, db = torch.empty_like(x), m.new_empty(p, n, n), torch.empty_like(f), b.new_empty(p, n)
        _fn("write_backward", x.dtype)(g.data_ptr(), x.data_ptr(), m.data_ptr(), f.data_ptr(), b.data_ptr(),
                                       dx.data_ptr(), dm.data_ptr(), df.data_ptr(), db.data_ptr(), p, n, d,
                                       torch.get_num_threads())
        if ctx.slot is not None:  # the read's backward, which runs next, adds its part and passes the sum on
            ctx.slot.grad = dx
            return None, dm, df, db, None
        return dx, dm, df, db, None


def reaches(node, target, limit: int = 10_000) -> bool:
    """Whether autograd node ``target`` is among ``node``'s inputs, at any depth (breadth first over
    ``next_functions``, so the sub-layer's own graph is searched before earlier layers'). The write hands its ∂x to
    the read's backward only where the sub-layer's output depends on h₀, so that the read's backward is sure to run
    after it; a search past ``limit`` nodes answers False (the safe answer: the write returns its ∂x itself)."""
    if node is None or target is None:
        return False
    seen, queue = {node}, collections.deque([node])
    while queue and len(seen) < limit:
        current = queue.popleft()
        if current is target:
            return True
        for nxt, _ in current.next_functions:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return False


def read(x: Tensor, a: Tensor, slot=None, handoff: bool = False) -> Tensor:
    """h₀ = Σ_i a_i x_i for streams ``x`` (P, n, D) and ``a`` (P, n). ``slot``: the
    :class:`~skiplab.connections.hyper_mix.GradSlot` the :func:`write` of the same streams fills in its backward;
    ``handoff``: the streams' norm and projection share it too and return the whole gradient. Check
    :func:`usable` first."""
    return _ReadKernel.apply(x, a.contiguous(), slot, handoff)


def write(x: Tensor, m: Tensor, f: Tensor, b: Tensor, slot=None) -> Tensor:
    """x'_j = Σ_i M[j, i] x_i + b_j F for streams ``x`` (P, n, D), ``m`` (P, n, n), the sub-layer's output ``f``
    (P, D) and ``b`` (P, n). ``slot``: as :func:`read`'s, given only where ``f`` depends on the read's h₀
    (:func:`reaches`): the write's ∂x then waits in it for the read's backward."""
    return _WriteKernel.apply(x, m.contiguous(), f.to(x.dtype).contiguous(), b.contiguous(), slot)
