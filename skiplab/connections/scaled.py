"""Residual branches scaled by a learned gain that starts small: ReZero, SkipInit, LayerScale.

Each keeps the identity skip and multiplies the branch by a learned gain initialised at (or near) zero, so a
deep stack starts as (nearly) the identity map and each block's contribution grows as training finds it useful.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .base import Branch, Connection, register
from .norms import feature_axis, make_norm
from .place import Place
from .spec import Option, Spec, choice, finite_float


class _ScalarGate(Connection):
    """y = x + α·F(x), α one learned scalar per connection, α = ``init`` at start (0 by default)."""

    options = {"init": Option(0.0, finite_float, "initial value of α")}

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        self.alpha = nn.Parameter(torch.tensor(float(spec.options["init"])))

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        return s + self.alpha * branch(x)

    def stats(self) -> dict[str, Any]:
        return {"alpha": self.alpha.item()}


@register
class ReZero(_ScalarGate):
    """``ReZero(init=0, share=layer|sublayer)``: y = x + α·F(x), no normalisation, α a learned scalar starting at 0
    (Bachlechner et al. 2021, "ReZero is All You Need", Eq. 1: x_{i+1} = x_i + α_i F(x_i), "a single additional
    learned parameter per layer"). At initialisation every block is the identity.

    ``share=layer`` (the default): the sub-layers of a layer (attention and feed-forward; a decoder's
    self-attention, cross-attention and feed-forward) share one α, as the authors' code does
    (majumderb/rezero, ``rezero/transformer/rztx.py``: one ``resweight`` per encoder or decoder layer, used by
    each of its residual branches). Each connection is built with its own α; the model then makes its layers'
    later connections hold the first one's (:func:`~skiplab.connections.tie.tie_within_layers`, from the
    names in ``layer_shared``), so that the optimiser and the parameter count see one α per layer.
    ``share=sublayer``: each residual branch has its own α (Eq. 1 read per branch). Where a layer holds one
    connection (the PreAct-ResNet's blocks) the two are the same.
    """

    name = "ReZero"
    options = {**_ScalarGate.options,
               "share": Option("layer", choice("layer", "sublayer"), "one α per layer (the authors' code) or per sub-layer")}
    patterns = {"ReZero(init=a0,share=layer|sublayer)": "y = x + α·F(x), α learned scalar, α = 0 at start, no norm; one α "
                                                        "per layer or per sub-layer  (Bachlechner et al. 2021, Eq. 1)"}

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        self.layer_shared = ("alpha",) if spec.options["share"] == "layer" else ()


@register
class SkipInit(_ScalarGate):
    """``SkipInit(init=0)``: y = x + α·F(x), α a learned scalar at the end of the residual branch, initialised
    to 0 (or a small constant ≤ 1/√L), in a network without normalisation (De & Smith 2020, "Batch
    Normalization Biases Residual Blocks Towards the Identity Function in Deep Networks", Section 4; timm's
    NFNet ``skipinit_gain = nn.Parameter(torch.tensor(0.))``).

    The connection is ReZero's formula; what makes SkipInit is the network around it, whose branches hold no
    normalisation: in skiplab's Transformer and GPT the branches have none, in the PreAct-ResNet the branch keeps
    its batch norms (they belong to the block, not to the connection).
    """

    name = "SkipInit"
    patterns = {"SkipInit(init=a0)": "y = x + α·F(x), α learned scalar, α = 0 at start, normalisation-free "
                                     "network  (De & Smith 2020)"}


def layerscale_init(depth: int) -> float:
    """CaiT's initial λ for a stack of ``depth`` layers (Touvron et al. 2021, "Going deeper with Image
    Transformers", Section 3): 0.1 up to depth 18, 1e-5 up to depth 24, 1e-6 deeper. (The paper names depth 24
    for 1e-5; depths 19–23, which it does not name, take 1e-5 here. deit's ``cait_models.py`` sets XXS36 to
    1e-5, not the rule's 1e-6: skiplab follows the paper.)"""
    if depth <= 18:
        return 0.1
    return 1e-5 if depth <= 24 else 1e-6


def _depth_or_float(text: str) -> float | str:
    return "depth" if text == "depth" else finite_float(text)


@register
class LayerScale(Connection):
    """``LayerScale(init=depth)``: y = x + diag(λ)·F(LN(x)), λ ∈ R^d learned, one entry per feature (channel),
    every entry ``init`` at start; ``init=depth`` (the default) takes CaiT's rule from the stack's depth
    (:func:`layerscale_init`). Pre-norm: the stack ends with one final norm of the same kind. Touvron et al.
    2021, Section 3, Eq. "x'_l = x_l + diag(λ_{l,1},...,λ_{l,d}) × SA(η(x_l))"."""

    reads_input = True  # η(x), before the branch

    name = "LayerScale"
    accepts_norms = ("LN", "RMS", "DyT")
    default_norm = "LN"
    options = {"init": Option("depth", _depth_or_float, "initial λ, or depth: 0.1 (≤ 18 layers), 1e-5 (≤ 24), 1e-6")}
    patterns = {"LayerScale[+RMS](init=depth|ε)": "y = x + diag(λ)·F(LN(x)), λ = ε at start; ε by depth: 0.1 / "
                                                 "1e-5 / 1e-6  (Touvron et al. 2021, CaiT, Section 3)"}

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        init = spec.options["init"]
        value = layerscale_init(self.place.layers) if init == "depth" else float(init)
        self.scale = nn.Parameter(torch.full((dim,), value))
        self.norm = make_norm(spec.norm, self.in_dim, layout)

    @classmethod
    def final_norm_kind(cls, spec: Spec, layers: int) -> str | None:
        return spec.norm

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        lam = self.scale if feature_axis(self.layout) == -1 else self.scale.view(-1, *([1] * (s.dim() - 2)))
        return torch.addcmul(s, lam, branch(self.norm(x)))

    def stats(self) -> dict[str, Any]:
        lam = self.scale.detach()
        return {"lambda_mean": lam.mean().item(), "lambda_abs_max": lam.abs().max().item(), "lambda": lam.cpu().clone()}
