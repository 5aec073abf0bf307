"""HybridNorm: QKV-norm inside the attention, post-norm around the feed-forward network (Zhuo et al. 2025,
"HybridNorm: Towards Stable and Efficient Transformer Training via Hybrid Normalization", arXiv 2503.04598)."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor

from .base import Branch, Connection, register
from .norms import make_norm
from .place import Place
from .spec import Option, Spec, choice

ATTENTION_ROLES = ("attn", "cross")


@register
class HybridNorm(Connection):
    """``HybridNorm[+RMS](star=no|yes)``, a Transformer layer's connections by the role of their sub-layer:

        attention (self and cross):  y = x + Attn_QKV(x)      no norm on the residual path or the input: the
                                                              attention normalises its queries, keys and values
                                                              (the model's ``qk_norm=qkv``, which the design
                                                              requires and its recipe sets)
        feed-forward (any other):    y = G(x + FFN(x))         post-norm

    with a final norm G at the stack's end (the OLMo code the authors build on applies its ``ln_f`` after every
    block type; their repository holds configs, not model code, so that part is skiplab's reading). The
    authors' 1.2B dense config (BryceZhuo/HybridNorm ``dense_model/configs/exps/1.2B-dense-HybriedNorm.yaml``):
    ``use_query_norm``, ``use_key_norm``, ``use_value_norm: true``, ``attn_norm: false`` (no norm before the
    attention), ``ffn_norm: true`` with ``ffn_residual_after_norm: true`` (the FFN's norm after the residual sum),
    ``attn_residual_after_norm: false``. ``star=yes`` is HybridNorm* (the README's
    ``norm_pos_special_config="_{0:{'attn_norm':True,'ffn_residual':False}}_"``): the first layer is pre-norm in both
    sub-layers, y = x + F(G(x)). G is the model's norm unless the spec names one (the authors' models: RMSNorm).
    A connection built alone (no attention around it) is the post-norm form; the PreAct-ResNet, which has no
    attention, refuses the design.
    """

    name = "HybridNorm"
    accepts_norms = ("LN", "RMS")
    default_norm = "LN"
    options = {"star": Option("no", choice("no", "yes"), "yes: HybridNorm*, the first layer pre-norm")}
    patterns = {"HybridNorm[+RMS](star=no|yes)": "attention: y = x + Attn(x) with QKV-norm (qk_norm=qkv); FFN: "
                                                 "y = G(x + FFN(x)); star: layer 1 pre-norm; final norm  "
                                                 "(Zhuo et al. 2025, HybridNorm)"}
    recipe: ClassVar[dict[str, Any]] = {"qk_norm": "qkv"}
    model_requires: ClassVar[dict[str, Any]] = {"qk_norm": "qkv"}

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        role = self.place.role
        first = spec.options["star"] == "yes" and self.place.layer == 1
        self.at = "pre" if first else ("none" if role in ATTENTION_ROLES else "post")
        self.reads_input = self.at == "pre"  # layer 1's G(x), before the branch, at the input's width
        self.norm = None if self.at == "none" else make_norm(spec.norm, self.in_dim if first else dim, layout)

    @classmethod
    def final_norm_kind(cls, spec: Spec, layers: int) -> str | None:
        return spec.norm

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        if self.at == "pre":
            return s + branch(self.norm(x))
        if self.at == "none":
            return s + branch(x)
        h = s + branch(x)
        y = self.norm(h)
        self.record(pre=h, post=y)
        return y

    def stats(self) -> dict[str, Any]:
        return {"pre_norm": float(self.at == "pre"), "post_norm": float(self.at == "post")}

    def extra_repr(self) -> str:
        return super().extra_repr() + {"pre": ", pre-norm", "none": ", no norm", "post": ", post-norm"}[self.at]
