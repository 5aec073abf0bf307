"""Pre-norm residual blocks (the tutorial "Layer Normalization and Residual Connections")."""

from __future__ import annotations

import math
from typing import ClassVar

from torch import Tensor

from .base import Branch, Connection, register
from .norms import make_norm
from .place import Place
from .spec import Option, Spec, choice, nonnegative_float, options_of, positive_float

# The depth scaling of the branch, y = x + (L/L_base)^(−α) F(G(x)): every pre-norm design takes it.
DEPTH_OPTIONS = {
    "depth_alpha": Option(0.0, nonnegative_float, "α of the branch multiplier (L/L_base)^(-α), L the stack's "
                                                  "layers: 0.5 depth-μP, 1 CompleteP (0: none)"),
    "depth_base": Option(1.0, positive_float, "L_base of the branch multiplier (L/L_base)^(-α)"),
}


def depth_multiplier(layers: int, alpha: float, base: float) -> float:
    """(L/L_base)^(−α): the branch multiplier of a stack of L = ``layers`` layers (Yang et al. 2023, Tensor Programs
    VI, arXiv 2310.02244, and Bordelon et al. 2023, arXiv 2309.16620: α = ½, "depth-μP"; Dey et al. 2025,
    CompleteP, arXiv 2505.01618: α = 1; EleutherAI/nanoGPT-mup branch ``completep``, ``model.py``,
    ``Block.residual_scaling = 1/depth_multiplier**depth_alpha_exp`` with ``depth_multiplier = depth/base_depth``)."""
    return (layers / base) ** -alpha


class _PreNorm(Connection):
    """y = x + F(G(x)): the branch sees the normalised input, the skip path stays an identity.

    A stack of pre-norm blocks ends un-normalised; models add one final norm (the tutorial's
    ``final_norm``, the Transformer's last LayerNorm on each stack).

    With ``scale=depth`` (LayerNorm scaling, "LNS"; Sun et al. 2025, "The Curse of Depth in Large Language
    Models", Section 4, Eq. 12: "h(ℓ) = LayerNorm(h(ℓ)) × 1/√ℓ", ℓ = 1, ..., L): y = x + F(G(x)/√l), l the
    1-based index of the block's layer, the same factor for every sub-layer of layer l (lmsdss/LayerNorm-Scaling,
    ``peft_pretraining/modeling_llama.py``, ``scale_factor = 1 / math.sqrt(self.layer_index + 1)`` with a 0-based
    index, before attention and before the MLP;
    OLMo-core's ``LayerNormScaledTransformerBlock``). No new parameters; at l = 1 it is the plain pre-norm block.

    With ``depth_alpha=α`` and ``depth_base=L_base`` (:data:`DEPTH_OPTIONS`) the branch is scaled by a multiplier of
    the stack's depth L (``place.layers``), the same for every block: y = x + (L/L_base)^(−α) F(G(x))
    (:func:`depth_multiplier`; α = ½ depth-μP, α = 1 CompleteP). At α = 0 (the default) or L = L_base it is 1.

    G is ``spec.norm``: the one the name names (``PreLN``, ``PreRMS``, ``PreDyT``), or for ``LNS`` the model's.
    """

    reads_input = True  # G(x), before the branch

    options = {"scale": Option("none", choice("none", "depth"), "none, or depth: G(x) scaled by 1/sqrt(layer)"),
               **DEPTH_OPTIONS}
    depth_scaled: ClassVar[bool] = False  # scale=depth without the option (LNS)

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        self.norm = make_norm(spec.norm, self.in_dim, layout)  # G normalises x, the block input
        self.scaled = self.depth_scaled or spec.options.get("scale") == "depth"
        self.factor = 1.0 / math.sqrt(self.place.layer) if self.scaled else 1.0
        self.alpha = float(spec.options.get("depth_alpha", 0.0))
        self.multiplier = depth_multiplier(self.place.layers, self.alpha, float(spec.options.get("depth_base", 1.0)))

    @classmethod
    def final_norm_kind(cls, spec: Spec, layers: int) -> str | None:
        return spec.norm

    additive = True

    def branch_input(self, x: Tensor) -> Tensor:
        h = self.norm(x)
        return h if self.factor == 1.0 else h * self.factor

    def branch_output(self, f: Tensor) -> Tensor:
        return f if self.multiplier == 1.0 else f * self.multiplier

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        return s + self.branch_output(branch(self.branch_input(x)))

    def stats(self) -> dict[str, float]:
        return {**({"scale": self.factor} if self.scaled else {}),
                **({"depth_multiplier": self.multiplier} if self.alpha else {})}


