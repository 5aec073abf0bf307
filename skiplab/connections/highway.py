"""The Highway transform gate (Srivastava et al. 2015), as compared in Fig. 2(a) and Table 6 of the SAS paper."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .base import Branch, Connection, register
from .sas import pool_features, unpool
from .place import Place
from .spec import Option, Spec, finite_float


@register
class Highway(Connection):
    """``Highway(bias=b)``: T = σ(x W_T + b_T), W_T ∈ R^{h×h};  y = T ⊙ F(x) + (1 - T) ⊙ x.

    The transform gate reads x only (Fig. 2(a) of the SAS paper). b_T starts at ``bias`` (default -2) so
    that the block first favours the skip (Srivastava et al. 2015). In the conv layout the gate reads the
    per-channel spatial mean of x: one T per channel and example.
    """

    name = "Highway"
    options = {"bias": Option(-2.0, finite_float, "initial b_T of the transform gate")}
    patterns = {"Highway": "y = T ⊙ F + (1-T) ⊙ x, T = σ(x W_T + b_T)  (Highway Net transform gate, Fig. 2(a) of the SAS paper)"}

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        self.transform = nn.Linear(dim, dim)
        nn.init.constant_(self.transform.bias, spec.options["bias"])
        self._t: Tensor | None = None

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        t = unpool(torch.sigmoid(self.transform(pool_features(s, self.layout))), self.layout, s)
        self._t = t.detach()  # averaged only when stats() asks; autograd keeps t anyway
        self.record(T=t)
        f = branch(x)
        # s + T ⊙ (F - s) = T ⊙ F + (1 - T) ⊙ s in one kernel; lerp takes one dtype (under autocast a bf16 branch and
        # gate beside an fp32 stream), so the three in the dtype the written-out sum would promote to
        dtype = torch.promote_types(torch.promote_types(s.dtype, f.dtype), t.dtype)
        return torch.lerp(s.to(dtype), f.to(dtype), t.to(dtype))

    def stats(self) -> dict[str, Any]:
        return {"T": None if self._t is None else self._t.float().mean().item()}
