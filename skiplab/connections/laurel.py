"""LAuReL: the residual connection with learned weights or a learned low-rank linear term (Menghani, Kumar and
Kumar, ICML 2025, "LAuReL: Learned Augmented Residual Layer", arXiv 2411.07501): its three forms (RW, LR, PA) and
Gemma 3n's variant of its low-rank form."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import ACROSS, Branch, Connection, register
from .norms import feature_axis, make_norm
from .place import Place
from .spec import Option, Spec, SpecError, choice, positive_int

GEMMA_STD = 0.02  # transformers' Gemma3nTextConfig.initializer_range: N(0, 0.02²) for every linear layer


_rank = positive_int  # an integer >= 1


def column_orthogonal(rank: int, dim: int) -> Tensor:
    """The paper's initialisation of A for its LLMs (Section 3.3, footnote 2: "A_{i,j} = 1/√(rD) if i mod r = j and
    0 otherwise", i over the D features, j over the r ranks), as the (r, D) matrix that maps x to A x."""
    a = torch.zeros(rank, dim)
    i = torch.arange(dim)
    a[i % rank, i] = 1.0 / math.sqrt(rank * dim)
    return a


def _per_feature(fn, t: Tensor, layout: str) -> Tensor:
    """``fn`` (a map of the last axis) applied to the feature axis of ``t``: the last (seq) or 1 (conv)."""
    if feature_axis(layout) == -1:
        return fn(t)
    return fn(t.movedim(1, -1)).movedim(-1, 1)


