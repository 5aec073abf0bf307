"""The general residual block y = G(λx + f·F(x)) and the plain network y = F(x).

Source: "Rethinking Skip Connection with Layer Normalization" (Liu et al., COLING 2020), the rSkip+LN
paper: expanded skip (Eq. 2), expanded skip with normalisation (Eq. 3), contracted skips (Table 3),
the BatchNorm forms (Table 4).
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from .base import Branch, Connection, register
from .fused import scaled_add
from .kernels import fused_chain
from .norms import ALL_NORMS, make_norm
from .place import Place
from .spec import Option, Spec, positive_float


@register
class ExpandedSkip(Connection):
    """``λxSkip[+G](f=...)``: y = λx + f·F(x) (Eq. 2), or y = G(λx + f·F(x)) with G in {LN, BN, RMS} (Eq. 3).

    λ > 0 is fixed. ``1xSkip`` is the residual unit x + F(x) (He et al. 2016); ``1xSkip+LN`` is the
    post-norm Transformer block LN(x + F(x)). ``f`` expands the residual branch instead of the skip:
    ``1xSkip(f=2)`` gives x + 2F(x), the contracted skips of Table 3. No normalisation: the gradient
    reaching x through the skip is scaled by λ per block, so a stack of L blocks scales it by λ^L.
    In the conv layout with LN (GroupNorm(1)), ``kernel = "add_group_norm"`` runs G(λx + f·F) as one CPU kernel
    (:mod:`~skiplab.connections.kernels.add_group_norm`). It is off by default: PreAct-ResNet-56's 2xSkip+LN step
    was no faster with it than with PyTorch's group norm (docs/performance.md), which already makes the one norm's
    two passes; the kernel pays where the chain has two norms or more (``krSkip+LN``, k ≥ 2).
    """

    name = "xSkip"
    numbered = True
    accepts_norms = ALL_NORMS
    options = {"f": Option(1.0, positive_float, "scale of the residual branch F (Table 3's contracted skips)")}
    patterns = {
        "1xSkip": "y = x + F(x)  (residual unit, He et al. 2016)",
        "λxSkip": "y = λx + F(x), λ > 0  (Eq. 2 of the rSkip+LN paper)",
        "λxSkip+LN": "y = LN(λx + F(x))  (Eq. 3 of the rSkip+LN paper)",
        "λxSkip+BN": "y = BN(λx + F(x))  (Table 4 of the rSkip+LN paper)",
        "λxSkip+RMS": "y = RMSNorm(λx + F(x))",
        "λxSkip+DyT": "y = DyT(λx + F(x)), DyT(h) = γ ⊙ tanh(αh) + β  (Zhu et al. 2025, in place of LN)",
        "λxSkip[+G](f=φ)": "y = [G](λx + φ·F(x))  (contracted skips, Table 3 of the rSkip+LN paper)",
    }

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        self.lam = float(spec.number)
        self.f = float(spec.options["f"])
        self.norm = make_norm(spec.norm, dim, layout) if spec.norm else None
        self.kernel: str | None = None  # "add_group_norm" may be set in the conv layout with LN; see the docstring

    @staticmethod
    def check_number(number: float) -> float:
        if not (math.isfinite(number) and number > 0):
            raise ValueError(f"λ of xSkip must be a finite number > 0, got {number:g}")
        return number

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        fx = branch(x)
        fused = fused_chain([self.norm], s, fx, self.lam, self.f) if self.kernel and self.recording is None else None
        if fused is not None:
            return fused[0]
        h = scaled_add(s, self.lam, fx, self.f)
        if self.norm is None:
            return h
        y = self.norm(h)
        self.record(pre=h, post=y)
        return y

    def stats(self) -> dict[str, Any]:
        return {"lambda": self.lam, "f": self.f}


@register
class NoSkip(Connection):
    """``NoSkip``: y = F(x), no skip path at all (the plain deep network of the tutorial's gradient demo;
    row 2 of Table 2 of the SAS paper). ``skip`` is ignored."""

    name = "NoSkip"
    patterns = {"NoSkip": "y = F(x)  (plain network, no skip connection)"}
    has_skip = False

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        return branch(x)
