"""The model side of nGPT, the normalised Transformer (Loshchilov et al., ICLR 2025, arXiv 2410.01131): what the GPT
builds around the ``nGPT`` connection (:mod:`skiplab.connections.ngpt`) so that every embedding, weight vector and
hidden state lies on the unit hypersphere.

    embeddings    rows of E (and of the output layer) unit-norm; no norm layer anywhere, no final norm  (Section 2.1)
    attention     q ← Norm(q) ⊙ s_qk,  k ← Norm(k) ⊙ s_qk  per head, after the rotary positions;
                  softmax(q kᵀ · √d_k) V: the scale √d_k, not 1/√d_k, since Norm(q)·Norm(k) is a cosine  (Section 2.3.2)
    MLP           u ← (W_u h) ⊙ s_u,  v ← (W_v h) ⊙ s_v √d,  W_o (u ⊙ SiLU(v))  (Section 2.4.2)
    logits        z ← (h Eᵀ) ⊙ s_z  (Section 2.1)
    after a step  every matrix renormalised along the embedding dimension (:func:`normalise_matrices`)

Each scaling vector s is learned in the paper's reparametrisation (:class:`~skiplab.connections.ngpt.ScaleVector`,
Section 2.5): s_qk from 1 with scale 1/√d (one vector of d entries, d_k per head, shared by q and k),
s_u and s_v from 1 with scale 1, s_z from 1 with scale 1/√d, one entry per row of the output layer.

Sources: NVIDIA/ngpt ``model.py`` (the authors' code: ``sqk`` after RoPE and the per-head ``justnorm``,
``softmax_scale = sqrt_head_dim``, ``sz``) and ``train.py`` (``normalize_matrices`` after every
``optimizer.step()``; ``weight_decay = 0.0``, ``warmup_iters = 0``); ai2-olmo-core 3.0.0's ``NormalizedAttention``,
``NormalizedFeedForward`` (SiLU's input scaled by s_v √d, the other by s_u, as the paper) and ``NormalizedLMHead``.
Two differences from OLMo-core, where skiplab follows the paper and the authors' code: OLMo-core normalises q and
k over all heads at once (its ``L2Norm`` on n_heads·d_k features) and scales them before the rotary positions.
The authors' MLP scales u as well as v by √d; skiplab scales v alone, as the paper and OLMo-core do.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import show_value
from ..connections import REGISTRY, parse_spec
from ..connections.ngpt import NGPT, ScaleVector, unit
from .linear import stacked_linear, xavier_linear

if TYPE_CHECKING:
    from .gpt import GPT

# the recipe's model fields the normalised model cannot do without (the output layer may be tied or not)
REQUIRED = ("mlp", "positions", "bias", "dropout")
AFTER_STEP = ("every weight matrix renormalised along the embedding dimension after each update (nGPT: rows of the "
              "embedding, the output layer, W_q, W_k, W_v and the MLP's input matrix; columns of W_O and the MLP's "
              "output matrix)")


def is_ngpt(connection: str) -> bool:
    """Whether a GPT whose connection is ``connection`` is the normalised Transformer."""
    return REGISTRY[parse_spec(connection).name] is NGPT



def check(cfg: Any) -> None:
    """Refuse, in one line, a GPT config with the ``nGPT`` connection that cannot be the normalised model."""
    if not is_ngpt(cfg.connection):
        return
    spec = parse_spec(cfg.connection)
    if cfg.qk_norm != "none":
        raise ValueError(f"qk_norm={cfg.qk_norm} means nothing with nGPT, which normalises queries and keys itself "
                         "(s_qk, after the rotary positions): use qk_norm=none")
    if spec.stack:
        raise ValueError(f"nGPT keeps every hidden state on the unit sphere; +{spec.stack[0].name} across the layers "
                         "is no part of it")
    wrong = [f"{k}={show_value(getattr(cfg, k))}" for k in REQUIRED if getattr(cfg, k) != NGPT.recipe[k]]
    if wrong:
        need = ", ".join(f"{k}={show_value(NGPT.recipe[k])}" for k in REQUIRED)
        raise ValueError(f"nGPT needs {need} (its paper's model), got {', '.join(wrong)}")


class QKNorm(nn.Module):
    """q ← Norm(q) ⊙ s_qk, k ← Norm(k) ⊙ s_qk, each head's d_k features normalised; the attention then scales its
    scores by √d_k (``softmax_scale``)."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.s_qk = ScaleVector(d_model, 1.0, 1.0 / math.sqrt(d_model))
        self.softmax_scale = math.sqrt(d_model // heads)

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:  # (B, H, T, d_k) each
        s = self.s_qk().view(self.heads, 1, -1)
        return (unit(q) * s).to(q.dtype), (unit(k) * s).to(k.dtype)  # the values' dtype (bf16 under autocast)


class NormalizedMLP(nn.Module):
    """W_o (u ⊙ SiLU(v)), u = (W_u h) ⊙ s_u, v = (W_v h) ⊙ s_v √d; W_v (SiLU's input, the first half) and W_u in
    one matmul (``up``), as :class:`~skiplab.models.gpt.MLP` stacks them; no biases."""

    def __init__(self, d_model: int, ffn_dim: int):
        super().__init__()
        self.up = stacked_linear(d_model, ffn_dim, 2, bias=False)
        self.down = xavier_linear(ffn_dim, d_model, bias=False)
        self.s_u = ScaleVector(ffn_dim, 1.0, 1.0)
        self.s_v = ScaleVector(ffn_dim, 1.0, 1.0)
        self.sqrt_d = math.sqrt(d_model)

    def projections(self) -> dict[str, list[Tensor]]:
        return {"ffn": [*self.up.weight.chunk(2, dim=0), self.down.weight]}

    def forward(self, x: Tensor) -> Tensor:
        v, u = self.up(x).chunk(2, dim=-1)
        return self.down(F.silu(v * (self.s_v() * self.sqrt_d)) * (u * self.s_u()))


class LogitScale(nn.Module):
    """z ← z ⊙ s_z, one entry per row of the output layer."""

    def __init__(self, rows: int, d_model: int):
        super().__init__()
        self.s_z = ScaleVector(rows, 1.0, 1.0 / math.sqrt(d_model))

    def forward(self, logits: Tensor) -> Tensor:
        return logits * self.s_z()


def unit_matrices(model: GPT) -> list[tuple[Tensor, int]]:
    """``(weight, dim)`` of every matrix of a normalised GPT and the dimension along which it is unit-norm: the
    embedding dimension, which is the rows (dim -1) of a matrix that reads the hidden state (the embedding and
    output layer, W_q, W_k, W_v, the MLP's ``up``) and the columns (dim 0) of one that writes it (W_O, ``down``)."""
    found = [(model.embed.weight, -1)] + ([(model.head.weight, -1)] if model.head is not None else [])
    for layer in model.layers:
        found += [(layer.attn.qkv_proj.weight, -1), (layer.attn.out_proj.weight, 0),
                  (layer.mlp.up.weight, -1), (layer.mlp.down.weight, 0)]
    return found


@torch.no_grad()
def normalise_matrices(model: GPT) -> None:
    """Every matrix of ``model`` back on the unit sphere (:func:`unit_matrices`), in place: NVIDIA/ngpt's
    ``normalize_matrices``, which its training loop runs once before the first step and after every
    ``optimizer.step()``; OLMo-core's ``NormalizedTransformer.normalize_matrices`` (``post_optim_step``)."""
    for weight, dim in unit_matrices(model):
        weight.copy_(unit(weight, dim))
