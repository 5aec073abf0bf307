"""Multi-head attention on ``F.scaled_dot_product_attention``, with a key/value cache for decoding.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + mask) V,   heads concatenated, then W_O
    (Vaswani et al. 2017, Eqs. 1-2). Dropout acts on the attention weights.

Self-attention projects Q, K and V with one matmul (``qkv_proj``, the three d x d matrices stacked);
cross-attention projects Q from the decoder and K, V from the encoder output with one matmul
(``kv_proj``), once per sentence. Every projection is Xavier-uniform with a zero bias
(:mod:`skiplab.models.linear`); a stacked one draws each d x d slice as its own layer would (bound
sqrt(6 / 2d)), in the order separate layers would, so a seed gives the weights that separate Q, K, V
layers would get. Checkpoints with separate ``q_proj``/``k_proj``/``v_proj`` load: their keys are
stacked on loading. A causal self-attention passes ``is_causal=True`` instead of a
materialised mask, so that the fused kernels (flash, memory-efficient) may run on a GPU.

QK-norm (``qk_norm``, :class:`HeadNorm`): queries and keys normalised, each with its own gain, after their
projection and before the rotary positions and the dot product,

    head:  q_h ← Norm(q_h), k_h ← Norm(k_h) for each head h, one norm of d/H features shared by the heads
           (Qwen 3, Yang et al. 2025, arXiv 2505.09388, "Architecture"; transformers ``Qwen3Attention``:
           ``q_norm``/``k_norm`` = RMSNorm(head_dim) before ``apply_rotary_pos_emb``)
    all:   q ← Norm(q), k ← Norm(k) over the d features of the concatenated heads (OLMo 2, Team OLMo 2024,
           arXiv 2501.00656; transformers ``Olmo2Attention``: RMSNorm(heads · head_dim) on the
           projections, then the rotary positions)

    qkv:   q ← Norm(q), k ← Norm(k), v ← Norm(v), each over the d features (HybridNorm's QKV-norm, Zhuo et al.
           2025, arXiv 2503.04598; BryceZhuo/HybridNorm's configs: ``use_query_norm``, ``use_key_norm``,
           ``use_value_norm`` on OLMo's norms of d_model features), the values after their projection and
           before anything mixes them (the value residual, the cache)

Norm is the model's norm kind (RMSNorm on RMS models, LayerNorm on LN models) at the model's eps. Cross-attention
normalises its decoder queries and its encoder keys the same way (the keys once per sentence).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..connections.norms import EPS, make_norm
from .linear import stacked_linear, xavier_linear

# QK-norm: none, per head (Qwen 3), across the heads (OLMo 2), and the values too (HybridNorm's QKV-norm)
QK_NORMS = ("none", "head", "all", "qkv")


class HeadNorm(nn.Module):
    """Norm of a projection (B, T, D) per head (``over="head"``: D/H features each, the heads sharing the norm's
    gain) or across the heads (``over="all"``: the D features at once). ``kind`` LN or RMS, with eps ``eps``."""

    def __init__(self, over: str, kind: str, d_model: int, heads: int, eps: float = EPS):
        super().__init__()
        self.groups = heads if over == "head" else 1
        self.norm = make_norm(kind, d_model // self.groups)
        self.norm.eps = float(eps)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, T, G, D/G) normalised -> (B, T, D)
        b, t, d = x.shape
        return self.norm(x.view(b, t, self.groups, d // self.groups)).view(b, t, d)


def check_qk_norm(qk_norm: str) -> None:
    """A one-line ValueError for a ``qk_norm`` that is not one of :data:`QK_NORMS`."""
    if qk_norm not in QK_NORMS:
        raise ValueError(f"qk_norm must be one of {', '.join(QK_NORMS)}, got {qk_norm!r}")


class _Attention(nn.Module):
    """Heads, dropout and the output projection W_O shared by self- and cross-attention."""

    # checkpoint keys of separate projections -> the stacked one that replaces them (see _stack_old_keys)
    stacks: dict[str, tuple[str, ...]] = {}
    softmax_scale: float | None = None  # the scores' factor; None: 1/sqrt(d_k)

    def __init__(self, d_model: int, heads: int, dropout: float, qk_norm: str = "none", norm: str = "LN",
                 eps: float = EPS):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by the number of heads ({heads})")
        check_qk_norm(qk_norm)
        self.heads, self.dropout = heads, dropout
        # QK-norm: the queries' and the keys' norms (each its own gain), or None
        over = "all" if qk_norm == "qkv" else qk_norm
        self.q_norm = None if qk_norm == "none" else HeadNorm(over, norm, d_model, heads, eps)
        self.k_norm = None if qk_norm == "none" else HeadNorm(over, norm, d_model, heads, eps)
        self.v_norm = HeadNorm("all", norm, d_model, heads, eps) if qk_norm == "qkv" else None
        self._register_load_state_dict_pre_hook(self._stack_old_keys)

    def split(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, H, T, D/H)
        b, t, d = x.shape
        return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False) -> Tensor:
        """Heads (B, H, T, D/H) attend; ``mask`` (B, 1|H, T|1, S) is True where attention is allowed."""
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                             dropout_p=self.dropout if self.training else 0.0,
                                             scale=self.softmax_scale)
        b, h, t, dh = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, t, h * dh))

    def _stack_old_keys(self, state: dict, prefix: str, *args) -> None:
        """Stack ``q_proj``/``k_proj``/``v_proj`` entries of a checkpoint written before the projections were
        stacked into the one layer that replaces them."""
        for stacked, parts in self.stacks.items():
            for kind in ("weight", "bias"):
                old = [f"{prefix}{p}.{kind}" for p in parts]
                if all(k in state for k in old) and f"{prefix}{stacked}.{kind}" not in state:
                    state[f"{prefix}{stacked}.{kind}"] = torch.cat([state.pop(k) for k in old])


def _rows(linear: nn.Linear, parts: int) -> list[Tensor]:
    """The ``parts`` row blocks of a stacked projection's weight, as views (an init redraws them in place)."""
    return list(linear.weight.chunk(parts, dim=0))


