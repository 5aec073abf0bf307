"""The learned-vector skip, wSkip+LN (Section 5, "Learning λ", of the rSkip+LN paper)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .base import Branch, Connection, register
from .norms import ALL_NORMS, feature_axis, make_norm
from .place import Place
from .spec import Option, Spec, finite_float


@register
class WeightedSkip(Connection):
    """``wSkip+G(init=w0)``: y = G(w ⊙ x + F(x)), w ∈ R^C learned, one entry per feature or channel,
    initialised to ``init`` (default 1; the paper also tries 2). Without ``+G``: y = w ⊙ x + F(x)."""

    name = "wSkip"
    accepts_norms = ALL_NORMS
    options = {"init": Option(1.0, finite_float, "initial value of every entry of w")}
    patterns = {
        "wSkip+LN(init=w0)": "y = LN(w ⊙ x + F(x)), w a learned vector, w = w0 at start  (Section 5 of the rSkip+LN paper)",
        "wSkip[+BN|+RMS]": "y = [G](w ⊙ x + F(x))",
    }

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        self.weight = nn.Parameter(torch.full((dim,), float(spec.options["init"])))
        self.norm = make_norm(spec.norm, dim, layout) if spec.norm else None

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        w = self.weight if feature_axis(self.layout) == -1 else self.weight.view(-1, *([1] * (s.dim() - 2)))
        h = torch.addcmul(branch(x), w, s)  # w ⊙ x + F in one kernel
        if self.norm is None:
            return h
        y = self.norm(h)
        self.record(pre=h, post=y)
        return y

    def stats(self) -> dict[str, Any]:
        w = self.weight.detach()
        return {"w_mean": w.mean().item(), "w_norm": w.norm().item(), "w": w.cpu().clone()}
