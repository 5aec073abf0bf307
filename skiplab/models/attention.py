"""Multi-head attention on ``F.scaled_dot_product_attention``, with a key/value cache for decoding.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + mask) V,   heads concatenated, then W_O
    (Vaswani et al. 2017, Eqs. 1-2). Dropout acts on the attention weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class MultiheadAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, dropout: float = 0.0):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by the number of heads ({heads})")
        self.heads, self.dropout = heads, dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def split(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, H, T, D/H)
        b, t, d = x.shape
        return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of ``x``, split into heads: what a decoding cache stores."""
        return self.split(self.k_proj(x)), self.split(self.v_proj(x))

    def cached_kv(self, x: Tensor, cache: dict[str, Tensor] | None) -> tuple[Tensor, Tensor]:
        """Keys and values of ``x``; with a ``cache`` (incremental decoding), appended to the cached ones of the
        earlier positions, which the cache then holds."""
        k, v = self.project_kv(x)
        if cache is not None:
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
            cache["k"], cache["v"] = k, v
        return k, v

    def forward(self, query: Tensor, kv: tuple[Tensor, Tensor], mask: Tensor | None = None) -> Tensor:
        """``query`` (B, T, D) attends to projected keys/values (B, H, S, D/H); ``mask`` (B, 1|H, T|1, S) is
        True where attention is allowed."""
        q = self.split(self.q_proj(query))
        k, v = kv
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        b, h, t, dh = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, t, h * dh))


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """(B, 1, 1, S), True at real tokens: which keys a query may attend to."""
    return (tokens != pad_id)[:, None, None, :]


def causal_mask(t: int, device: torch.device) -> Tensor:
    """(1, 1, T, T), True on and below the diagonal: position i sees positions <= i."""
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()[None, None]
