"""An encoder-decoder Transformer (Vaswani et al. 2017) whose every residual is a skiplab connection.

    src -> E·sqrt(d) + PE -> N x [ conn(x, SelfAttn) ; conn(x, FFN) ] -> memory
    tgt -> E·sqrt(d) + PE -> N x [ conn(x, CausalSelfAttn) ; conn(x, CrossAttn(memory)) ; conn(x, FFN) ]
        -> h E^T  (output projection tied to the shared source/target embedding E)

FFN(x) = max(0, x W1 + b1) W2 + b2 (Eq. 2); PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) =
cos(pos / 10000^(2i/d)) (Section 3.5). Dropout on embeddings, attention weights and every sub-layer's
output before the connection adds it (Section 5.4). With ``PostLN`` (= ``1xSkip+LN``) each sub-layer is
LN(x + Dropout(F(x))), the papers' "Baseline"; pre-norm designs (``PreLN``, ``PreRMS``) leave each stack
un-normalised, so the stack ends with one norm of the kind the connection names.

Decoding: :meth:`encode`, :meth:`start`, :meth:`step` and :meth:`select` implement incremental decoding
(``skiplab.translate``): each step feeds one position and reuses the cached keys and values of the
earlier ones (cross-attention keys and values of the source are computed once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..connections import REGISTRY, connection, parse_spec
from ..connections.norms import make_norm
from .attention import MultiheadAttention, causal_mask, padding_mask


@dataclass(frozen=True)
class TransformerConfig:
    """The shape of the model; ``vocab_size`` comes from the subword model."""

    vocab_size: int = field(default=8000, metadata={"help": "joint source/target vocabulary"})
    d_model: int = field(default=512, metadata={"help": "model width d"})
    ffn_dim: int = field(default=2048, metadata={"help": "inner width of the feed-forward sub-layer"})
    heads: int = field(default=8, metadata={"help": "attention heads"})
    encoder_layers: int = field(default=6, metadata={"help": "encoder layers"})
    decoder_layers: int = field(default=6, metadata={"help": "decoder layers"})
    dropout: float = field(default=0.1, metadata={"help": "dropout on embeddings and sub-layer outputs"})
    attention_dropout: float = field(default=0.1, metadata={"help": "dropout on attention weights"})
    connection: str = field(default="PostLN", metadata={"help": "connection spec on every sub-layer"})
    max_positions: int = field(default=1024, metadata={"help": "longest sequence the positions cover"})
    pad_id: int = field(default=0, metadata={"help": "padding token id"})

    def __post_init__(self):
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        if min(self.vocab_size, self.d_model, self.ffn_dim, self.encoder_layers, self.decoder_layers) < 1:
            raise ValueError("vocab_size, d_model, ffn_dim and the layer counts must be positive")
        parse_spec(self.connection)


def sinusoid(n: int, d: int) -> Tensor:
    """(n, d) sinusoidal positions, sin on even and cos on odd features (Section 3.5)."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe = torch.zeros(n, d)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)[:, : d // 2]
    return pe


