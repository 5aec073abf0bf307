"""Keel: a post-norm block with an inner pre-norm and a highway-scaled skip (Chen and Wei 2026, "Post-LayerNorm Is
Back: Stable, ExpressivE, and Deep", arXiv 2601.19895)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .base import Branch, Connection, register
from .fused import scaled_add
from .norms import make_norm
from .place import Place
from .spec import Spec


def keel_alpha(place: Place) -> float:
    """The skip's weight α of every block of the stack ``place`` is in: the stack's number of sub-layers, L layers
    × ``place.sublayers`` (OLMo-core's ``KeelTransformerBlock``: ``keel_alpha = 2 * n_layers``, "because KEEL counts
    attention and FFN as separate sublayers"; the paper's α is its depth counted in sub-layers). A decoder layer of
    three sub-layers (self-attention, cross-attention, feed-forward) counts three."""
    return float(place.layers * place.sublayers)


@register
class Keel(Connection):
    """``Keel[+LN|+RMS]``: y = G_out(α·x + F(G_in(x))), α the number of sub-layers of the stack (2L for a GPT's L
    layers; :func:`keel_alpha`), G_in the pre-norm the branch reads, G_out the norm of the sum (Chen and Wei 2026,
    arXiv 2601.19895: "Keel, a Post-LN Transformer that replaces this residual path with a Highway-style
    connection", x_{l+1} = LN(α·x_l + F(LN(x_l)))).

    The first layer's exceptions are OLMo-core's (allenai/OLMo-core ``src/olmo_core/nn/transformer/block.py``,
    ``KeelTransformerBlock``, read at commit a1f35ea; the docstring: "The first attention sublayer is plain Pre-LN,
    and the first FFN sublayer is Post-LN without alpha"): in layer 1 the first sub-layer is the pre-norm block
    y = x + F(G_in(x)) (no G_out: OLMo-core builds no ``post_attention_norm`` at ``block_idx == 0``), and its later
    sub-layers are y = G_out(x + F(G_in(x))), α = 1 (a decoder's cross-attention of layer 1, which OLMo-core's
    decoder-only blocks do not have, is treated as its feed-forward is). Every other sub-layer has α.

    The stack's output is the last sub-layer's G_out, already normalised: skiplab adds no final norm. OLMo-core's
    language models keep a norm in their output head whatever the block (``LMHeadConfig(layer_norm=...)`` in
    ``olmo_core/nn/transformer/config.py``), one more norm on a normalised output; skiplab leaves it out, as it
    does for ``PostLN`` and ``DeepNorm``. A stack whose only sub-layer is layer 1's first (one block of a one-layer
    stack) is that pre-norm block and ends un-normalised.

    G is the model's norm kind (LN or RMS; the paper's models and OLMo-core's use RMSNorm) unless the spec names
    one. No new parameters beyond the second norm; α is fixed.
    """

    reads_input = True  # G_in(x), before the branch

    name = "Keel"
    accepts_norms = ("LN", "RMS")
    default_norm = "LN"
    patterns = {"Keel[+RMS]": "y = G(α·x + F(G(x))), α = the stack's sub-layers (2L); layer 1: first sub-layer "
                              "x + F(G(x)), the others α = 1; no final norm  (Chen & Wei 2026, Keel; OLMo-core)"}

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        first_layer = self.place.layer == 1
        self.post = not (first_layer and self.place.sublayer == 1)
        self.alpha = 1.0 if first_layer else keel_alpha(self.place)
        self.norm_in = make_norm(spec.norm, self.in_dim, layout)  # G_in: the pre-norm the branch reads
        self.norm_out = make_norm(spec.norm, dim, layout) if self.post else None  # G_out: the sum's

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        f = branch(self.norm_in(x))
        if self.norm_out is None:
            return s + f
        h = scaled_add(s, self.alpha, f)
        y = self.norm_out(h)
        self.record(pre=h, post=y)
        return y

    def stats(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "post_norm": float(self.post)}

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", alpha={self.alpha:g}" if self.post else ", pre-norm")