@register
class PreLN(_PreNorm):
    """``PreLN``: y = x + F(LN(x)) (pre-norm Transformer block, GPT-2 / LLaMA style)."""

    name, default_norm = "PreLN", "LN"
    patterns = {"PreLN": "y = x + F(LN(x))  (pre-norm, the tutorial)",
                "PreLN(scale=depth)": "y = x + F(LN(x)/√l), l the layer's index  (LayerNorm scaling, Sun et al. 2025)",
                "PreLN(depth_alpha=1,depth_base=2)": "y = x + (L/L_base)^(-α) F(LN(x)), L the stack's layers  "
                                                     "(α = 1/2 depth-μP, Yang et al. 2023; α = 1 CompleteP, "
                                                     "Dey et al. 2025)"}


@register
class PreRMS(_PreNorm):
    """``PreRMS``: y = x + F(RMSNorm(x)), RMSNorm(x) = w ⊙ x / sqrt(mean(x²) + ε) (LLaMA style)."""

    name, default_norm = "PreRMS", "RMS"
    patterns = {"PreRMS": "y = x + F(RMSNorm(x))  (pre-norm with RMSNorm, the tutorial)"}


@register
class PreDyT(_PreNorm):
    """``PreDyT``: y = x + F(DyT(x)), DyT(x) = γ ⊙ tanh(αx) + β in place of every LN of the pre-norm block, the
    final norm a DyT too (Zhu et al. 2025, "Transformers without Normalization": DyT replaces each norm layer)."""

    name, default_norm = "PreDyT", "DyT"
    patterns = {"PreDyT(alpha0=0.5|llm)": "y = x + F(DyT(x)), DyT(x) = γ ⊙ tanh(αx) + β, α₀ = 0.5, or by "
                                          "the LLM recipe's site and width  (Zhu et al. 2025)"}


# The pre-norm design whose name names each norm.
PRE_NORM = {"LN": PreLN, "RMS": PreRMS, "DyT": PreDyT}


@register
class LNS(_PreNorm):
    """``LNS[+LN|+RMS|+DyT]``: LayerNorm scaling, y = x + F(G(x)/√l) (Sun et al. 2025, Section 4, Eq. 12), G the
    model's norm when the spec names none: the curse-of-depth paper's LLaMA models use RMSNorm, so on the LLaMA
    presets (norm RMS) ``LNS`` is ``PreRMS(scale=depth)``, on the GPT ones (LN) ``PreLN(scale=depth)``; built
    without a model it is LN. With a written norm it is that pre-norm design: ``LNS+RMS`` is
    ``PreRMS(scale=depth)`` (the canonical form)."""

    name, default_norm, accepts_norms = "LNS", "LN", ("LN", "RMS", "DyT")
    options = DEPTH_OPTIONS
    depth_scaled = True
    patterns = {"LNS[+RMS]": "y = x + F(G(x)/√l), G the model's norm unless named; LNS+RMS = PreRMS(scale=depth)  "
                             "(LayerNorm scaling, Sun et al. 2025)"}

    @classmethod
    def canonical(cls, spec: Spec) -> Spec:
        if not spec.norm_written:
            return spec
        target = PRE_NORM[spec.norm]
        options = {k: o.default for k, o in options_of(target, dyt=spec.norm == "DyT").items()}
        options.update({k: v for k, v in spec.options.items() if k in options}, scale="depth")
        return Spec(name=target.name, norm=target.default_norm, options=options, stack=spec.stack)
