"""DeepNorm: post-norm with an up-weighted skip and down-scaled branch weights (Wang et al. 2022, "DeepNet:
Scaling Transformers to 1,000 Layers", Section 4 and Fig. 2)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .base import Branch, Connection, register
from .fused import scaled_add
from .norms import make_norm
from .place import Place
from .spec import Spec


def deepnorm_constants(place: Place) -> tuple[float, float]:
    """(α, β) of DeepNet's Fig. 2 table for the stack ``place`` is in, N encoder and M decoder layers:

        encoder-only     α = (2N)^¼,               β = (8N)^−¼
        decoder-only     α = (2M)^¼,               β = (8M)^−¼
        encoder-decoder  encoder α = 0.81 (N⁴M)^{1/16}, β = 0.87 (N⁴M)^{−1/16};  decoder α = (3M)^¼, β = (12M)^−¼

    (microsoft/torchscale's ``encoder.py`` divides the encoder's weights by (N⁴M)^{1/16}/1.15, a β 1.15
    (N⁴M)^{−1/16}, where the paper has 0.87 = 1/1.15: skiplab follows the paper.)"""
    n, m = place.encoder_layers, place.decoder_layers
    if place.architecture == "encoder-only":
        return (2 * n) ** 0.25, (8 * n) ** -0.25
    if place.architecture == "decoder-only":
        return (2 * m) ** 0.25, (8 * m) ** -0.25
    if place.stack == "encoder":
        return 0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)
    return (3 * m) ** 0.25, (12 * m) ** -0.25


@register
class DeepNorm(Connection):
    """``DeepNorm[+RMS]``: y = LN(α·x + F(x)) (DeepNet, Eq. in Fig. 2: ``x = LN(x * α + f(x))``), α and β from
    the model's shape (:func:`deepnorm_constants`); the branch's value, output and feed-forward projections
    are drawn Xavier-normal with gain β, its query and key projections Xavier-normal with gain 1 (Fig. 2's
    ``init``: ``xavier_normal_(w, gain=β)`` for ffn, v_proj, out_proj; ``gain=1`` for q_proj, k_proj).
    Post-norm: the stack has no final norm. In a CNN the block's convolutions keep their own initialisation
    (DeepNet's β is derived for attention and feed-forward sub-layers); α applies.
    """

    name = "DeepNorm"
    accepts_norms = ("LN", "RMS", "DyT")
    default_norm = "LN"
    patterns = {"DeepNorm[+RMS]": "y = LN(α·x + F(x)); α, β by depth and architecture; β on F's v, out, ffn "
                                  "weights  (Wang et al. 2022, DeepNet, Fig. 2)"}

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        self.alpha, self.beta = deepnorm_constants(self.place)
        self.norm = make_norm(spec.norm, dim, layout)

    @torch.no_grad()
    def init_branch(self, weights: dict[str, list[Tensor]]) -> None:
        for role, gain in (("query", 1.0), ("key", 1.0), ("value", self.beta), ("output", self.beta),
                           ("ffn", self.beta)):
            for w in weights.get(role, []):
                nn.init.xavier_normal_(w, gain=gain)

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        h = scaled_add(s, self.alpha, branch(x))
        y = self.norm(h)
        self.record(pre=h, post=y)
        return y

    def stats(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "beta": self.beta}
