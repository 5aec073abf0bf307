"""Fused element-wise forms of the connections: the same formulas in fewer passes over memory.

A connection's own cost is element-wise: its matmuls are in the branch. Written as separate tensor
operations, y = α·x + β·F + γ·LN(x + F) (SAS, Eq. 4 of the SAS paper) makes and re-reads a temporary for
every product and sum, and autograd's backward of a broadcast gate product materialises ``dy ⊙ x`` before
reducing it. The functions here compute the same values with one output buffer (the products are
accumulated into it in place) and reduce each gate gradient as one dot product per gate value. Under
``torch.compile`` they run as the plain formulas instead, which the compiler fuses with the operations around them:

    gated_sum((g_1, t_1), ..., (g_n, t_n)) = Σ_i g_i ⊙ t_i
        ∂/∂t_i = g_i ⊙ dy,   ∂/∂g_i = Σ_{broadcast axes} dy ⊙ t_i

Gates broadcast over trailing axes only: a scalar per position (B, T, 1) against (B, T, D), per example
(N, 1, 1, 1) or per channel (N, C, 1, 1) against (N, C, H, W), or a full-size tensor.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .second_order import graph_wanted, plain, vjp



def autocast_on(device_type: str) -> bool:
    """Whether autocast is on for tensors of ``device_type``; False for a device autocast knows nothing of (``meta``,
    where shapes are worked out without data: torch raises "unknown device type for autocast" there)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:
        return False

def _rows(gate: Tensor, like: Tensor) -> int:
    """How many leading elements of ``like`` one gate value covers the trailing rest of; checks the shape."""
    if gate.dim() != like.dim():
        raise ValueError(f"a gate of shape {tuple(gate.shape)} does not match a tensor of shape {tuple(like.shape)}")
    lead = gate.dim()
    while lead and gate.shape[lead - 1] == 1:  # trailing axes of 1 (where ``like`` is 1 as well: one row either way)
        lead -= 1
    if tuple(gate.shape[:lead]) != tuple(like.shape[:lead]) or any(n != 1 for n in gate.shape[lead:]):
        raise ValueError(f"a gate of shape {tuple(gate.shape)} must equal the leading axes of {tuple(like.shape)} "
                         "and be 1 on the trailing ones")
    return math.prod(like.shape[:lead])


def _gate_grad(gate: Tensor, dy: Tensor, t: Tensor) -> Tensor:
    """Σ over the axes ``gate`` broadcasts along of dy ⊙ t, in the gate's shape: a dot product per gate value
    (``linalg.vecdot`` over rows, which ran faster here than a batched 1 x k by k x 1 matmul)."""
    if gate.shape == t.shape:
        return dy * t
    rows = _rows(gate, t)
    cols = t.numel() // rows if rows else 0  # written out: -1 cannot be inferred from an empty tensor
    return torch.linalg.vecdot(dy.reshape(rows, cols), t.reshape(rows, cols)).view(gate.shape)


class _GatedSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *flat: Tensor) -> Tensor:
        gates, tensors = flat[0::2], flat[1::2]
        y = gates[0] * tensors[0]
        for g, t in zip(gates[1:], tensors[1:]):
            y.addcmul_(g, t)
        ctx.save_for_backward(*flat)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        flat = ctx.saved_tensors
        grads: list[Tensor | None] = []
        for i in range(0, len(flat), 2):
            g, t = flat[i], flat[i + 1]
            grads.append(_gate_grad(g, dy, t).to(g.dtype) if ctx.needs_input_grad[i] else None)
            grads.append(g * dy if ctx.needs_input_grad[i + 1] else None)
        return tuple(grads)


def gated_sum(*pairs: tuple[Tensor, Tensor]) -> Tensor:
    """Σ_i g_i ⊙ t_i for ``(g_i, t_i)`` pairs (see the module docstring), with one output buffer."""
    if not pairs:
        raise ValueError("gated_sum needs at least one (gate, tensor) pair")
    shape = pairs[0][1].shape
    for g, t in pairs:
        if t.shape != shape:
            raise ValueError(f"gated_sum adds tensors of one shape, got {tuple(shape)} and {tuple(t.shape)}")
        _rows(g, t)
    dtype = functools.reduce(torch.promote_types, [x.dtype for pair in pairs for x in pair])
    flat = [x.to(dtype) for pair in pairs for x in pair]
    if plain():  # the plain sum of products, which the compiler fuses into one kernel
        return functools.reduce(torch.add, [g * t for g, t in zip(flat[0::2], flat[1::2])])
    return _GatedSum.apply(*flat)