class SelfAttention(_Attention):
    """Queries, keys and values from the same sequence, through one stacked projection ``qkv_proj``; with
    ``rope``, queries and keys are rotated by their positions (:class:`Rotary`) before they meet; ``qk`` then maps
    the rotated queries and keys, and sets the scores' factor (nGPT's :class:`~skiplab.models.ngpt.QKNorm`).
    ``qk_norm`` (none, head, all, qkv) normalises queries and keys before the rotary positions (qkv: and the
    values) with the ``norm`` kind at ``eps`` (the module docstring)."""

    stacks = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}

    def __init__(self, d_model: int, heads: int, dropout: float = 0.0, bias: bool = True,
                 rope: Rotary | None = None, qk: nn.Module | None = None, qk_norm: str = "none", norm: str = "LN",
                 eps: float = EPS):
        super().__init__(d_model, heads, dropout, qk_norm, norm, eps)
        self.qkv_proj = stacked_linear(d_model, d_model, 3, bias)
        self.out_proj = xavier_linear(d_model, d_model, bias)
        self.rope = rope
        self.qk = qk
        if qk is not None:
            self.softmax_scale = qk.softmax_scale

    def projections(self) -> dict[str, list[Tensor]]:
        """The weights by role, for a connection that re-initialises its branch (``Connection.init_branch``)."""
        q, k, v = _rows(self.qkv_proj, 3)
        return {"query": [q], "key": [k], "value": [v], "output": [self.out_proj.weight]}

    def forward(self, x: Tensor, mask: Tensor | None = None, causal: bool = False,
                cache: dict[str, Tensor] | None = None, values: Callable[[Tensor], Tensor] | None = None,
                kv: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """``x`` (B, T, D) attends to itself: under the padding ``mask`` (encoder) or ``causal``ly (decoder:
        position i sees positions <= i). With a ``cache`` (incremental decoding) x holds the new positions;
        their keys and values are appended to the cached ones of the earlier positions. ``values`` maps the
        values (B, H, T, D/H) before they are used and cached (a value residual, :mod:`skiplab.connections.across`).
        ``kv``: the inputs (B, T, D) the keys and the values are projected from, at the same positions as x, where
        they are not x (MUDD's separate query, key and value streams); the same weights, three matmuls."""
        if kv is None:
            q, k, v = self.qkv_proj(x).chunk(3, dim=-1)
        else:
            biases = (None,) * 3 if self.qkv_proj.bias is None else self.qkv_proj.bias.chunk(3)
            q, k, v = (F.linear(t, w, b) for t, w, b in zip((x, *kv), self.qkv_proj.weight.chunk(3), biases))
        if self.q_norm is not None:  # QK-norm, before the rotary positions (Qwen 3, OLMo 2)
            q, k = self.q_norm(q), self.k_norm(k)
        if self.v_norm is not None:  # HybridNorm's QKV-norm
            v = self.v_norm(v)
        q, k, v = self.split(q), self.split(k), self.split(v)
        if values is not None:
            v = values(v)
        past = cache["k"].shape[2] if cache is not None and "k" in cache else 0
        if self.rope is not None:
            q, k = self.rope(q, past), self.rope(k, past)
        if self.qk is not None:
            q, k = self.qk(q, k)
        if cache is None:  # training and full decoding: no branch on shapes (compiles to one graph)
            return self.attend(q, k, v, mask, causal=causal)
        if past:
            k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
        cache["k"], cache["v"] = k, v
        t = q.shape[2]
        if causal and past and t > 1:  # new positions after cached ones: the diagonal sits at the bottom right
            mask = torch.ones(t, past + t, dtype=torch.bool, device=x.device).tril(past)[None, None]
        return self.attend(q, k, v, mask, causal=causal and not past)


class CrossAttention(_Attention):
    """Queries from the decoder, keys and values from the encoder output (``kv_proj``, one matmul); ``qk_norm``
    normalises the queries and the keys (with ``qkv`` the values too) as :class:`SelfAttention` does."""

    stacks = {"kv_proj": ("k_proj", "v_proj")}

    def __init__(self, d_model: int, heads: int, dropout: float = 0.0, qk_norm: str = "none", norm: str = "LN",
                 eps: float = EPS):
        super().__init__(d_model, heads, dropout, qk_norm, norm, eps)
        self.q_proj = xavier_linear(d_model, d_model)
        self.kv_proj = stacked_linear(d_model, d_model, 2)
        self.out_proj = xavier_linear(d_model, d_model)

    def projections(self) -> dict[str, list[Tensor]]:
        """The weights by role, for a connection that re-initialises its branch (``Connection.init_branch``)."""
        k, v = _rows(self.kv_proj, 2)
        return {"query": [self.q_proj.weight], "key": [k], "value": [v], "output": [self.out_proj.weight]}

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of the encoder output, split into heads: computed once per sentence."""
        k, v = self.kv_proj(memory).chunk(2, dim=-1)
        if self.k_norm is not None:
            k = self.k_norm(k)
        if self.v_norm is not None:
            v = self.v_norm(v)
        return self.split(k), self.split(v)

    def forward(self, query: Tensor, kv: tuple[Tensor, Tensor], mask: Tensor | None = None) -> Tensor:
        """``query`` (B, T, D) attends to projected keys/values (B, H, S, D/H) under the source ``mask``."""
        q = self.q_proj(query)
        if self.q_norm is not None:
            q = self.q_norm(q)
        return self.attend(self.split(q), *kv, mask)


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021, "RoFormer", Eq. 34), in the half-split layout of GPT-NeoX
    and LLaMA: feature pairs (i, i + d/2) of each head are rotated by the angle p·θ_i at position p,

        RoPE(x)_p = x_p · cos(p θ) + rotate_half(x_p) · sin(p θ),   θ_i = base^(-2i/d),  i < d/2,
        rotate_half([x1, x2]) = [-x2, x1],

    so that q_p · k_s depends on p − s alone. No parameters; ``positions`` angles are precomputed."""

    def __init__(self, head_dim: int, positions: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary positions need an even head width, got {head_dim}")
        theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.arange(positions, dtype=torch.float32)[:, None] * theta  # (P, d/2)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:  # (B, H, T, d) at positions offset, offset + 1, ...
        t = x.shape[2]
        cos, sin = self.cos[offset : offset + t].to(x.dtype), self.sin[offset : offset + t].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """(B, 1, 1, S), True at real tokens: which keys a query may attend to."""
    return (tokens != pad_id)[:, None, None, :]
