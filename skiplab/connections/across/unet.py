"""U-Net skips across a stack: layer ⌊L/2⌋ + i reads layer ⌊L/2⌋ − 1 − i's output (modded-nanogpt)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..spec import Option, Spec, finite_float
from .base import AcrossDesign, Stack, register_across


@register_across
class UNet(AcrossDesign):
    """``+UNet(init=1)``: U-Net skips across the stack (modded-nanogpt, record 2025-01-16 "Sub3Min",
    ``records/track_1_short/2025-01-16_Sub3Min/1d3bd93b-….txt``: ``num_encoder_layers = num_layers // 2``,
    ``skip_weights = nn.Parameter(torch.ones(num_decoder_layers))``; the first half appends each layer's output
    to ``skip_connections``; the second half's layer i first does
    ``x = x + self.skip_weights[i] * skip_connections.pop()``). With h = ⌊L/2⌋ and y_j layer j's output:

        input of layer h + i  =  x + w_i · y_{h−1−i},   i = 0, ..., h − 1   (last in, first out)

    so layer L − 1 − i receives layer i's output (L even). The w_i are learned, starting at ``init`` (1 in the
    code). For odd L the last layer has no partner and no weight (the code takes L even: its ``pop`` would fail).
    """

    name = "UNet"
    options = {"init": Option(1.0, finite_float, "the skip weights' starting value")}
    patterns = {"+UNet(init=1)": "h = ⌊L/2⌋: layer h+i's input += w_i · (layer h−1−i's output), i < h "
                                 "(L even: layer L−1−i reads layer i), w_i learned from 1  (modded-nanogpt 2025-01 "
                                 "record)"}

    def __init__(self, spec: Spec, stack: Stack):
        super().__init__(spec, stack)
        layers = stack.layers
        self.half = self.first = layers // 2
        self.weight = nn.Parameter(torch.full((self.half,), float(spec.options["init"])))

    def enter(self, i: int, x: Tensor, state: dict[str, Any]) -> Tensor:
        j = i - self.half
        if 0 <= j < self.half:
            x = x + self.weight[j].to(x.dtype) * state["unet"].pop()
        return x

    def leave(self, i: int, x: Tensor, state: dict[str, Any]) -> None:
        if i < self.half:
            state.setdefault("unet", []).append(x)

    def stats(self) -> dict[str, Tensor]:
        return {"skip_weight": self.weight.detach().cpu().clone()}  # w_i, entering layer ⌊L/2⌋ + i