class FeedForward(nn.Sequential):
    def __init__(self, d: int, inner: int):
        super().__init__(nn.Linear(d, inner), nn.ReLU(), nn.Linear(inner, d))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        d = cfg.d_model
        self.self_attn = MultiheadAttention(d, cfg.heads, cfg.attention_dropout)
        self.ffn = FeedForward(d, cfg.ffn_dim)
        self.conn_attn = connection(cfg.connection, d)
        self.conn_ffn = connection(cfg.connection, d)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:  # (B, S, D)
        x = self.conn_attn(x, lambda h: self.drop(self.self_attn(h, self.self_attn.project_kv(h), mask)))
        return self.conn_ffn(x, lambda h: self.drop(self.ffn(h)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        d = cfg.d_model
        self.self_attn = MultiheadAttention(d, cfg.heads, cfg.attention_dropout)
        self.cross_attn = MultiheadAttention(d, cfg.heads, cfg.attention_dropout)
        self.ffn = FeedForward(d, cfg.ffn_dim)
        self.conn_self = connection(cfg.connection, d)
        self.conn_cross = connection(cfg.connection, d)
        self.conn_ffn = connection(cfg.connection, d)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, cross_kv: tuple[Tensor, Tensor], memory_mask: Tensor,
                self_mask: Tensor | None = None, cache: dict[str, Tensor] | None = None) -> Tensor:
        """``x`` (B, T, D). With ``cache``, x holds the new positions only: their keys and values are
        appended to the cache and the queries attend to every cached position."""

        def self_attention(h: Tensor) -> Tensor:
            k, v = self.self_attn.project_kv(h)
            if cache is not None:
                if "k" in cache:
                    k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
                cache["k"], cache["v"] = k, v
            return self.drop(self.self_attn(h, (k, v), self_mask))

        x = self.conn_self(x, self_attention)
        x = self.conn_cross(x, lambda h: self.drop(self.cross_attn(h, cross_kv, memory_mask)))
        return self.conn_ffn(x, lambda h: self.drop(self.ffn(h)))


@dataclass
class Memory:
    """What the encoder hands the decoder: outputs (B, S, D) and the source padding mask (B, 1, 1, S)."""

    out: Tensor
    mask: Tensor


@dataclass
class DecoderState:
    """Incremental decoding state of N rows: cross-attention keys/values, self-attention caches, position."""

    mask: Tensor
    cross: list[tuple[Tensor, Tensor]]
    caches: list[dict[str, Tensor]]
    position: int = 0


class Transformer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, d, padding_idx=cfg.pad_id)
        nn.init.normal_(self.embed.weight, mean=0.0, std=d**-0.5)  # so that E·sqrt(d) has unit scale
        with torch.no_grad():
            self.embed.weight[cfg.pad_id].zero_()
        self.register_buffer("positions", sinusoid(cfg.max_positions, d), persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        final = REGISTRY[parse_spec(cfg.connection).name].final_norm
        self.encoder_norm = make_norm(final, d) if final else nn.Identity()
        self.decoder_norm = make_norm(final, d) if final else nn.Identity()

    def embed_tokens(self, tokens: Tensor, offset: int = 0) -> Tensor:  # (B, T) -> (B, T, D)
        t = tokens.shape[1]
        if offset + t > self.cfg.max_positions:
            raise ValueError(f"sequence of {offset + t} tokens is longer than max_positions={self.cfg.max_positions}")
        x = self.embed(tokens) * math.sqrt(self.cfg.d_model) + self.positions[offset : offset + t]
        return self.drop(x)

    def output(self, h: Tensor) -> Tensor:
        """Logits over the vocabulary through the tied embedding: h E^T."""
        return F.linear(h, self.embed.weight)

    def encode(self, src: Tensor) -> Memory:  # (B, S) token ids
        mask = padding_mask(src, self.cfg.pad_id)
        x = self.embed_tokens(src)
        for layer in self.encoder:
            x = layer(x, mask)
        return Memory(self.encoder_norm(x), mask)

    def decode(self, tgt_in: Tensor, memory: Memory) -> Tensor:  # (B, T) -> logits (B, T, V)
        x = self.embed_tokens(tgt_in)
        mask = causal_mask(tgt_in.shape[1], tgt_in.device)
        for layer in self.decoder:
            x = layer(x, layer.cross_attn.project_kv(memory.out), memory.mask, mask)
        return self.output(self.decoder_norm(x))

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for the target prefix ``tgt_in`` (BOS + y)."""
        return self.decode(tgt_in, self.encode(src))

    # -- incremental decoding -------------------------------------------------------------------
    def start(self, memory: Memory) -> DecoderState:
        cross = [layer.cross_attn.project_kv(memory.out) for layer in self.decoder]
        return DecoderState(memory.mask, cross, [{} for _ in self.decoder])

    def step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """Feed one position (tokens (N,)), extend the caches in place, return log-probs (N, V) of the next."""
        x = self.embed_tokens(tokens[:, None], offset=state.position)
        for layer, kv, cache in zip(self.decoder, state.cross, state.caches):
            x = layer(x, kv, state.mask, None, cache)
        state.position += 1
        return F.log_softmax(self.output(self.decoder_norm(x))[:, 0].float(), dim=-1)

    @staticmethod
    def select(state: DecoderState, index: Tensor) -> DecoderState:
        """Rows ``index`` of ``state`` (beam expansion and reordering)."""
        return DecoderState(
            state.mask.index_select(0, index),
            [(k.index_select(0, index), v.index_select(0, index)) for k, v in state.cross],
            [{n: t.index_select(0, index) for n, t in c.items()} for c in state.caches],
            state.position,
        )
