"""Pre-norm residual blocks (the tutorial "Layer Normalization and Residual Connections")."""

from __future__ import annotations

from torch import Tensor

from .base import Branch, Connection, register
from .norms import make_norm
from .place import Place
from .spec import Spec


class _PreNorm(Connection):
    """y = x + F(G(x)): the branch sees the normalised input, the skip path stays an identity.

    A stack of pre-norm blocks ends un-normalised; models add one final norm (the tutorial's
    ``final_norm``, the Transformer's last LayerNorm on each stack).
    """

    kind: str

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        self.norm = make_norm(self.kind, self.in_dim, layout)  # G normalises x, the block input

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        return s + branch(self.norm(x))


@register
class PreLN(_PreNorm):
    """``PreLN``: y = x + F(LN(x)) (pre-norm Transformer block, GPT-2 / LLaMA style)."""

    name, kind, final_norm = "PreLN", "LN", "LN"
    patterns = {"PreLN": "y = x + F(LN(x))  (pre-norm, the tutorial)"}


@register
class PreRMS(_PreNorm):
    """``PreRMS``: y = x + F(RMSNorm(x)), RMSNorm(x) = w ⊙ x / sqrt(mean(x²) + ε) (LLaMA style)."""

    name, kind, final_norm = "PreRMS", "RMS", "RMS"
    patterns = {"PreRMS": "y = x + F(RMSNorm(x))  (pre-norm with RMSNorm, the tutorial)"}
