"""Backout: the output head reads the last layer's output less a learned share of a middle layer's
(modded-nanogpt)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..spec import Option, Spec, finite_float
from .base import AcrossDesign, Stack, register_across


def layer_index(text: str) -> int | str:
    """``auto`` (⌊2L/3⌋) or a 0-based layer index ≥ 0 (its upper bound is the stack's: checked where it is known)."""
    if text == "auto":
        return text
    if not text.isdigit():
        raise ValueError(f"must be auto or a layer index 0, 1, ..., got {text}")
    return int(text)


@register_across
class Backout(AcrossDesign):
    """``+Backout(layer=auto, init=0.5)``: backout (modded-nanogpt, record 2025-10-04 "Backout",
    ``records/100425_Backout/README.md``; ``train_gpt.py`` ``GPT.forward``: ``if i==8: x_backout=x`` after block i,
    then ``x -= backout_lambda*x_backout`` before ``x = norm(x)`` and ``logits = self.lm_head(x)``, with
    ``0.5*torch.ones(1), # backout_lambda`` and ``num_layers=12``). With x_L the last layer's output and x_k the
    output of layer k (0-based), the output head reads

        N(x_L − λ · x_k),   logits = N(x_L − λ · x_k) Eᵀ,

    N the stack's final norm; nothing else changes (every layer reads what it read without backout). λ is one
    learned scalar starting at ``init`` (0.5 in the record; nanochat's ``backout_lambda`` starts at 0.2). The record
    takes k = 8 of L = 12, "Layer 8 was chosen after implementing a lambda per_layer version"; ``layer=auto`` is
    k = ⌊2L/3⌋, which gives the record's 8 at L = 12 and the 7 of its later code at L = 11 (``if i == 7``;
    nanochat takes ``n_layer // 2``: ``layer=k``). A ``layer`` the stack has not (k ≥ L) is refused when the model's
    config is made. λ = 0 is the plain model exactly. The decoder-only model's alone: the record has no
    encoder-decoder form, and the Transformer refuses it.
    """

    name = "Backout"
    options = {"layer": Option("auto", layer_index, "k, the 0-based layer whose output is backed out: auto = ⌊2L/3⌋"),
               "init": Option(0.5, finite_float, "λ's starting value")}
    patterns = {"+Backout(layer=auto,init=0.5)": "the head reads N(x_L − λ·x_k), x_k layer k's output, k = ⌊2L/3⌋, "
                                                 "λ learned from 0.5  (modded-nanogpt 2025-10 record)"}
    families = ("lm",)

    def __init__(self, spec: Spec, stack: Stack):
        super().__init__(spec, stack)
        self.k = self.first = self.layer(spec, stack)  # its row in rows(): layer k
        self.lam = nn.Parameter(torch.tensor([float(spec.options["init"])]))

    @staticmethod
    def layer(spec: Spec, stack: Stack) -> int:
        """k: the ``layer`` option, auto resolved to ⌊2L/3⌋."""
        k = spec.options["layer"]
        return 2 * stack.layers // 3 if k == "auto" else k

    @classmethod
    def check(cls, spec: Spec, stack: Stack) -> str | None:
        k = cls.layer(spec, stack)
        if k < stack.layers:
            return None
        return f"+Backout(layer={k}) backs out layer {k}'s output; the stack's layers are 0, ..., {stack.layers - 1}"

    def leave(self, i: int, x: Tensor, state: dict[str, Any]) -> None:
        if i == self.k:
            state["backout"] = x

    def finish(self, x: Tensor, state: dict[str, Any]) -> Tensor:
        return x - self.lam.to(x.dtype) * state["backout"]

    def stats(self) -> dict[str, Tensor]:
        return {"backout_lambda": self.lam.detach().cpu().clone(), "backout_layer": torch.tensor([float(self.k)])}
