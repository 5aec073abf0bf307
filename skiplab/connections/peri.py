"""Norms around the sub-layer, never on the residual path: Sandwich-LN (Ding et al. 2021, CogView) and
Peri-LN (Kim et al. 2025, "Peri-LN: Revisiting Normalization Layer in the Transformer Architecture")."""

from __future__ import annotations

from torch import Tensor

from .base import Branch, Connection, register
from .norms import make_norm
from .place import Place
from .spec import Option, Spec, choice


class _Peri(Connection):
    """y = x + G_out(F(G_in(x))): the branch reads a normalised input and its output is normalised before it
    joins the skip; the skip path stays the identity, so the stack ends with a final norm."""

    reads_input = True  # G_in(x), before the branch

    accepts_norms = ("LN", "RMS", "DyT")
    default_norm = "LN"

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        self.norm_in = make_norm(spec.norm, self.in_dim, layout)
        self.norm_out = make_norm(spec.norm, dim, layout)

    @classmethod
    def final_norm_kind(cls, spec: Spec, layers: int) -> str | None:
        return spec.norm

    additive = True

    def branch_input(self, x: Tensor) -> Tensor:
        return self.norm_in(x)

    def branch_output(self, f: Tensor) -> Tensor:
        return self.norm_out(f)

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        return s + self.norm_out(branch(self.norm_in(x)))


@register
class PeriLN(_Peri):
    """``PeriLN[+RMS](embed=yes)``: y = x + LN(F(LN(x))) (Kim et al. 2025, arXiv 2502.02732: normalisation at
    the sub-layer's input and output, none on the residual path), the embeddings normalised once before the first
    layer (``embed=yes``: the paper's y_0 = Norm(x_embed), which it marks optional; skiplab turns it on by
    default; ``embed=no`` leaves them, as OLMo-core's ``PeriNormTransformerBlock`` does) and a final norm after
    the last, as the paper has before the output head."""

    name = "PeriLN"
    options = {"embed": Option("yes", choice("yes", "no"), "normalise the embeddings before the first layer")}
    patterns = {"PeriLN[+RMS](embed=yes|no)": "y = x + LN(F(LN(x))); embeddings normalised, final norm  "
                                             "(Kim et al. 2025, Peri-LN)"}

    @classmethod
    def input_norm_kind(cls, spec: Spec) -> str | None:
        return spec.norm if spec.options["embed"] == "yes" else None


@register
class SandwichLN(_Peri):
    """``SandwichLN[+RMS]``: y = x + LN(F(LN(x))) with no embedding norm and a final norm (Ding et al. 2021,
    CogView, "Sandwich-LN" among its training-stability techniques; THUDM/CogView ``mpu/sparse_transformer.py``: ``third_layernorm`` on
    the attention output and ``fourth_layernorm`` on the MLP's, ``final_layernorm`` after the stack)."""

    name = "SandwichLN"
    patterns = {"SandwichLN[+RMS]": "y = x + LN(F(LN(x))); final norm, no embedding norm  (Ding et al. 2021, CogView)"}