@register
class LAuReL(Connection):
    """``LAuReL[+LN|+RMS](form=rw|lr|pa, rank=32, norm=none|rms, k=4)``, on a pre-norm block: G (the model's norm unless the
    spec names one) normalises the block input x for the branch, F sees h = G(x), and the skip term and LAuReL's
    linear term read the residual stream x itself, as the paper's x_i (its Eq. 2: x_{i+1} = α·f(x_i) +
    g(x_i, ..., x_0), with f the block's non-linear part; the paper's LLM experiments put LAuReL on pre-norm
    decoder blocks, so f(x_i) = F(G(x_i))). With a projection shortcut (the PreAct-ResNet's blocks that change
    stage) x on the skip side is proj(x), in the linear term too: g is the paper's function of the skip input. The
    stack ends with a final norm G, as every pre-norm stack.

    ``form=rw`` (Section 2.1, LAuReL-RW): y = α·F(h) + β·x, (α, β) = softmax(a, b), a and b learned scalars starting
    at 0, so α = β = ½ at the start. The paper: "we found that we cannot let α and β grow unbounded, and using a
    normalization function such as softmax or sigmoid helps"; skiplab takes the softmax. Two parameters.

    ``form=lr`` (Section 2.2, LAuReL-LR, Eq. 3): y = F(h) + x + B A x, A ∈ R^{r×D} maps x to r numbers and
    B ∈ R^{D×r} back, r = ``rank`` (the paper's LLMs use r = 4 and 64, its small-LLM ablation 32, and it finds
    r ∈ {32, 48, 64} "work well for LLMs"). Initialisation as the paper's LLMs (Section 3.3): B = 0, "similar to the
    scheme used in Hu et al. (2022)" (LoRA), and A its "column orthogonal initialization" (footnote 2:
    :func:`column_orthogonal`); the block starts as the plain pre-norm block. (The paper writes W = A×B + I with A,
    Bᵀ ∈ R^{D×r} and then Eq. 3 as B A x_i; skiplab follows Eq. 3, LoRA's order: A first, B zero.) 2rD parameters.

    ``norm=rms`` (``form=lr`` only), Gemma 3n's low-rank term as transformers 5.24 implements it
    (``Gemma3nTextLaurelBlock``: ``hidden_states + post_laurel_norm(linear_right(linear_left(hidden_states)))`` on
    the normalised input): y = x + F(h) + RMSNorm(B A h), the low-rank term read from h = G(x) and RMS-normalised
    (gain 1 at the start, ε of the model's norms); A and B are drawn from N(0, 0.02²) as transformers initialises
    Gemma 3n's linear layers, since RMSNorm of B A h = 0 would have no direction (and a gradient of 1/√ε). h has the
    block input's shape, so a block with a projection shortcut (a block input of another width or size) refuses
    it. Where Gemma 3n differs: it applies LAuReL around attention only and joins it as
    (x + G'(attn(h)) + h + RMSNorm(B A h)) / √2 (``Gemma3nTextDecoderLayer``: ``(attn_gated + laurel_output) /
    math.sqrt(2)``, G' its post-attention norm), so the normalised input h itself enters the stream and the sum is
    scaled by 1/√2; skiplab's spec puts the same low-rank term on every sub-layer (attention and feed-forward), keeps
    the identity skip x once, adds no h, has no G' and does not rescale.

    ``form=pa`` (Section 2.3, LAuReL-PA, "previous activations"): y = F(h) + x + Σ_{j=0}^{k−1} γ_j · B A x_{i−j},
    with x_{i−j} the input of the j-th sub-layer before this one in its stack (x_i = x itself, the embeddings'
    stream x₀ at the first sub-layer), k = ``k`` activations at most (fewer in the first k − 1 sub-layers), γ_j
    learned scalars and h_i = B A the layer's low-rank map, one for all j: the paper's 2rD + k parameters. Since
    h_i is linear, skiplab forms the mix Σ_j γ_j x_{i−j} first and applies B A once. A and B start as form=lr's
    (B = 0: the block starts as the plain pre-norm block); the paper gives no start for γ, and skiplab takes
    γ_j = 1 (each activation counted once, so k = 1 is form=lr with a learned scale on its term; γ = 0 would leave
    B without a gradient). The earlier inputs come from the stack (:class:`~skiplab.connections.across.Across`
    hands them over, most recent first): the connection alone, outside a stack, sees only j = 0; the
    PreAct-ResNet, whose stages change width, refuses k > 1, and so do activation checkpointing (a layer run twice
    would hand over its inputs twice) and the designs that run every sub-layer themselves.
    """

    reads_input = True  # G(x), before the branch

    name = "LAuReL"
    accepts_norms = ("LN", "RMS")
    default_norm = "LN"
    options = {"form": Option("rw", choice("rw", "lr", "pa"),
                              "rw: y = α·F + β·x, (α, β) = softmax; lr: y = F + x + B A x; "
                              "pa: y = F + x + Σ_j γ_j B A x_{i−j}"),
               "rank": Option(32, _rank, "form=lr or pa: the rank r of B A"),
               "k": Option(4, _rank, "form=pa: the activations mixed, this sub-layer's input and the k − 1 before it"),
               "norm": Option("none", choice("none", "rms"),
                              "form=lr: rms, Gemma 3n's low-rank term RMSNorm(B A G(x)) on the normalised input")}
    patterns = {"LAuReL[+RMS](form=rw)": "y = α·F(G(x)) + β·x, (α, β) = softmax(a, b), ½ each at start; final norm  "
                                         "(Menghani et al. 2025, LAuReL-RW)",
                "LAuReL[+RMS](form=lr,rank=r,norm=none|rms)": "y = F(G(x)) + x + B A x, rank r, B = 0 at start; "
                                                              "norm=rms: + RMSNorm(B A G(x)) (Gemma 3n); final norm  "
                                                              "(Menghani et al. 2025, LAuReL-LR)",
                "LAuReL[+RMS](form=pa,rank=r,k=4)": "y = F(G(x_i)) + x_i + B A Σ_{j<k} γ_j x_{i−j}, the inputs of the "
                                                    "k − 1 sub-layers before; B = 0, γ = 1 at start; final norm  "
                                                    "(Menghani et al. 2025, LAuReL-PA)"}

    @classmethod
    def canonical(cls, spec: Spec) -> Spec:
        options = spec.options
        if options["form"] == "rw" and (options["norm"] != "none" or options["rank"] != cls.options["rank"].default):
            raise SpecError("bad connection spec: LAuReL(form=rw) has no low-rank term; rank and norm=rms are "
                            "form=lr's: write LAuReL(form=lr,...)")
        if options["form"] != "pa" and options["k"] != cls.options["k"].default:
            raise SpecError(f"bad connection spec: k is form=pa's (the activations it mixes); LAuReL(form="
                            f"{options['form']}) reads its own input only")
        if options["form"] == "pa" and options["norm"] != "none":
            raise SpecError("bad connection spec: norm=rms is Gemma 3n's term on form=lr; form=pa mixes the raw "
                            "inputs of earlier sub-layers")
        if options["form"] == "pa" and options["k"] > 1:
            owner = next((s.name for s in spec.stack if ACROSS[s.name].runs_sublayers(s)), None)
            if owner:
                raise SpecError(f"bad connection spec: +{owner} runs every sub-layer itself, and LAuReL(form=pa) "
                                "needs the stack to hand each sub-layer the inputs of the ones before; give one")
        return spec

    @classmethod
    def previous_inputs(cls, spec: Spec) -> int:
        return spec.options["k"] - 1 if spec.options["form"] == "pa" else 0

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        self.norm = make_norm(spec.norm, self.in_dim, layout)  # G: the pre-norm the branch reads
        self.form, self.rank, self.k = spec.options["form"], spec.options["rank"], spec.options["k"]
        self.rms = spec.options["norm"] == "rms"
        if self.rms and self.in_dim != dim:
            raise ValueError(f"LAuReL(norm=rms) adds a term of the block input's shape ({self.in_dim} features) to an "
                             f"output of {dim}: a block with a projection shortcut has no place for it")
        if self.form == "rw":
            self.logits = nn.Parameter(torch.zeros(2))  # (a, b): (α, β) = softmax(a, b)
            return
        if self.rms:  # Gemma 3n: linear_left (A), linear_right (B) ~ N(0, 0.02²), post_laurel_norm at gain 1
            self.a = nn.Parameter(torch.randn(self.rank, dim) * GEMMA_STD)
            self.b = nn.Parameter(torch.randn(dim, self.rank) * GEMMA_STD)
            self.lr_norm = make_norm("RMS", dim, layout)
        else:
            self.a = nn.Parameter(column_orthogonal(self.rank, dim))
            self.b = nn.Parameter(torch.zeros(dim, self.rank))
        if self.form == "pa":
            self.gamma = nn.Parameter(torch.ones(self.k))  # γ_0 (this input), ..., γ_{k−1}

    @classmethod
    def final_norm_kind(cls, spec: Spec, layers: int) -> str | None:
        return spec.norm

    def low_rank(self, t: Tensor) -> Tensor:
        """B A t over the feature axis; with ``norm=rms``, RMSNorm(B A t)."""
        z = _per_feature(lambda u: F.linear(F.linear(u, self.a), self.b), t, self.layout)
        return self.lr_norm(z) if self.rms else z

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None,
                previous: tuple[Tensor, ...] = ()) -> Tensor:
        """``previous`` (form=pa): the inputs of the sub-layers before this one in its stack, most recent first."""
        s = x if skip is None else skip(x)
        h = self.norm(x)
        f = branch(h)
        if self.form == "rw":
            w = torch.softmax(self.logits, 0)
            return w[0] * f + w[1] * s
        if self.rms and skip is not None:
            raise ValueError("LAuReL(norm=rms) reads the normalised block input, which a projection shortcut's "
                             "output need not match: use form=lr without norm=rms there")
        if self.form == "pa":
            g = self.gamma.to(s.dtype)
            mix = g[0] * s
            for j, earlier in enumerate(previous[: self.k - 1], start=1):
                mix = mix + g[j] * earlier
            return s + f + self.low_rank(mix)
        return s + f + self.low_rank(h if self.rms else s)

    @torch.no_grad()
    def stats(self) -> dict[str, Any]:
        if self.form == "rw":
            alpha, beta = torch.softmax(self.logits, 0).tolist()
            return {"alpha": alpha, "beta": beta}
        # ‖B A‖_F from the r×r products: ‖BA‖²_F = tr((BᵀB)(A Aᵀ))
        ba = torch.trace((self.b.t() @ self.b) @ (self.a @ self.a.t())).clamp_min(0).sqrt().item()
        out = {"rank": self.rank, "ba_norm": ba}
        if self.form == "pa":
            out.update({f"pa_gamma_{j}": v for j, v in enumerate(self.gamma.tolist())})
        if self.rms:
            out["gain_mean"] = self.lr_norm.weight.mean().item()
        return out

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", form={self.form}" + (f", rank={self.rank}" if self.form != "rw" else "")
                + (f", k={self.k}" if self.form == "pa" else ""))
