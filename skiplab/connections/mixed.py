"""Mix-LN: post-norm blocks first, pre-norm blocks after (Li, Yin and Liu, ICLR 2025, "Mix-LN: Unleashing the
Power of Deeper Layers by Combining Pre-LN and Post-LN", Section 4, Fig. 1)."""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from .base import Branch, Connection, register
from .norms import make_norm
from .place import Place
from .spec import Option, Spec, unit_interval


def post_layers(alpha: float, layers: int) -> int:
    """How many of a stack's first layers are post-norm: ⌊α·L⌋ (Li et al. 2025, Section 4; the code's
    ``POST_NUM``, 3 of 12 layers at α = 0.25). A rounding-error margin keeps e.g. 0.29 · 100 at 29."""
    return math.floor(alpha * layers + 1e-9)


@register
class MixLN(Connection):
    """``MixLN[+RMS](alpha=0.25)``: in a stack of L layers, layer l (1-based) is post-norm,
    y = LN(x + F(x)), for l ≤ ⌊α·L⌋, and pre-norm, y = x + F(LN(x)), after. α = 0.25 is the paper's choice
    (Table 5's ablation on LLaMA-1B); α = 0 is the pre-norm network, α = 1 the post-norm one (Table 5's
    "100%"). The stack ends with a final norm when it has pre-norm layers (α < 1); the authors' code
    (pixeli99/MixLN, ``modeling_llama.py``) keeps its final RMSNorm at every α, so its α = 1 is Post-LN plus
    one more norm (so were the paper's own 100% runs); skiplab chooses α = 1 to be exactly ``PostLN``, the
    design the paper names. Their LLaMA uses RMSNorm: a spec that names no norm takes the model's, so ``MixLN`` on
    the LLaMA presets (norm RMS) is ``MixLN+RMS``, on the GPT presets ``MixLN+LN``; a written norm stays.
    """

    name = "MixLN"
    accepts_norms = ("LN", "RMS", "DyT")
    default_norm = "LN"
    options = {"alpha": Option(0.25, unit_interval, "share of the first layers that are post-norm")}
    patterns = {"MixLN[+RMS](alpha=α)": "y = G(x + F(x)) for layers l ≤ ⌊αL⌋, y = x + F(G(x)) after, "
                                        "G the model's norm unless named  (Li et al. 2025, Mix-LN)"}

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        self.post = self.place.layer <= post_layers(spec.options["alpha"], self.place.layers)
        self.reads_input = not self.post  # a pre-norm layer's G(x), before the branch
        self.norm = make_norm(spec.norm, dim if self.post else self.in_dim, layout)

    @classmethod
    def final_norm_kind(cls, spec: Spec, layers: int) -> str | None:
        return spec.norm if post_layers(spec.options["alpha"], layers) < layers else None

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        if not self.post:
            return s + branch(self.norm(x))
        h = s + branch(x)
        y = self.norm(h)
        self.record(pre=h, post=y)
        return y

    def stats(self) -> dict[str, Any]:
        return {"post_norm": float(self.post)}

    def extra_repr(self) -> str:
        return super().extra_repr() + (", post-norm" if self.post else ", pre-norm")