def group_norm_layout(h: Tensor) -> Tensor:
    """``h`` in memory ``native_group_norm`` takes (contiguous, or channels-last for 4-d): a copy of another view."""
    if h.is_contiguous() or (h.dim() == 4 and h.is_contiguous(memory_format=torch.channels_last)):
        return h
    return h.contiguous()


class _GatedNormSum(torch.autograd.Function):
    """y = a ⊙ s + b ⊙ f + g ⊙ N(h),  h = s + f,  N a layer norm with its affine weight w and bias (SAS, Eq. 4).

    Backward, with dN the norm's own backward (``native_layer_norm_backward``, ``native_group_norm_backward``):
        dh = dN(g ⊙ dy),   ∂/∂s = dh + a ⊙ dy,   ∂/∂f = dh + b ⊙ dy   (one ``addcmul`` each),
        ∂/∂a = Σ dy ⊙ s,   ∂/∂b = Σ dy ⊙ f,   ∂/∂g = Σ dy ⊙ N(h)   (over the axes each gate broadcasts along)
    Left to autograd, a ⊙ dy and b ⊙ dy are made first and dh is then added into each: four passes more.
    """

    @staticmethod
    def forward(ctx, s, f, a, b, g, weight, bias, shape, eps):
        h = s + f
        if shape is None:  # GroupNorm with one group: over every axis but the first
            h = group_norm_layout(h)
            n_, c = h.shape[:2]
            n, mean, rstd = torch.native_group_norm(h, weight, bias, n_, c, h.shape[2:].numel(), 1, eps)
        else:
            n, mean, rstd = torch.native_layer_norm(h, shape, weight, bias, eps)
        y = a * s
        y.addcmul_(b, f)
        y.addcmul_(g, n)
        ctx.save_for_backward(s, f, a, b, g, weight, bias, h, n, mean, rstd)
        ctx.shape, ctx.eps = shape, eps
        return y

    @staticmethod
    def formula(s, f, a, b, g, weight, bias, shape, eps):
        """The same y as plain operators: what a second derivative differentiates (:mod:`.second_order`)."""
        h = s + f
        n = (F.group_norm(h, 1, weight, bias, eps) if shape is None else F.layer_norm(h, shape, weight, bias, eps))
        return a * s + b * f + g * n

    @staticmethod
    def backward(ctx, dy):
        s, f, a, b, g, weight, bias, h, n, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        if graph_wanted():  # h, N(h) and the statistics are made inside forward: no graph to a second order
            return vjp(_GatedNormSum.formula, (s, f, a, b, g, weight, bias, ctx.shape, ctx.eps), need, (dy,))
        mask = [need[0] or need[1], weight is not None and need[5], bias is not None and need[6]]
        dn = g * dy
        if ctx.shape is None:  # the kernel reads dn in h's memory format (as torch's own group-norm backward)
            dn = dn.contiguous(memory_format=torch.contiguous_format if h.is_contiguous() else torch.channels_last)
            n_, c = h.shape[:2]
            dh, dw, dbias = torch.ops.aten.native_group_norm_backward(
                dn, h, mean, rstd, weight, n_, c, h.shape[2:].numel(), 1, mask)
        else:
            dh, dw, dbias = torch.ops.aten.native_layer_norm_backward(dn, h, ctx.shape, mean, rstd, weight, bias, mask)
        da = _gate_grad(a, dy, s).to(a.dtype) if need[2] else None
        db = _gate_grad(b, dy, f).to(b.dtype) if need[3] else None
        dg = _gate_grad(g, dy, n).to(g.dtype) if need[4] else None
        ds = torch.addcmul(dh, a, dy) if need[0] else None
        df = dh.addcmul_(b, dy) if need[1] else None
        return ds, df, da, db, dg, dw, dbias, None, None


def gated_norm_sum(a: Tensor, s: Tensor, b: Tensor, f: Tensor, g: Tensor, norm: torch.nn.Module) -> Tensor:
    """a ⊙ s + b ⊙ f + g ⊙ norm(s + f) (SAS, Eq. 4), its backward fused with the norm's where ``norm`` is a
    LayerNorm or a one-group GroupNorm (see :class:`_GatedNormSum`); otherwise, under autocast or under
    ``torch.compile``, the same values by :func:`gated_sum`."""
    kind = type(norm)
    layer = kind is torch.nn.LayerNorm
    fusable = (layer or (kind is torch.nn.GroupNorm and norm.num_groups == 1)) and s.dim() >= 2 \
        and not plain() and not autocast_on(s.device.type) \
        and len({x.dtype for x in (a, s, b, f, g)}) == 1 and s.shape == f.shape
    if not fusable:
        return gated_sum((a, s), (b, f), (g, norm(s + f)))
    for gate, t in ((a, s), (b, f), (g, s)):
        _rows(gate, t)
    return _GatedNormSum.apply(s, f, a, b, g, norm.weight, norm.bias,
                               tuple(norm.normalized_shape) if layer else None, norm.eps)


