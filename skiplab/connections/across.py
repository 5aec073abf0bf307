"""Designs across the layers of a stack, written after the connection: ``PreLN+ValueRes``, ``PreLN+UNet``,
``HC(n=4)+ValueRes(learn=yes)+UNet``.

A per-block connection sees one sub-layer; these designs carry state from one layer to later ones (the first
layer's attention values, the first half's outputs). A stack of layers (the LM's decoder, the Transformer's
encoder and its decoder) holds one :class:`Across` for its spec, the same object whatever the spec names,
and runs, in every forward pass::

    run = across.start()                 # this pass's state: V₁, the pushed outputs
    for i, layer in enumerate(layers):   # i = 0, ..., L − 1
        x = layer(run.enter(i, x), ..., values=run.values(i))   # values: applied to the self-attention's V
        run.leave(i, x)

Every quantity is per position, so a pass over new positions after cached ones (incremental decoding) is
exact: the cache of layer l holds the mixed values V'_l of the earlier positions. Where the stack holds
hyper-connections' n streams, the U-Net adds whole streams. The PreAct-ResNet has no stack of one width and
no attention, and refuses them.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch
from torch import Tensor, nn

from .base import ACROSS, parse_spec
from .spec import Option, Spec, choice, finite_float


def register_across(cls: type[AcrossDesign]) -> type[AcrossDesign]:
    """Class decorator: make ``cls`` usable after a connection spec as ``+name``."""
    ACROSS[cls.name] = cls
    return cls


class AcrossDesign(nn.Module):
    """One design across the layers of a stack of ``layers`` layers; the hooks leave everything as it is."""

    name: ClassVar[str]
    options: ClassVar[dict[str, Option]] = {}
    patterns: ClassVar[dict[str, str]]
    mixes_values: ClassVar[bool] = False
    first = 0  # the 0-based layer that the first entry of each stats() tensor belongs to

    def __init__(self, spec: Spec, layers: int):
        super().__init__()

    def enter(self, i: int, x: Tensor, state: dict[str, Any]) -> Tensor:
        """Layer i's input."""
        return x

    def leave(self, i: int, x: Tensor, state: dict[str, Any]) -> None:
        """Layer i's output, seen."""

    def values(self, i: int, v: Tensor, state: dict[str, Any]) -> Tensor:
        """Layer i's self-attention values V (B, H, T, d_head), as the attention uses and caches them."""
        return v

    def stats(self) -> dict[str, Tensor]:
        """What the design learned (or fixes): a 1-d tensor per quantity, one entry per layer from ``first`` on."""
        return {}

    def rows(self) -> list[tuple[int, str, float]]:
        """(layer index, quantity, value) for each entry of :meth:`stats`, for ``analyze gates``."""
        return [(self.first + j, key, float(v)) for key, t in self.stats().items() for j, v in enumerate(t)]


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
    options = {"lambda": Option(0.5, finite_float, "weight of the first layer's values"),
               "learn": Option("no", choice("no", "yes"), "yes: one lambda per layer, learned")}
    patterns = {"+ValueRes(lambda=0.5,learn=no|yes)": "V'_l = λ V_1 + (1 − λ) V_l in the self-attention of layers "
                                                      "l >= 2  (Zhou et al. 2025, ResFormer)"}
    mixes_values = True
    first = 1

    def __init__(self, spec: Spec, layers: int):
        super().__init__(spec, layers)
        lam = torch.full((max(layers - 1, 0),), float(spec.options["lambda"]))
        if spec.options["learn"] == "yes":
            self.lam = nn.Parameter(lam)
        else:
            self.register_buffer("lam", lam)

    def values(self, i: int, v: Tensor, state: dict[str, Any]) -> Tensor:
        if i == 0:
            state["v1"] = v
            return v
        return torch.lerp(v, state["v1"], self.lam[i - 1].to(v.dtype))  # v + λ(v₁ − v): exactly v at λ = 0

    def stats(self) -> dict[str, Tensor]:
        return {"value_lambda": self.lam.detach().cpu().clone()}  # entry l − 2 for layer l = 2, ..., L


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
    patterns = {"+UNet(init=1)": "layer L−1−i's input += w_i · (layer i's output), i < L/2, w_i learned from 1  "
                                 "(modded-nanogpt 2025-01 record)"}

    def __init__(self, spec: Spec, layers: int):
        super().__init__(spec, layers)
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


class Across(nn.Module):
    """The designs across a stack's layers that ``spec`` names after its connection (none: every hook is the
    identity); see the module docstring for how a stack runs them."""

    def __init__(self, spec: str, layers: int):
        super().__init__()
        self.designs = nn.ModuleList(ACROSS[s.name](s, layers) for s in parse_spec(spec).stack)
        self.mixes_values = any(d.mixes_values for d in self.designs)

    def start(self) -> Run:
        return Run(self)

    def stats(self) -> dict[str, dict[str, Tensor]]:
        """Each design's :meth:`AcrossDesign.stats`, by name."""
        return {d.name: d.stats() for d in self.designs}

    def extra_repr(self) -> str:
        return ", ".join(d.name for d in self.designs)


class Run:
    """One forward pass of a stack through its :class:`Across`: the state the designs keep in it."""

    __slots__ = ("across", "state")

    def __init__(self, across: Across):
        self.across, self.state = across, {}

    def enter(self, i: int, x: Tensor) -> Tensor:
        for d in self.across.designs:
            x = d.enter(i, x, self.state)
        return x

    def leave(self, i: int, x: Tensor) -> None:
        for d in self.across.designs:
            d.leave(i, x, self.state)

    def values(self, i: int) -> Callable[[Tensor], Tensor] | None:
        """What layer i's self-attention applies to its values, or None (the attention as it is)."""
        if not self.across.mixes_values:
            return None

        def mix(v: Tensor) -> Tensor:
            for d in self.across.designs:
                v = d.values(i, v, self.state)
            return v

        return mix

