"""Hyper-connections' stream read and write as two fused operations over the streams of every position.

A sub-layer with n streams x ∈ R^{n×D} per position reads h₀ = Σ_i a_i x_i (the layer's input) and writes
x'_j = Σ_i A[j, i] x_i + b_j F (the kept streams mixed, plus the layer's output broadcast), with per-position
coefficients a ∈ R^n, A ∈ R^{n×n}, b ∈ R^n (HC: a = A_m, A = A_rᵀ, b = B; mHC: H^pre, H^res, H^post). The work is
O(n·D) a position against the layer's O(D²): what it costs is memory traffic over the (positions, n, D) streams,
so the two functions here keep the streams contiguous, a position's n rows of D side by side (the layout of the
model's residual path, so no copy on the way in or out), and make as few passes over them as they can:

* :func:`read` computes h₀ and the mixed streams in one batched product, [a; A] (n + 1)×n by x (n×D) per position;
* :func:`write` adds b ⊗ F to the mixed streams in one element-wise pass;
* their backward passes are written out (:class:`_Read`, :class:`_Write`): each gradient is one batched product
  whose inner dimension is D (the coefficients' gradients) or one product and one in-place update (the streams'),
  where autograd through the indexing and the broadcast product made zero-filled gradients of the streams' size,
  copied and summed them, and materialised ``dy ⊙ x`` before reducing it.

Under ``torch.compile`` both are the plain broadcast expressions (a product and a sum over the n streams), which
inductor fuses with their neighbours into loops over the positions; the batched products would be opaque calls.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor

from .fused import autocast_on
from .kernels import norm_project as norm_project_kernel
from .second_order import graph_wanted, plain, vjp


def _no_autocast(t: Tensor):
    """The coefficients and streams are combined in their own dtype: under autocast a batched product would
    otherwise run in half precision and the backward (outside autocast) meet tensors of two dtypes."""
    kind = t.device.type
    return torch.autocast(kind, enabled=False) if autocast_on(kind) else nullcontext()


class GradSlot:
    """The streams' gradient handed from one sub-layer's :class:`_Read` backward to its :class:`_NormProject`
    backward, which runs after it (the projection gives the coefficients the read uses) and adds its own part in
    place: one buffer and no separate sum of the two parts. ``ok`` is cleared where either function worked on a copy of
    the streams (another dtype), whose gradients are not the same tensor's. The CPU kernels' write and read
    (:mod:`~skiplab.connections.kernels.stream_mix`) use it too: the write's backward fills it, the read's adds
    to it; where the projection is a kernel too (:mod:`~skiplab.connections.kernels.norm_project`, which sets
    ``fuse``), the read's backward leaves its part, a_i ∂h₀, in ``read`` as (a, ∂h₀) and the projection's backward
    adds it in its own pass over ∂x."""

    __slots__ = ("grad", "ok", "read", "fuse")

    def __init__(self):
        self.grad: Tensor | None = None
        self.ok = True
        self.read: tuple[Tensor, Tensor] | None = None
        self.fuse = False


class _Read(torch.autograd.Function):
    """[h₀; x̃] = W x per position: W (P, n + 1, n) = [a; A], x (P, n, D); h₀ (P, D) contiguous, x̃ (P, n, D) a
    view of the product. Backward: ∂x = Aᵀ ∂x̃ + a ⊗ ∂h₀ (one batched product, one in-place update),
    ∂W = [∂h₀; ∂x̃] xᵀ (products over D)."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, slot: GradSlot | None) -> tuple[Tensor, Tensor]:
        with _no_autocast(x):
            mix = torch.bmm(w, x)
        ctx.save_for_backward(x, w)
        ctx.slot = slot
        # h₀ written out once here: as a strided view of the product, the layer's norm copied it to a contiguous
        # buffer in its forward and again in its backward (native_layer_norm and its backward need contiguous rows)
        return mix[:, 0].contiguous(), mix[:, 1:]

    @staticmethod
    def backward(ctx, g_h0: Tensor, g_kept: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        x, w = ctx.saved_tensors
        # contiguous: the last layer's gradient comes from the streams' sum, expanded (stride 0), and bmm runs a
        # strided operand one position at a time
        g_h0, g_kept = g_h0.to(x.dtype).contiguous(), g_kept.to(x.dtype).contiguous()
        g_x = g_w = None
        if ctx.needs_input_grad[0]:
            g_x = torch.bmm(w[:, 1:].mT, g_kept)
            g_x.addcmul_(w[:, 0].unsqueeze(-1), g_h0.unsqueeze(1))
        if ctx.needs_input_grad[1]:
            xt = x.mT
            g_w = torch.cat([torch.bmm(g_h0.unsqueeze(1), xt), torch.bmm(g_kept, xt)], 1)
        slot = ctx.slot
        # the projection's backward adds its part and returns the sum (asked for a graph, each returns its own)
        if g_x is not None and slot is not None and slot.ok and not graph_wanted():
            slot.grad, g_x = g_x, None
        return g_x, g_w, None


class _Write(torch.autograd.Function):
    """x' = x̃ + b ⊗ F: x̃ (P, n, D), F (P, D), b (P, n). Backward: ∂x̃ = ∂x', ∂F = bᵀ ∂x', ∂b = ∂x' F (batched
    products over the n streams and over D, without the ∂x' ⊙ F temporary)."""

    @staticmethod
    def forward(ctx, kept: Tensor, f: Tensor, b: Tensor) -> Tensor:
        with _no_autocast(kept):
            out = torch.addcmul(kept, b.unsqueeze(-1).to(kept.dtype), f.unsqueeze(1).to(kept.dtype))
        ctx.save_for_backward(f, b)
        ctx.dtypes = kept.dtype, f.dtype, b.dtype
        return out

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        f, b = ctx.saved_tensors
        kept_dtype, f_dtype, b_dtype = ctx.dtypes
        g = g.to(kept_dtype).contiguous()  # as in _Read.backward
        g_f = g_b = None
        if ctx.needs_input_grad[1]:
            g_f = torch.bmm(b.to(g.dtype).unsqueeze(1), g).squeeze(1).to(f_dtype)
        if ctx.needs_input_grad[2]:
            # F ∂x'ᵀ, (1×D by D×n): a product with the streams' rows as its columns ran 2-3 times faster than ∂x' F
            g_b = torch.bmm(f.to(g.dtype).unsqueeze(1), g.mT).squeeze(1).to(b_dtype)
        return g if ctx.needs_input_grad[0] else None, g_f, g_b


class _NormProject(torch.autograd.Function):
    """t = N(x) Vᵀ for rows x (R, F) and V (K, F), with N(x) = (x − μ)·r (``centre``, LayerNorm's) or x·r (RMSNorm's),
    r = (σ² + ε)^(-1/2), computed as r·(x Vᵀ − μ·V1) so that the normalised rows are never written out; μ comes from
    the same product (a row 1/F appended to V), the mean square from the rows' norm. Backward, with ∂u = r ∂t:
    ∂x = ∂u V + α x + β per row (α = −r² Σ_c ∂t_c t_c / F from r, β from μ: one product with [∂u | β] by [V; 1] and
    one in-place update), ∂V = ∂uᵀ (x − μ)."""

    @staticmethod
    def forward(ctx, x: Tensor, v: Tensor, centre: bool, eps: float, slot: GradSlot | None) -> Tensor:
        k, f = v.shape
        with _no_autocast(x):
            if centre:
                u = F.linear(x, torch.cat([v, v.new_full((1, f), 1.0 / f)]))  # (R, K + 1): x Vᵀ and μ
                u, mu = u[:, :k], u[:, k:]
                var = (torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(f) - mu.square()).clamp_(min=0)
                r = var.add_(eps).rsqrt_()
                t = (u - mu * v.sum(-1)).mul_(r)
            else:
                mu = None
                r = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(f).add_(eps).rsqrt_()
                t = F.linear(x, v).mul_(r)
        ctx.save_for_backward(x, v, r, t, mu)
        ctx.slot, ctx.centre, ctx.eps = slot, centre, eps
        return t

    @staticmethod
    def formula(x: Tensor, v: Tensor, centre: bool, eps: float, slot: GradSlot | None) -> Tensor:
        """t as plain operators, for a second derivative (:mod:`.second_order`)."""
        return norm_project_kernel.reference(x, v, centre, eps)

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        x, v, r, t, mu = ctx.saved_tensors
        if graph_wanted():  # r and μ are made inside forward: no graph to a second order
            return vjp(_NormProject.formula, (x, v, ctx.centre, ctx.eps, None), ctx.needs_input_grad, (g,))
        g = g.to(x.dtype)
        f = x.shape[-1]
        gu = g * r  # (R, K)
        alpha = (g * t).sum(-1, keepdim=True).mul_(r.square()).div_(-f)  # ∂r/∂(mean square) terms, per row
        g_x = g_v = None
        if ctx.needs_input_grad[0]:
            slot = ctx.slot
            acc = None
            if slot is not None and slot.ok and slot.grad is not None:
                acc, slot.grad = slot.grad.view(x.shape), None  # the read's part of ∂x (see GradSlot)
            if mu is None:
                a, b = gu, v
            else:
                # β = (−Σ_c ∂u_c V1_c − α μ·F) / F: μ's own term and the variance's through μ
                beta = (gu * v.sum(-1)).sum(-1, keepdim=True).neg_().sub_(alpha * mu * f).div_(f)
                a, b = torch.cat([gu, beta], -1), torch.cat([v, v.new_ones(1, f)])
            # into the read's buffer (addmm_ also ran faster than mm into a new one here)
            g_x = torch.mm(a, b) if acc is None else acc.addmm_(a, b)
            g_x.addcmul_(x, alpha)
        if ctx.needs_input_grad[1]:
            g_v = torch.mm(gu.t(), x)
            if mu is not None:
                g_v.sub_(torch.mm(gu.t(), mu))  # Σ_rows ∂u μ, one column broadcast over F
        return g_x, g_v, None, None, None


def norm_project(x: Tensor, v: Tensor, centre: bool, eps: float, slot: GradSlot | None = None) -> Tensor:
    """N(x) Vᵀ: rows ``x`` (R, F) normalised (LayerNorm's centring and scaling without its affine with ``centre``,
    RMSNorm's scaling without) and projected on the rows of ``v`` (K, F), without writing N(x) out
    (:class:`_NormProject`); (R, K). ``slot``: shared with the :func:`read` of the same streams (:class:`GradSlot`)."""
    if plain():  # the same product, the statistics as reductions inductor fuses
        return norm_project_kernel.reference(x, v, centre, eps)
    dtype = torch.promote_types(x.dtype, v.dtype)
    xc = x.to(dtype).contiguous()
    if slot is not None and xc is not x:
        slot.ok = False
    return _NormProject.apply(xc, v.to(dtype).contiguous(), centre, float(eps), slot)


def read(x: Tensor, w: Tensor, slot: GradSlot | None = None) -> tuple[Tensor, Tensor]:
    """(h₀, x̃) = (Σ_i a_i x_i, A x) for streams ``x`` (P, n, D) and coefficients ``w`` = [a; A], (P, n + 1, n) per
    position or (n + 1, n) for every position: h₀ (P, D), x̃ (P, n, D). ``slot``: shared with the
    :func:`norm_project` that made ``w`` from the same streams, which then returns the whole of their gradient."""
    if plain():
        mix = (w.unsqueeze(-1) * x.unsqueeze(-3)).sum(-2)  # (P, n + 1, D): inductor unrolls the sum over n
        return mix[:, 0], mix[:, 1:]
    dtype = torch.promote_types(x.dtype, w.dtype)
    # one coefficient matrix for every position (static HC) is written out per position: a batched product over an
    # expanded (stride-0) batch ran at half the speed of one over contiguous matrices
    w = w.to(dtype).expand(x.shape[0], *w.shape[-2:]).contiguous()
    xc = x.to(dtype).contiguous()
    if slot is not None and xc is not x:
        slot.ok = False
    return _Read.apply(xc, w, slot)


def write(kept: Tensor, f: Tensor, b: Tensor) -> Tensor:
    """x̃ + b ⊗ F: the mixed streams ``kept`` (P, n, D), the sub-layer's output ``f`` (P, D), ``b`` (P, n) or (n,)."""
    if plain():
        return kept + b.unsqueeze(-1) * f.unsqueeze(-2)
    return _Write.apply(kept, f, b.expand(kept.shape[:2]).contiguous())
