"""The recursive skip connection with normalisation, rSkip+LN (Eq. 4 of the rSkip+LN paper)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .base import Branch, Connection, register
from .kernels import fused_chain
from .norms import NORMS, feature_mean, make_norm, normalize, norm_gain
from .place import Place
from .spec import Spec


@register
class RecursiveSkip(Connection):
    """``krSkip+G``, integer k >= 1, G in {LN, BN, RMS}:

        y_1 = G_1(x + F(x)),   y_i = G_i(x + y_{i-1})  (i = 2..k),   y = y_k      (Eq. 4)

    Each G_i has its own parameters. ``1rSkip+LN`` equals ``1xSkip+LN`` (post-norm).

    Learned ratio (Appendix A, Eqs. 5-6). With the statistics frozen, G_i(h) = a_i·h + c_i with
    a_i = w_i/σ_i, so unrolling gives y = (Σ_{i=1}^{k} Π_{j=i}^{k} a_j)·x + (Π_{j=1}^{k} a_j)·F + C, and the
    skip-to-residual ratio is

        x : F = 1 + Σ_{i=1}^{k-1} Π_{j=1}^{i} σ_j / w_j        (k = 2: σ_1/w_1 + 1, Eq. 6)

    The paper's general form sums to λ (= k); unrolling y_3 shows the sum stops at k-1. ``stats()``
    reports this ratio per feature, averaged over the positions (and examples) of the last forward pass.
    In the conv layout with LN (GroupNorm(1)) and k ≥ 2, on the CPU, the whole chain runs as one kernel
    (:mod:`~skiplab.connections.kernels.add_group_norm`; ``kernel = None`` turns it off). For k = 1, one norm's
    chain, it is off unless ``kernel = "add_group_norm"`` is set: 2xSkip+LN's chain, the same shape, made no
    faster step with it (docs/performance.md).
    The σ_j are the ones the norms compute anyway (:func:`~skiplab.connections.norms.normalize`); a forward
    pass keeps references to them (one number per position) and ``stats()`` does the arithmetic, so
    training pays nothing for the statistics.
    """

    name = "rSkip"
    numbered = True
    accepts_norms = NORMS
    norm_required = True
    patterns = {
        "krSkip+LN": "y_1 = LN(x + F(x)), y_i = LN(x + y_{i-1}), y = y_k; k >= 1 integer  (Eq. 4 of the rSkip+LN paper)",
        "krSkip+BN": "as krSkip+LN with BatchNorm  (Table 4 of the rSkip+LN paper)",
        "krSkip+RMS": "as krSkip+LN with RMSNorm",
    }

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        self.k = int(spec.number)
        self.norms = nn.ModuleList(make_norm(spec.norm, dim, layout) for _ in range(self.k))
        self._inv_sigmas: list[Tensor] = []  # 1/σ_i of the last forward pass, i = 1..k-1 (σ_k never enters)
        self.kernel = "add_group_norm" if layout == "conv" and spec.norm == "LN" and self.k >= 2 else None

    @staticmethod
    def check_number(number: float) -> float:
        if not (math.isfinite(number) and number.is_integer() and number >= 1):
            raise ValueError(f"the order k of rSkip must be an integer >= 1, got {number:g}")
        return number

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        y = branch(x)
        fused = fused_chain(self.norms, s, y) if self.kernel and self.recording is None else None
        if fused is not None:
            y, inv_sigmas = fused
            self._inv_sigmas = inv_sigmas[:-1]
            return y
        inv_sigmas, first = [], None
        for norm in self.norms:
            h = s + y
            y, inv_sigma = normalize(norm, h)
            inv_sigmas.append(inv_sigma)
            first = (h, y) if first is None else first
        self._inv_sigmas = inv_sigmas[:-1]
        if self.recording is not None:
            self.record(sigma_prods=self.sigma_prods(), pre=first[0], post=first[1])
        return y

    @torch.no_grad()
    def sigma_prods(self) -> list[Tensor]:
        """Π_{j<=i} σ_j, i = 1..k-1, of the last forward pass, per position (broadcastable to it)."""
        prods, prod = [], None
        for inv in self._inv_sigmas:
            sigma = 1.0 / inv.float()
            prod = sigma if prod is None else prod * sigma
            prods.append(prod)
        return prods

    @torch.no_grad()
    def ratio(self) -> Tensor | None:
        """Per-feature skip-to-residual ratio x : F of the last forward pass, shape ``(dim,)``."""
        if self.k == 1:
            return torch.ones(self.dim)
        if not self._inv_sigmas:
            return None
        ratio, gains = torch.ones(self.dim), None
        for norm, prod in zip(self.norms, self.sigma_prods()):
            w = norm_gain(norm).cpu()
            gains = w if gains is None else gains * w
            ratio = ratio + feature_mean(prod, self.layout, self.dim).cpu() / gains
        return ratio

    @torch.no_grad()
    def position_ratio(self, sigma_prods: list[Tensor]) -> Tensor:
        """The x : F ratio at every position and feature, from σ products this block recorded:

            ratio = 1 + Σ_{i=1}^{k-1} Π_{j<=i} σ_j / Π_{j<=i} w_j        (Appendix A, sum to k - 1)

        broadcast to the recorded positions (a scalar 1 for k = 1)."""
        ratio, gains = torch.ones(()), None
        for norm, prod in zip(self.norms, sigma_prods):
            w = norm_gain(norm).to(prod.device)
            w = w if self.layout == "seq" else w.view(-1, *([1] * (prod.dim() - 2)))
            gains = w if gains is None else gains * w
            ratio = ratio.to(prod.device) + prod.float() / gains
        return ratio

    def stats(self) -> dict[str, Any]:
        ratio = self.ratio()
        return {
            "k": self.k,
            "ratio": ratio,
            "ratio_mean": None if ratio is None else ratio.mean().item(),
        }
