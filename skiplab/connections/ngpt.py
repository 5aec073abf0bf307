"""nGPT's residual update on the unit hypersphere (Loshchilov, Hsieh, Sun and Ginsburg, ICLR 2025, "nGPT:
Normalized Transformer with Representation Learning on the Hypersphere", arXiv 2410.01131).

    h ← Norm(h + α ⊙ (Norm(F(h)) − h)),    Norm(x) = x / ‖x‖₂ along the features

for the attention and the MLP sub-layer alike (Section 2.2.2: h ← Norm(h + α_A (h_A − h)), h_A = Norm(ATTN(h)),
and the same with α_M and the MLP). α ∈ R^d is a learned per-feature step, the "eigen learning rate", kept in
the paper's reparametrisation (Section 2.5): the parameter α_p starts at α_scale and the step is

    α = |α_p · α_init / α_scale|,    α_init = 0.05,  α_scale = 1/√d

(NVIDIA/ngpt ``model.py``: ``attn_alpha`` and ``mlp_alpha``, their ``abs``; ai2-olmo-core 3.0.0's
``NormalizedTransformerBlock``: ``torch.lerp(h, Norm(F(h)), |α|)`` then Norm, lerp(a, b, w) = a + w (b − a)). Scaling every such vector by
α_init/α_scale lets Adam's one learning rate move it at the pace its scale asks for.

The update alone is not nGPT: the model keeps every weight matrix, embedding and hidden state on the sphere
(q·k normalised and scaled, the MLP's u and v scaled, the logits scaled, the matrices renormalised after
every optimizer step, no final norm). Those pieces are the model's (:mod:`skiplab.models.ngpt`), which is why
``nGPT`` is ``model_side``: only the GPT builds it; its ``recipe`` is the paper's model and training recipe.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .base import Branch, Connection, register
from .norms import feature_axis
from .place import Place
from .spec import Spec
from .second_order import graph_wanted, plain

ALPHA_INIT = 0.05  # α_init of both sub-layers (NVIDIA/ngpt: attn_alpha_init_value, mlp_alpha_init_value)


FLOOR = 1e-12  # the norm's floor against a zero vector


class _Unit(torch.autograd.Function):
    """y = x · r, r = 1 / max(‖x‖₂, floor) along ``dim``. Backward, from y itself:

        ∂x = r · (∂y − y ⟨∂y, y⟩)      (the projection off y; where the floor holds, r · ∂y)

    two passes over the rows and one reduction, where autograd through the division and the norm makes a
    quotient, its square, the norm's own backward and a sum of two gradients."""

    @staticmethod
    def forward(ctx, x: Tensor, dim: int) -> Tensor:
        norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True)
        r = norm.clamp_min(FLOOR).reciprocal_()
        y = x * r
        ctx.save_for_backward(y, r, norm < FLOOR)
        ctx.dim = dim
        return y

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor, None]:
        if graph_wanted():  # a second derivative (skiplab.connections.second_order)
            raise RuntimeError("nGPT's unit norm keeps its output, not its input, so its backward has no second "
                               "derivative: run the forward inside skiplab.connections.plain_formulas() for one")
        y, r, floored = ctx.saved_tensors
        dot = torch.linalg.vecdot(dy, y, dim=ctx.dim).unsqueeze(ctx.dim).masked_fill_(floored, 0.0)
        return torch.addcmul(dy, y, dot, value=-1.0).mul_(r), None


def unit(x: Tensor, dim: int = -1) -> Tensor:
    """Norm(x) = x / ‖x‖₂ along ``dim`` (the norm floored at 1e-12 against a zero vector); its backward fused
    (:class:`_Unit`) where gradients are wanted eagerly, the plain quotient under ``torch.compile`` (which fuses
    that itself) and where none is wanted."""
    if plain() or not (torch.is_grad_enabled() and x.requires_grad):
        return x / torch.linalg.vector_norm(x, dim=dim, keepdim=True).clamp_min(FLOOR)
    return _Unit.apply(x, dim)


class ScaleVector(nn.Module):
    """A learned vector in nGPT's reparametrisation: the parameter ``p`` starts at ``scale`` (every entry) and
    the value used is s = p · init / scale, which starts at ``init`` (Section 2.5: s_init and s_scale; NVIDIA/ngpt's
    ``*_init_value`` and ``*_init_scaling``)."""

    def __init__(self, size: int, init: float, scale: float):
        super().__init__()
        self.init, self.scale = init, scale
        self.p = nn.Parameter(torch.full((size,), float(scale)))

    def forward(self) -> Tensor:
        return self.p * (self.init / self.scale)

    def extra_repr(self) -> str:
        return f"{self.p.numel()}, init={self.init:g}, scale={self.scale:g}"


@register
class NGPT(Connection):
    """``nGPT``: h ← Norm(h + α ⊙ (Norm(F(h)) − h)), α = |α_p · 0.05 · √d| per feature, starting at 0.05
    (Loshchilov et al. 2025, Section 2.2.2; the model around it: :mod:`skiplab.models.ngpt`)."""

    name = "nGPT"
    model_side = True
    # The paper's model (SwiGLU, rotary positions, no biases, no dropout, an output layer of its own) and training
    # (no weight decay, no warm-up): NVIDIA/ngpt train.py, use_nGPT = 1 (weight_decay 0.0, warmup_iters 0) and
    # model.py (bias False, the lm_head apart from wte)
    recipe: ClassVar[dict[str, Any]] = {"mlp": "swiglu", "positions": "rope", "bias": False, "dropout": 0.0,
                                        "tie": False, "weight_decay": 0.0, "warmup": 0}
    patterns = {"nGPT": "h ← Norm(h + α ⊙ (Norm(F(h)) − h)), α learned per feature (0.05 at start); unit-norm "
                        "embeddings, weights and states, q·k and logits scaled, weights renormalised after each "
                        "step  (Loshchilov et al. 2025, nGPT)"}

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        self.alpha = ScaleVector(dim, ALPHA_INIT, 1.0 / math.sqrt(dim))

    def rate(self, dims: int = 4) -> Tensor:
        """α = |α_p · α_init / α_scale|, shaped to broadcast over the layout's feature axis of a ``dims``-axis
        tensor (conv: axis 1 of (N, C, ...))."""
        alpha = self.alpha().abs()
        return alpha if feature_axis(self.layout) == -1 else alpha.view(-1, *([1] * (dims - 2)))

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        axis = feature_axis(self.layout)
        s = x if skip is None else skip(x)
        # lerp(s, u, α) = s + α (u − s) in one kernel; the branch's output in the stream's dtype first (under autocast
        # a bf16 branch beside an fp32 stream, which lerp refuses and the written-out sum promoted)
        return unit(torch.lerp(s, unit(branch(x), axis).to(s.dtype), self.rate(s.dim()).to(s.dtype)), axis)

    def stats(self) -> dict[str, Any]:
        alpha = self.alpha().detach().abs()
        return {"alpha_mean": alpha.mean().item(), "alpha_min": alpha.min().item(), "alpha_max": alpha.max().item(),
                "alpha": alpha.cpu().clone()}
