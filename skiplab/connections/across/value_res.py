"""The value residual (ResFormer): the first layer's attention values mixed into every later layer's."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..spec import Option, Spec, choice, unit_interval
from .base import AcrossDesign, Stack, register_across


@register_across
class ValueRes(AcrossDesign):
    """``+ValueRes(lambda=0.5, learn=no|yes)``: value residual learning (Zhou et al., ACL 2025, "Value Residual
    Learning", ResFormer, arXiv 2410.17897, Eq. 5 with λ₁ = λ, λ₂ = 1 − λ): for layers l ≥ 2 the
    self-attention uses

        V'_l = λ_l · V_1 + (1 − λ_l) · V_l,   U_l = softmax(Q_l K_lᵀ / √d) V'_l,

    with V_1 the first layer's values of the same token and head (not detached). λ_l = 0.5 fixed is the
    paper's main setting and the reference code's (Zcchill/Value-Residual-Learning,
    ``modeling_llama_resformer.py``: ``value_states = 0.5 * V1 + 0.5 * value_states``); ``learn=yes`` makes
    one λ_l per layer a parameter starting at ``lambda`` (modded-nanogpt's learnable value-residual scalar,
    record 2024-11-06, which starts at 0.5). λ = 0 is the plain model exactly; λ = 1 uses V_1 in every layer
    (the paper's SVFormer).
    """

    name = "ValueRes"
    options = {"lambda": Option(0.5, unit_interval, "weight of the first layer's values, in [0, 1]"),
               "learn": Option("no", choice("no", "yes"), "yes: one lambda per layer, learned")}
    patterns = {"+ValueRes(lambda=0.5,learn=no|yes)": "V'_l = λ V_1 + (1 − λ) V_l in the self-attention of layers "
                                                      "l >= 2  (Zhou et al. 2025, ResFormer)"}
    mixes_values = True
    first = 1

    def __init__(self, spec: Spec, stack: Stack):
        super().__init__(spec, stack)
        layers = stack.layers
        lam = torch.full((max(layers - 1, 0),), float(spec.options["lambda"]))
        if spec.options["learn"] == "yes":
            self.lam = nn.Parameter(lam)
        else:
            self.register_buffer("lam", lam)

    def values(self, i: int, v: Tensor, state: dict[str, Any]) -> Tensor:
        if i == 0 or "v1" not in state:  # the first layer that runs gives V_1: layer 0, unless an analysis took it
            state["v1"] = v  # out (analyze redundancy's stack without layer 0), where layer 1 does
            return v
        return torch.lerp(v, state["v1"], self.lam[i - 1].to(v.dtype))  # v + λ(v₁ − v): exactly v at λ = 0

    def stats(self) -> dict[str, Tensor]:
        return {"value_lambda": self.lam.detach().cpu().clone()}  # entry l − 2 for layer l = 2, ..., L
