"""The encoder-decoder shell every translation family shares; a family provides the two layer stacks.

    src -> E·sqrt(d) + PE -> dropout -> encoder stack -> memory
    tgt -> E·sqrt(d) + PE -> dropout -> decoder stack (attending to memory) -> h E^T

The shell owns what does not depend on how layers are connected: the embedding E shared by source,
target and output (Press & Wolf 2017; Vaswani et al. 2017, Section 3.4), the initialisation (``init``,
:mod:`skiplab.models.linear`): ``xavier`` draws E from N(0, d^-1/2) as tensor2tensor and fairseq do, so that
E·sqrt(d) has unit scale, and the linear layers Xavier-uniform; ``lipschitz`` draws E as Neutron does
(Glorot-uniform with gain sqrt(1/3): U(-b, b), b = sqrt(2 / (V + d))) and every linear layer outside the
connections U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the pad row is zero in both), the sinusoidal positions
PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (Section 3.5), the
padding mask (decoder self-attention is causal: the stacks attend with ``causal=True``), and incremental decoding (:meth:`encode`, :meth:`start`, :meth:`step`,
:meth:`select`: the incremental interface the GPT family keeps too, :mod:`skiplab.models.incremental`;
``skiplab.translate`` searches with it). A family (the residual Transformer,
the depth-wise LSTM Transformer) subclasses :class:`EncoderDecoder` and hands it an encoder stack and a
decoder stack that keep these contracts (shapes (B, T, D)):

    encoder(x, mask) -> h                      the stack's output, final norm included
    decoder.cross_kv(memory) -> [(k, v)] * L   each layer's projection of the source, computed once
    decoder(x, cross, memory_mask, caches) -> h
        with ``caches`` (one dict per layer), x holds only the new positions: each layer appends their
        self-attention keys and values to its cache and attends over every cached position.

Adding a family: a config (subclass :class:`Seq2SeqConfig`), the two stacks, presets; see docs/layout.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..connections import iter_connections
from ..connections.tie import tie_within_layers
from .attention import padding_mask
from .linear import lipschitz_init_

INITS = ("xavier", "lipschitz")


@dataclass(frozen=True)
class Seq2SeqConfig:
    """The fields of every encoder-decoder family; ``vocab_size`` and ``pad_id`` come from the subword model."""

    vocab_size: int = field(default=8000, metadata={"help": "joint source/target vocabulary"})
    d_model: int = field(default=512, metadata={"help": "model width d"})
    ffn_dim: int = field(default=2048, metadata={"help": "inner width of the feed-forward computation"})
    heads: int = field(default=8, metadata={"help": "attention heads"})
    encoder_layers: int = field(default=6, metadata={"help": "encoder layers"})
    decoder_layers: int = field(default=6, metadata={"help": "decoder layers"})
    dropout: float = field(default=0.1, metadata={"help": "dropout on embeddings and sub-layer outputs"})
    attention_dropout: float = field(default=0.1, metadata={"help": "dropout on attention weights"})
    max_positions: int = field(default=1024, metadata={"help": "longest sequence the positions cover"})
    pad_id: int = field(default=0, metadata={"help": "padding token id"})
    init: str = field(default="xavier", metadata={
        "help": "initialisation: xavier (tensor2tensor's) or lipschitz (Neutron's, the depth-wise LSTM authors')"})

    def __post_init__(self):
        if self.init not in INITS:
            raise ValueError(f"init must be one of {', '.join(INITS)}, got {self.init!r}")
        if min(self.vocab_size, self.d_model, self.ffn_dim, self.heads, self.encoder_layers, self.decoder_layers,
               self.max_positions) < 1:
            raise ValueError("vocab_size, d_model, ffn_dim, heads, max_positions and the layer counts must be positive")
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        if not (0 <= self.dropout < 1 and 0 <= self.attention_dropout < 1):
            raise ValueError(f"dropout and attention_dropout must be in [0, 1), got {self.dropout}, {self.attention_dropout}")


class EncoderStack(Protocol):
    def __call__(self, x: Tensor, mask: Tensor) -> Tensor: ...


class DecoderStack(Protocol):
    def cross_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]: ...

    def __call__(self, x: Tensor, cross: list[tuple[Tensor, Tensor]], memory_mask: Tensor,
                 caches: list[dict[str, Tensor]] | None = None) -> Tensor: ...


def sinusoid(n: int, d: int) -> Tensor:
    """(n, d) sinusoidal positions, sin on even and cos on odd features (Section 3.5)."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe = torch.zeros(n, d)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)[:, : d // 2]
    return pe


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


class EncoderDecoder(nn.Module):
    """Embedding, positions and tied output around a family's ``encoder`` and ``decoder`` stacks."""

    def __init__(self, cfg: Seq2SeqConfig, encoder: nn.Module, decoder: nn.Module):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, d, padding_idx=cfg.pad_id)
        self.register_buffer("positions", sinusoid(cfg.max_positions, d), persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder: EncoderStack = encoder
        self.decoder: DecoderStack = decoder
        with torch.no_grad():
            if cfg.init == "lipschitz":
                lipschitz_init_(self, keep=tuple(c for _, c in iter_connections(self)))
                bound = math.sqrt(2 / (cfg.vocab_size + d))
                self.embed.weight.uniform_(-bound, bound)
            else:
                self.embed.weight.normal_(0.0, d**-0.5)  # so that E·sqrt(d) has unit scale
            self.embed.weight[cfg.pad_id].zero_()
        tie_within_layers(self)  # parameters a design shares across a layer's sub-layers (ReZero's α)

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
        return Memory(self.encoder(self.embed_tokens(src), mask), mask)

    def decode(self, tgt_in: Tensor, memory: Memory) -> Tensor:  # (B, T) -> logits (B, T, V)
        x = self.embed_tokens(tgt_in)  # right-padded: causal self-attention alone is exact at every real position
        return self.output(self.decoder(x, self.decoder.cross_kv(memory.out), memory.mask))

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for the target prefix ``tgt_in`` (BOS + y)."""
        return self.decode(tgt_in, self.encode(src))

    # -- incremental decoding -------------------------------------------------------------------
    def start(self, memory: Memory) -> DecoderState:
        cross = self.decoder.cross_kv(memory.out)
        return DecoderState(memory.mask, cross, [{} for _ in cross])

    def step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """Feed one position (tokens (N,)), extend the caches in place, return log-probs (N, V) of the next."""
        x = self.embed_tokens(tokens[:, None], offset=state.position)
        h = self.decoder(x, state.cross, state.mask, state.caches)
        state.position += 1
        return F.log_softmax(self.output(h)[:, 0].float(), dim=-1)

    @staticmethod
    def select(state: DecoderState, index: Tensor) -> DecoderState:
        """Rows ``index`` of ``state`` (beam expansion and reordering)."""
        return DecoderState(
            state.mask.index_select(0, index),
            [(k.index_select(0, index), v.index_select(0, index)) for k, v in state.cross],
            [{n: t.index_select(0, index) for n, t in c.items()} for c in state.caches],
            state.position,
        )
