"""The speedrun's residual scalars: learned numbers that scale the residual stream and add the stack's input back,
once a layer (nanochat) or on every sub-layer's skip path (modded-nanogpt)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..base import Branch, Connection
from ..spec import Option, Spec, choice, format_number
from .base import AcrossDesign, Stack, register_across

# The codes' starting values ("v" everywhere, "v0:v1" a line over the layers), by ``per``.
AUTO = {"layer": {"a": "1.15:1.05", "b": "0.2:0.05"},        # nanochat GPT.init_weights
        "sublayer": {"a": format_number(math.sqrt(1.1)), "b": "0"}}  # modded-nanogpt GPT.__init__


def ramp(text: str) -> str:
    """A starting value for every layer: ``auto`` (the code's, by ``per``), a number ``v``, or ``v0:v1``, a line
    from the first layer's v0 to the last layer's v1; written back in its shortest form."""
    if text == "auto":
        return text
    ends = text.split(":")
    if len(ends) > 2:
        raise ValueError(f"must be auto, a number or first:last, got {text}")
    values = [float(v) for v in ends]
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"must be finite, got {text}")
    if len(values) == 2 and values[0] == values[1]:
        values = values[:1]
    return ":".join(format_number(v) for v in values)


def starts(text: str, layers: int) -> Tensor:
    """The values of :func:`ramp` text at layers i = 0, ..., L − 1: v0 − (v0 − v1) · i / max(L − 1, 1), the line of
    nanochat's ``1.15 - (0.10 * i / max(n_layer - 1, 1))``."""
    v0, v1 = ([float(v) for v in text.split(":")] * 2)[:2]
    return torch.tensor([v0 - (v0 - v1) * i / max(layers - 1, 1) for i in range(layers)])


@register_across
class Scalars(AcrossDesign):
    """``+Scalars(per=layer|sublayer, a=auto, b=auto)``: the speedrun's residual scalars, learned numbers a and b
    that scale the residual stream x and add back the stack's input x₀ (the embeddings as the model hands them to its
    first layer: after its input module, with learned positions where it has them; nanochat and modded-nanogpt norm
    their embeddings into x₀, skiplab's pre-norm GPT does not).

    ``per=layer`` (nanochat ``nanochat/gpt.py``, ``GPT.forward``: ``x = self.resid_lambdas[i] * x +
    self.x0_lambdas[i] * x0``, then ``x = block(x, ...)``): before layer i reads its input,

        u_i = a_i · x_i + b_i · x₀,   x_{i+1} = Layer_i(u_i),

    so every sub-layer of layer i, skip and branch, works on u_i: with ``PreLN``, h = u_i + Attn(LN(u_i)) and
    x_{i+1} = h + MLP(LN(h)). The start (``GPT.init_weights``): a_i = 1.15 − 0.10 · i / max(L − 1, 1) and
    b_i = 0.20 − 0.15 · i / max(L − 1, 1), i = 0, ..., L − 1 (``a=auto``: ``a=1.15:1.05``, ``b=auto``:
    ``b=0.2:0.05``). modded-nanogpt's ``Block.forward`` had this form too, ``x = lambdas[0] * x + lambdas[1] * x0``
    before its attention and MLP, from [1, 0] (record 2025-10-04, ``records/100425_Backout``).

    ``per=sublayer`` (modded-nanogpt ``train_gpt.py`` of record #253, 2026-04-18, the last before the MUDDFormer
    connections of #259; the x₀ scalars became MUDD gates in #315; ``GPT.forward``:
    ``attn_out = attn(norm(attn_in), ...)``,
    ``x = resid_lambdas_attn[i] * x + post_lambdas_attn[i] * attn_out + x0_inject[i]`` with
    ``x0_inject[i] = x0 * x0_lambdas[i]``, then ``x = resid_lambdas_mlp[i] * x + post_lambdas_mlp[i] *
    ReLUSqrdMLP(norm(x), ...)``): the scalars act on the skip path alone, the branch reads the unscaled x. Sub-layer
    k = i·S + s (S sub-layers a layer) runs its connection with the skip path

        skip(x) = a_k · x + [s = 0] · b_i · x₀,   y = conn(x, F, skip)

    (with ``PreLN``: y = a_k · x + [s = 0] · b_i · x₀ + F(LN(x)); with ``PostLN``: LN(a_k · x + [s = 0] · b_i · x₀ +
    F(x))): a per sub-layer, b per layer, x₀ joining at each layer's first sub-layer (the self-attention), as
    ``x0_inject`` joins the attention's sum. The start (``GPT.__init__``): a_k = √1.1 (``torch.full((num_layers,
    2), 1.1**0.5)``, "sqrt(1.1) per sublayer so cumulative per-layer scaling is 1.1"; ``a=auto``), b_i = 0
    (``torch.zeros(num_layers)``; ``b=auto``). The code's ``post_lambdas`` (the branch's own scale, from 1) and
    bigram embeddings are not part of this design. HC's streams take no skip path: refused, ``per=layer`` scales
    the streams whole.

    ``a`` and ``b`` may name the start: a number for every layer, or ``v0:v1``, a line from the first layer to the
    last (per sub-layer: each sub-layer of layer i starts at layer i's value). a = 1, b = 0 is the plain model
    exactly. Each a and b is a learned parameter; every quantity is per position, so incremental decoding is exact.
    """

    name = "Scalars"
    options = {"per": Option("layer", choice("layer", "sublayer"),
                             "layer: a, b before each layer (nanochat); sublayer: on each sub-layer's skip "
                             "(modded-nanogpt)"),
               "a": Option("auto", ramp, "a's start: auto (the code's), v, or first:last over the layers"),
               "b": Option("auto", ramp, "b's start: auto (the code's), v, or first:last over the layers")}
    patterns = {"+Scalars(per=layer|sublayer,a=auto,b=auto)": "layer: layer i reads a_i·x + b_i·x₀ (nanochat); "
                                                              "sublayer: skip a_k·x + b_i·x₀ (modded-nanogpt)"}

    def __init__(self, spec: Spec, stack: Stack):
        super().__init__(spec, stack)
        per = spec.options["per"]
        self.per, self.roles = per, stack.roles
        self.owns_sublayers = per == "sublayer"  # runs each sub-layer with its own skip path
        a, b = (starts(AUTO[per][q] if spec.options[q] == "auto" else spec.options[q], stack.layers) for q in "ab")
        self.a = nn.Parameter(a if per == "layer" else a[:, None].repeat(1, len(stack.roles)))  # (L,) or (L, S)
        self.b = nn.Parameter(b)  # (L,)

    @classmethod
    def runs_sublayers(cls, spec: Spec) -> bool:
        return spec.options["per"] == "sublayer"

    @classmethod
    def conflict(cls, spec: Spec, named: str, registry: dict[str, type], across: dict[str, type]) -> str | None:
        """``per=sublayer`` runs every sub-layer with a skip path of its own: a connection without one (HC's
        streams) or another design that runs the sub-layers means nothing with it."""
        if cls.runs_sublayers(next(s for s in spec.stack if s.name == cls.name)) and registry[spec.name].needs_stack:
            return f"+{cls.name}(per=sublayer) scales the skip path, which {named}'s streams have not; use per=layer"
        if cls.runs_sublayers(next(s for s in spec.stack if s.name == cls.name)) and not registry[spec.name].has_skip:
            return f"+{cls.name}(per=sublayer) scales the skip path, which {named} has not (y = F(x)); use per=layer"
        return super().conflict(spec, named, registry, across)

    def begin(self, x: Tensor, state: dict[str, Any]) -> None:
        state["scalars_x0"] = x

    def enter(self, i: int, x: Tensor, state: dict[str, Any]) -> Tensor:
        if self.per != "layer":
            return x
        return self.a[i].to(x.dtype) * x + self.b[i].to(x.dtype) * state["scalars_x0"]

    def sublayer(self, k: int, x: Tensor, conn: Connection, branch: Branch, state: dict[str, Any]) -> Tensor:
        i, s = divmod(k, len(self.roles))
        a = self.a[i, s].to(x.dtype)
        if s:
            return conn(x, branch, lambda h: a * h)
        b, x0 = self.b[i].to(x.dtype), state["scalars_x0"]
        return conn(x, branch, lambda h: a * h + b * x0)

    def stats(self) -> dict[str, Tensor]:
        a = self.a.detach().cpu().clone()
        if self.per == "layer":
            return {"resid_lambda": a, "x0_lambda": self.b.detach().cpu().clone()}
        scales = {f"resid_lambda_{role}": a[:, s] for s, role in enumerate(self.roles)}
        return {**scales, "x0_lambda": self.b.detach().cpu().clone()}  # a per sub-layer, by role; b per layer
