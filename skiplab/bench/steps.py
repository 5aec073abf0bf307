"""What the benchmark times: training steps of every model family, a ``torch.nn.Transformer`` of the same
shape and a decoder-only model of ``torch.nn`` layers, a decoder that recomputes its prefix, and the
machine's own matmul and memory rates."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import show_value
from ..connections import REGISTRY, iter_connections, parse_spec
from ..models import GPTConfig, Seq2SeqConfig, build_model, model_config
from ..models.flops import counted_flops
from ..models.seq2seq import EncoderDecoder, Memory, sinusoid
from ..train.recipe_mt import label_smoothed_loss
from ..train.telemetry import grad_norm

PAD, BOS, EOS = 0, 2, 3


@dataclass
class MTBatch:
    """Random token ids in the shapes of a translation batch (right-padded, BOS-prefixed targets)."""

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor

    @classmethod
    def random(cls, rows: int, src_len: int, tgt_len: int, vocab: int, seed: int = 0) -> "MTBatch":
        g = torch.Generator().manual_seed(seed)
        src = torch.randint(4, vocab, (rows, src_len), generator=g)
        tgt = torch.randint(4, vocab, (rows, tgt_len), generator=g)
        src[:, -1] = EOS
        tgt_in = torch.cat([torch.full((rows, 1), BOS), tgt[:, :-1]], 1)
        return cls(src, tgt_in, tgt)


def image_step(model: nn.Module, batch: tuple[Tensor, Tensor], forward: Callable | None = None) -> Callable[[], None]:
    """One SGD training step of an image classifier (forward, cross-entropy, backward, update)."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    run = model if forward is None else forward
    x, y = batch

    def step() -> None:
        loss = F.cross_entropy(run(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def mt_step(model: nn.Module, batch: MTBatch, forward: Callable | None = None) -> Callable[[], None]:
    """One Adam training step of a translation model with the recipe's label-smoothed loss."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    run = model if forward is None else forward

    def step() -> None:
        loss, _ = label_smoothed_loss(run(batch.src, batch.tgt_in), batch.tgt_out, 0.1, PAD)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def lm_step(model: nn.Module, batch: tuple[Tensor, Tensor], forward: Callable | None = None) -> Callable[[], None]:
    """One AdamW training step of a language model (next-token cross-entropy), and what the model does after each
    update where it does something (nGPT renormalises its matrices: ``after_step``), as ``train lm`` makes it."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
    run = model if forward is None else forward
    after = getattr(model, "after_step", None) if getattr(model, "after_step_does", "") else None
    x, y = batch

    def step() -> None:
        loss = F.cross_entropy(run(x).float().transpose(1, 2), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if after is not None:
            after()

    return step


def loop_step(model: nn.Module, batch: tuple[Tensor, Tensor], watch: Any = None, layers: Any = None,
              updates: int = 1) -> Callable[[], None]:
    """``updates`` updates as ``train lm`` makes them: AdamW, the loss read back, the gradient clipped at 1.0; with
    ``watch`` (a :class:`~skiplab.train.telemetry.Telemetry`) the gradient norm and the update reported to it; with
    ``layers`` (a :class:`~skiplab.train.layer_telemetry.LayerWatch`) its due updates watched, as ``--log-layers``
    does, the lines taken as a save takes them."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
    params = list(model.parameters())
    x, y = batch
    count = [0]

    def one() -> None:
        count[0] += 1
        watched = layers is not None and layers.due(count[0])
        with layers.watching() if watched else nullcontext():
            loss = F.cross_entropy(model(x).float().transpose(1, 2), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        value = loss.item()
        if watched:
            layers.gradients()
            layers.snapshot()
        if watch is None:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        else:
            norm, clipped = grad_norm(params, 1.0)
            watch.update(count[0], value, 1e-4, norm, clipped, x.numel(), 1.0)
            watch.take()  # what a save does with the lines
        opt.step()
        if watched:
            layers.update(count[0])
            layers.take()

    def step() -> None:
        for _ in range(updates):
            one()

    return step


class TorchDecoder(nn.Module):
    """A decoder-only model of ``torch.nn`` layers alone: embedding, learned positions, pre-norm
    ``nn.TransformerEncoderLayer`` (GELU) run causally, a final ``nn.LayerNorm``, the tied output: the shape of
    ``gpt-*(positions=learned)`` with PreLN, the reference its training step is measured against."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        d = cfg.d_model
        self.embed, self.pos = nn.Embedding(cfg.vocab_size, d), nn.Embedding(cfg.context, d)
        layer = nn.TransformerEncoderLayer(d, cfg.heads, cfg.ffn_dim, cfg.dropout, activation="gelu", batch_first=True,
                                           norm_first=True, bias=cfg.bias)
        self.layers = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)

    def forward(self, tokens: Tensor) -> Tensor:
        t = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device)
        h = self.layers(self.embed(tokens) + self.pos.weight[:t], mask=mask, is_causal=True)
        return F.linear(self.norm(h), self.embed.weight)


def step_flops(step_inputs: Callable[[], None]) -> int:
    """Floating-point operations of one call (matmuls and convolutions, forward and backward), counted by
    ``torch.utils.flop_counter``; element-wise work is not counted (skiplab.models.flops)."""
    return counted_flops(step_inputs)


class TorchTransformer(nn.Module):
    """``torch.nn.Transformer`` (post-norm, ReLU) with the embedding, positions and tied output of skiplab's
    shell, so that only the layer stacks differ from ``transformer-*(connection=PostLN)``."""

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        nn.init.normal_(self.embed.weight, std=cfg.d_model**-0.5)
        self.register_buffer("positions", sinusoid(cfg.max_positions, cfg.d_model), persistent=False)
        self.core = nn.Transformer(cfg.d_model, cfg.heads, cfg.encoder_layers, cfg.decoder_layers, cfg.ffn_dim,
                                   cfg.dropout, batch_first=True)
        self.drop = nn.Dropout(cfg.dropout)

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        return self.drop(self.embed(tokens) * math.sqrt(self.cfg.d_model) + self.positions[: tokens.shape[1]])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        t = tgt_in.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(t, device=src.device)
        pad = src == self.cfg.pad_id
        h = self.core(self.embed_tokens(src), self.embed_tokens(tgt_in), tgt_mask=causal, tgt_is_causal=True,
                      src_key_padding_mask=pad, memory_key_padding_mask=pad)
        return F.linear(h, self.embed.weight)


@dataclass
class Prefix:
    """The state of :class:`RecomputingDecoder`: the encoder's memory and every token fed so far."""

    memory: Memory
    tokens: Tensor


class RecomputingDecoder:
    """The incremental-decoding interface without a cache: every step re-runs the decoder over the whole
    prefix (T steps cost T²/2 positions), the baseline a key/value cache is measured against."""

    def __init__(self, model: EncoderDecoder):
        self.model = model

    def encode(self, src: Tensor) -> Memory:
        return self.model.encode(src)

    def start(self, memory: Memory) -> Prefix:
        return Prefix(memory, memory.mask.new_empty(memory.out.shape[0], 0, dtype=torch.long))

    def step(self, tokens: Tensor, state: Prefix) -> Tensor:
        state.tokens = torch.cat([state.tokens, tokens[:, None]], 1)
        logits = self.model.decode(state.tokens, state.memory)
        return F.log_softmax(logits[:, -1].float(), dim=-1)

    @staticmethod
    def select(state: Prefix, index: Tensor) -> Prefix:
        memory = Memory(state.memory.out.index_select(0, index), state.memory.mask.index_select(0, index))
        return Prefix(memory, state.tokens.index_select(0, index))


def matmul_rate(n: int, repeats: int = 5) -> float:
    """FLOP/s of an (n x n) @ (n x n) float32 matmul: what this machine's BLAS reaches (best of ``repeats``)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def add_bandwidth(elements: int, repeats: int = 5) -> float:
    """Bytes/s of ``c = a + b`` on float32 tensors of ``elements`` (two reads and one write per element)."""
    a, b, c = torch.randn(elements), torch.randn(elements), torch.empty(elements)
    torch.add(a, b, out=c)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        torch.add(a, b, out=c)
        best = min(best, time.perf_counter() - start)
    return 3 * 4 * elements / best


def connection_output_elements(model: nn.Module, *inputs: Any) -> int:
    """Elements of every connection's output in one forward pass: what one element-wise pass over the
    connections touches."""
    total, hooks = [0], []
    for _, conn in iter_connections(model):
        hooks.append(conn.register_forward_hook(lambda m, a, out: total.__setitem__(0, total[0] + out.numel())))
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return total[0]


# model fields a design's recipe may set that any design could have (not a normalisation, as HybridNorm's qk_norm is)
MODEL_CHOICES = ("mlp", "positions", "bias", "dropout", "tie")


def recipe_fields(model: str, design: str, **overrides: Any) -> dict[str, Any]:
    """The model choices (:data:`MODEL_CHOICES`) that ``design``'s recipe (``Connection.recipe``) sets otherwise
    than the preset ``model`` with ``overrides`` does: for nGPT, SwiGLU where the GPT's MLP is GELU, no biases, an
    untied output layer. A design with such a recipe builds another model than PreLN's, so its step over the
    preset's PreLN prices the whole model; over PreLN built with these fields, the design's own work."""
    mine = model_config(f"{model}(connection={design})", **overrides)
    base = model_config(f"{model}(connection=PreLN)", **overrides)
    return {k: getattr(mine, k) for k in REGISTRY[parse_spec(design).name].recipe
            if k in MODEL_CHOICES and hasattr(base, k) and getattr(mine, k) != getattr(base, k)}


def show_fields(fields: dict[str, Any]) -> str:
    """``mlp=swiglu, bias=false``: fields as a model spec writes its options."""
    return ", ".join(f"{k}={show_value(v)}" for k, v in fields.items())


def build(spec: str, **overrides: Any) -> nn.Module:
    """A fresh model from a spec (seed 0), in training mode."""
    torch.manual_seed(0)
    return build_model(model_config(spec, **overrides)).train()
