"""The add + GroupNorm(1) chain of the conv-layout connections as one CPU kernel (``add_group_norm.c``).

    h_1 = a·s + c·F,   y_i = GN_i(h_i),   h_{i+1} = s + y_i   (i = 1..k),   y = y_k

with GN_i(h) = (h − μ)/√(σ² + ε) · w_i + b_i, μ and σ² over one example's C·H·W values (``nn.GroupNorm(1, C)``,
the conv layout's LN). k = 1 is ``λxSkip+LN(f=φ)`` (a = λ, c = φ, Eq. 3 of the rSkip+LN paper), a = c = 1 and
k ≥ 1 is ``krSkip+LN`` (Eq. 4). Backward, with x̂ = (h − μ)/σ and g the gradient at y_i:

    ∂w_i = Σ_{H,W,N} g ⊙ x̂,   ∂b_i = Σ_{H,W,N} g,   ∂h_i = (g·w_i − mean(g·w_i) − x̂·mean(g·w_i ⊙ x̂)) / σ

the means over the example; ∂h_i flows to s and (i > 1) to y_{i−1}, and ∂s sums them (a·∂h_1 from the first).

Why a kernel: written as operators, each sum and each norm crosses main memory (two passes forward and two
backward per norm); on the 2-core Intel Xeon of docs/performance.md that made PreAct-ResNet-56's 2rSkip+LN step
1.15× the plain residual's. One example's tensors fit in a core's cache, so the kernel reads s and F once and
writes y once forward, reads s, F and ∂y once and writes ∂s and ∂F once backward, recomputing h_i from s, F and
the saved μ, σ. The statistics are sums about a pivot (per channel in the tensor's dtype, across channels in
double), y is (h − μ)·(w/σ) + b: as accurate as PyTorch's float32 group norm where the mean dwarfs the spread
(tested).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor, nn

from ..second_order import graph_wanted, plain, vjp
from .build import load, typed

_P, _I, _D, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_int
SIGNATURES = {"forward": ([_P, _P, _P, _P, _D, _D, _D, _I, _I, _I, _I, _P, _P, _P, _C], _C),
              "backward": ([_P, _P, _P, _P, _D, _D, _P, _P, _P, _I, _I, _I, _I, _P, _P, _P, _P, _C], _C)}
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
MAX_K = 8  # the longest chain one call takes (MAX_K in add_group_norm.c)


def _kernel():
    return typed(load("add_group_norm"), SIGNATURES)


def group_norm_params(norms) -> tuple[list[Tensor], list[Tensor], float] | None:
    """``([w_1 .. w_k], [b_1 .. b_k], ε)`` of ``norms`` when every one is an affine ``nn.GroupNorm(1, C)`` with one
    ε, else None (another norm swapped in: the connection's eager formula handles it)."""
    if not all(type(n) is nn.GroupNorm and n.num_groups == 1 and n.affine for n in norms):
        return None
    if len({n.eps for n in norms}) != 1:
        return None
    return [n.weight for n in norms], [n.bias for n in norms], norms[0].eps


def usable(s: Tensor, f: Tensor, weight: Tensor, bias: Tensor) -> bool:
    """Whether the kernel can run these tensors here: on the CPU, float32 or float64 alike, s and F of one shape
    (N, C, ...), w and b of shape (k, C); not while compiling (the compiler fuses the eager formula itself) nor
    under CPU autocast (the eager norms run in float32 there); at most ``MAX_K`` norms; and the kernel built on
    this machine."""
    return (weight.dim() == 2 and weight.shape == bias.shape
            and _usable(s, f, list(weight.unbind(0)), list(bias.unbind(0))))


def _usable(s: Tensor, f: Tensor, weights: list[Tensor], biases: list[Tensor]) -> bool:
    """:func:`usable` for the k gains and biases as separate tensors of shape (C,)."""
    dtype, ch = s.dtype, s.shape[1] if s.dim() >= 3 else -1
    return (dtype in _SUFFIX and s.device.type == "cpu" and s.dim() >= 3 and f.shape == s.shape
            and f.dtype == dtype and f.device.type == "cpu" and 1 <= len(weights) == len(biases) <= MAX_K
            and all(t.dtype == dtype and t.device.type == "cpu" and t.shape == (ch,) for t in (*weights, *biases))
            and s.numel() > 0 and not plain() and not _channels_last(s) and not _channels_last(f)
            and not torch.is_autocast_enabled("cpu") and _kernel() is not None)


def _channels_last(t: Tensor) -> bool:
    """A 4-d tensor laid out channels-last: the kernel reads (N, C, ...) in order and would return y in that
    layout, so such a stream is left to the eager formula, which keeps the caller's layout."""
    return t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


class _AddGroupNorm(torch.autograd.Function):
    """The chain over s, F and the k norms' gains and biases, passed one by one (``*params`` = w_1 .. w_k,
    b_1 .. b_k): stacked for the kernel inside forward, and their gradients handed back as rows of one tensor, so
    autograd records one node a call, not a stack and its backward besides."""

    @staticmethod
    def forward(ctx, s: Tensor, f: Tensor, a: float, c: float, eps: float, *params: Tensor):
        k = len(params) // 2
        ctx.eps = eps
        given = (s, f, *params)  # saved as given too: a second derivative's graph starts there
        s, f = s.contiguous(), f.contiguous()
        weight, bias = torch.stack(params[:k]), torch.stack(params[k:])
        n, ch = s.shape[0], s.shape[1]
        y = torch.empty_like(s)
        mean, rstd = s.new_empty(k, n), s.new_empty(k, n)  # μ_i and 1/σ_i, one row per norm
        fn = getattr(_kernel(), f"forward_{_SUFFIX[s.dtype]}")
        if fn(s.data_ptr(), f.data_ptr(), weight.data_ptr(), bias.data_ptr(), a, c, eps, n, ch, s.shape[2:].numel(), k,
              y.data_ptr(), mean.data_ptr(), rstd.data_ptr(), torch.get_num_threads()):
            raise MemoryError("the add_group_norm kernel could not allocate its buffers")
        ctx.save_for_backward(s, f, weight, bias, mean, rstd, *given)
        ctx.a, ctx.c = a, c
        ctx.mark_non_differentiable(rstd)
        return y, rstd

    @staticmethod
    def formula(s: Tensor, f: Tensor, a: float, c: float, eps: float, *params: Tensor) -> Tensor:
        """y as PyTorch operators, for a second derivative (:mod:`~skiplab.connections.second_order`)."""
        k = len(params) // 2
        return reference(s, f, torch.stack(params[:k]), torch.stack(params[k:]), a, c, eps)

    @staticmethod
    def backward(ctx, dy: Tensor, _drstd: Tensor | None):
        s, f, weight, bias, mean, rstd, *given = ctx.saved_tensors
        if graph_wanted():  # the statistics are the kernel's, the gradient C code: no graph to a second order
            inputs = (given[0], given[1], ctx.a, ctx.c, ctx.eps, *given[2:])
            return vjp(_AddGroupNorm.formula, inputs, ctx.needs_input_grad, (dy,))
        dy = dy.contiguous()
        (n, ch), k = s.shape[:2], weight.shape[0]
        ds, df = torch.empty_like(s), torch.empty_like(s)
        dwb = torch.zeros(2, k, ch, dtype=torch.float64)  # ∂w_i, ∂b_i, summed in double
        fn = getattr(_kernel(), f"backward_{_SUFFIX[s.dtype]}")
        if fn(s.data_ptr(), f.data_ptr(), weight.data_ptr(), bias.data_ptr(), ctx.a, ctx.c, dy.data_ptr(),
              mean.data_ptr(), rstd.data_ptr(), n, ch, s.shape[2:].numel(), k, ds.data_ptr(), df.data_ptr(),
              dwb[0].data_ptr(), dwb[1].data_ptr(), torch.get_num_threads()):
            raise MemoryError("the add_group_norm kernel could not allocate its buffers")
        return ds, df, None, None, None, *dwb.to(weight.dtype).view(2 * k, ch).unbind(0)


def add_group_norm(s: Tensor, f: Tensor, weight: Tensor, bias: Tensor, a: float = 1.0, c: float = 1.0,
                   eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """``(y, 1/σ)`` of the chain in the module docstring: y shaped like s, 1/σ of shape (k, N) (detached), one
    row per norm. ``weight`` and ``bias`` stack the k norms' gains and biases, shape (k, C). Call
    :func:`usable` first: this runs the kernel and nothing else."""
    return _AddGroupNorm.apply(s, f, float(a), float(c), float(eps), *weight.unbind(0), *bias.unbind(0))


def reference(s: Tensor, f: Tensor, weight: Tensor, bias: Tensor, a: float = 1.0, c: float = 1.0,
              eps: float = 1e-5) -> Tensor:
    """The same chain as PyTorch operators (``F.group_norm`` per norm): what the kernel is tested against."""
    h = a * s + c * f
    for i in range(weight.shape[0]):
        y = torch.nn.functional.group_norm(h, 1, weight[i], bias[i], eps)
        h = s + y
    return y


def fused_chain(norms, s: Tensor, f: Tensor, a: float = 1.0, c: float = 1.0) -> tuple[Tensor, list[Tensor]] | None:
    """What a connection calls: ``(y, [1/σ_i broadcastable to s])`` from the kernel over ``norms`` (GN_1 .. GN_k),
    or None where it cannot run (the caller then runs its eager formula)."""
    if plain():  # before anything the compiler would have to trace
        return None
    params = group_norm_params(norms)
    if params is None or not _usable(s, f, params[0], params[1]):
        return None
    weights, biases, eps = params
    y, rstd = _AddGroupNorm.apply(s, f, float(a), float(c), float(eps), *weights, *biases)
    return y, list(rstd.view(len(weights), s.shape[0], *([1] * (s.dim() - 1))).unbind(0))