def scaled_add(s: Tensor, lam: float, f: Tensor, phi: float = 1.0) -> Tensor:
    """λ·s + φ·F (Eq. 2 of the rSkip+LN paper, Table 3's contracted forms) in one kernel where φ = 1."""
    if phi == 1.0:
        return s + f if lam == 1.0 else torch.add(f, s, alpha=lam)
    if lam == 1.0:
        return torch.add(s, f, alpha=phi)
    return torch.add(lam * s, f, alpha=phi)


class _RMSNorm(torch.autograd.Function):
    """y = w ⊙ x · r,  r = (‖x‖² / D + ε)^(-1/2) over the normalised axes (D elements), w broadcast.

    Backward, with ĝ = dy ⊙ w and c = Σ ĝ ⊙ x over the normalised axes:
        ∂/∂x = r · ĝ - x · r³ · c / D,        ∂/∂w = Σ_{not w's axes} dy ⊙ x · r
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor | None, dims: tuple[int, ...], eps: float):
        d = math.prod(x.shape[i] for i in dims)
        rstd = (torch.linalg.vector_norm(x, 2, dims, keepdim=True).square_().div_(d).add_(eps)).rsqrt_()
        y = x * rstd
        if weight is not None:
            y.mul_(weight)
        ctx.mark_non_differentiable(rstd)
        ctx.save_for_backward(x, weight, rstd)
        ctx.dims, ctx.d, ctx.eps = dims, d, eps
        return y, rstd

    @staticmethod
    def formula(x: Tensor, weight: Tensor | None, dims: tuple[int, ...], eps: float) -> Tensor:
        """y as plain operators (:mod:`.second_order`)."""
        y = x * torch.rsqrt(x.square().mean(dims, keepdim=True) + eps)
        return y if weight is None else y * weight

    @staticmethod
    def backward(ctx, dy: Tensor, _drstd: Tensor):
        x, weight, rstd = ctx.saved_tensors
        if graph_wanted():  # 1/σ is made inside forward (and the gradient below in place): no graph to a second order
            return vjp(_RMSNorm.formula, (x, weight, ctx.dims, ctx.eps), ctx.needs_input_grad, (dy,))
        gw = dy if weight is None else dy * weight
        c = (gw * x).sum(ctx.dims, keepdim=True)
        dx = gw * rstd if gw is dy else gw.mul_(rstd)
        dx.addcmul_(x, rstd.pow(3).mul_(c).div_(-ctx.d))
        dw = None
        if weight is not None and ctx.needs_input_grad[1]:
            full = (dy * x).mul_(rstd)
            lead = full.dim() - weight.dim()  # sum over the axes the gain broadcasts along
            axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(weight.shape) if n == 1)
            dw = full.sum(axes).view(weight.shape) if axes else full
        return dx, dw, None, None


def rms_norm(x: Tensor, weight: Tensor | None, dims: tuple[int, ...], eps: float) -> tuple[Tensor, Tensor]:
    """RMSNorm over ``dims`` (trailing axes of ``x``), gain ``weight`` broadcast against the trailing axes:
    ``(y, 1/σ)`` with σ = sqrt(mean(x²) + ε), in a forward and backward of few passes (``nn.RMSNorm``
    runs as five separate operations on the CPU)."""
    half = x.dtype in (torch.float16, torch.bfloat16)  # as F.rms_norm: compute in float32, return x's dtype
    axes = tuple([d % x.dim() for d in dims])
    if plain():  # the plain formula, which the compiler fuses with what is around it
        xf = x.float() if half else x
        rstd = torch.rsqrt(xf.square().mean(axes, keepdim=True) + eps)
        y = xf * rstd if weight is None else xf * rstd * weight
        return (y.to(x.dtype) if half else y), rstd.detach()
    y, rstd = _RMSNorm.apply(x.float() if half else x, weight, axes, eps)
    return (y.to(x.dtype) if half else y), rstd
