"""Second derivatives through skiplab's fused functions.

A fused function (a ``torch.autograd.Function`` with its backward written out: the fused forms of
:mod:`~skiplab.connections.fused`, the hyper-connection mixes, the Sinkhorn projection, the C kernels of
:mod:`~skiplab.connections.kernels`) computes its gradient from statistics its forward
saved (μ, 1/σ), in place, or in C. Autograd cannot differentiate such a backward again: a saved statistic is a
constant to it and C code is no graph at all. ``once_differentiable`` does not make that safe: where the incoming
gradient needs no gradient of its own (a gradient penalty ‖∂L/∂x‖², a Hessian-vector product for the loss's
curvature) torch hands back the gradient as a constant, and the second derivative silently misses every term through
the function's inputs.

So a fused backward asks :func:`graph_wanted` first (autograd runs a backward with grad mode on exactly when it was
called with ``create_graph=True``) and then returns :func:`vjp` of its formula written as plain operators: the
vector-Jacobian product

    ∂/∂θ_i Σ_j ⟨g_j, f_j(θ)⟩        (g_j the incoming gradient of output j)

taken by autograd with a graph, which autograd can differentiate again. First derivatives keep the fused path; a
second one costs the plain formula's forward and backward.

Two fused functions keep too little to do that and say so: nGPT's unit norm keeps its output, not its input (the
input would be one more tensor the size of the stream kept per call), and the chunked cross-entropy
(:mod:`skiplab.models.linear_ce`) makes its gradient in the forward and keeps no logits. Inside
:func:`plain_formulas` every fused function runs its plain formula from the forward on (as under ``torch.compile``;
the head loss as eager's), which autograd differentiates to any order, at the plain formulas' cost.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor


_plain = [False]


@contextmanager
def plain_formulas() -> Iterator[None]:
    """Inside it, skiplab's fused functions run as plain operators from the forward on (the form ``torch.compile``
    traces): every derivative of any order is autograd's own."""
    before, _plain[0] = _plain[0], True
    try:
        yield
    finally:
        _plain[0] = before


def in_plain_formulas() -> bool:
    """Whether :func:`plain_formulas` is on (while compiling or not)."""
    return _plain[0]


def transforming() -> bool:
    """Whether a ``torch.func`` transform (grad, vjp, jacrev, vmap, ...) is running: its wrapped tensors reach no
    kernel (a ``data_ptr`` of their own) and the fused functions' ``forward(ctx, ...)`` is not one it takes."""
    level = getattr(torch._C._functorch, "maybe_current_level", None)
    return level is not None and level() is not None


def plain() -> bool:
    """Whether a fused function is to run its plain formula: while compiling (the compiler fuses it), under a
    ``torch.func`` transform (:func:`transforming`) or inside :func:`plain_formulas`."""
    return _plain[0] or torch.compiler.is_compiling() or transforming()


def graph_wanted() -> bool:
    """Whether the backward running now must return gradients autograd can differentiate again
    (``create_graph=True``): autograd turns grad mode on inside a backward exactly then."""
    return torch.is_grad_enabled()


def vjp(formula: Callable[..., Tensor | tuple[Tensor, ...]], inputs: Sequence[Any], needs: Sequence[bool],
        grads: Sequence[Tensor | None]) -> tuple[Tensor | None, ...]:
    """``∂/∂inputs[i] Σ_j ⟨grads[j], formula(*inputs)[j]⟩`` with a graph, for every i that ``needs`` marks (None for
    the others, as a backward returns them): ``inputs`` the function's forward arguments (the tensors as saved, which
    keep their place in the graph; anything else passed through), ``needs`` its ``ctx.needs_input_grad``,
    ``formula`` the same outputs as plain operators (a tensor or a tuple; an output whose gradient is None, such as a
    non-differentiable statistic, is left out)."""
    with torch.enable_grad():
        # each input through an alias of its own: the gradient is taken at the aliases, so it is this function's
        # partial derivative alone (taken at the inputs themselves it would add the paths by which one input depends
        # on another, a gate computed from x beside x), while the aliases keep the inputs' place in the graph
        inputs = [t.view_as(t) if isinstance(t, Tensor) and t.requires_grad else t for t in inputs]
    wanted = [t for t, need in zip(inputs, needs) if need]
    got: Sequence[Tensor | None] = [None] * len(wanted)
    if wanted:
        with torch.enable_grad():
            out = formula(*inputs)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            pairs = [(o, g.to(o.dtype)) for o, g in zip(outs, grads)
                     if g is not None and isinstance(o, Tensor) and o.requires_grad]
            if pairs:
                got = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], create_graph=True,
                                          allow_unused=True)
    it = iter(got)
    return tuple(next(it) if need else None for need in needs)
