"""The residual Transformer family (Vaswani et al. 2017) with a skiplab connection on every sub-layer
(one spec for both stacks, or ``encoder_connection`` / ``decoder_connection`` for each).

    encoder layer:  x <- conn(x, SelfAttn) ; x <- conn(x, FFN)
    decoder layer:  x <- conn(x, CausalSelfAttn) ; x <- conn(x, CrossAttn(memory)) ; x <- conn(x, FFN)

FFN(x) = max(0, x W1 + b1) W2 + b2 (Eq. 2). Dropout on attention weights and on every sub-layer's output
before the connection adds it (Section 5.4). With ``PostLN`` (= ``1xSkip+LN``) each sub-layer is
LN(x + Dropout(F(x))), the papers' "Baseline"; pre-norm designs (``PreLN``, ``PreRMS``) leave each stack
un-normalised, so the stack ends with one norm of the kind the connection names. ``norm`` is the model's norm
kind (LN, the papers'; or RMS), taken by a connection whose spec names none, and by QK-norm (``qk_norm``: head
or all, in self- and cross-attention; :mod:`skiplab.models.attention`). The embedding, positions, tied
output and incremental decoding are the shell's (:mod:`skiplab.models.seq2seq`).

Initialisation (tensor2tensor's, on which the rSkip+LN and SAS papers build): every linear layer of the
attention and the FFN is Xavier-uniform, W ~ U(-b, b) with b = sqrt(6 / (fan_in + fan_out)) (Glorot and
Bengio 2010, Eq. 16; W_Q, W_K, W_V each as a d x d layer), biases zero (:mod:`skiplab.models.linear`);
the embedding is N(0, d^-1/2); the connections keep their own initialisation (e.g. SAS's gate biases ±3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import Tensor, nn

from ..connections import (MODEL_NORMS, REGISTRY, Across, Place, check_model_requires, check_token_norms, connection,
                           final_norm, input_norm, parse_spec)
from ..connections.across import Stack, check_stack
from .attention import QK_NORMS, CrossAttention, SelfAttention, check_qk_norm
from .linear import xavier_linear
from .seq2seq import EncoderDecoder, Seq2SeqConfig


@dataclass(frozen=True)
class TransformerConfig(Seq2SeqConfig):
    """The residual Transformer: the shared fields and the connection on every sub-layer."""

    connection: str = field(default="PostLN", metadata={"help": "connection spec on every sub-layer"})
    # older_runs: the value every run had before the field existed; a run's key leaves the field out at it
    norm: str = field(default="LN", metadata={
        "help": "the model's norm kind, LN or RMS: a connection whose spec names no norm takes it",
        "older_runs": "LN"})
    encoder_connection: str = field(default="", metadata={
        "help": "the encoder's sub-layers' connection ('' = --connection)", "older_runs": ""})
    decoder_connection: str = field(default="", metadata={
        "help": "the decoder's sub-layers' connection ('' = --connection)", "older_runs": ""})
    qk_norm: str = field(default="none", metadata={
        "help": f"QK-norm: queries and keys of every attention (self and cross) normalised with the model's norm, "
                f"per head or across all heads, with qkv the values too (HybridNorm); one of {', '.join(QK_NORMS)}",
        "older_runs": "none"})

    def __post_init__(self):
        super().__post_init__()
        if self.norm not in MODEL_NORMS:
            raise ValueError(f"norm must be one of {', '.join(MODEL_NORMS)}, got {self.norm!r}")
        check_qk_norm(self.qk_norm)
        for spec in (self.connection, self.encoder_connection, self.decoder_connection):
            if spec and REGISTRY[parse_spec(spec).name].model_side:
                raise ValueError(f"{parse_spec(spec).name} has no encoder-decoder form: the model around it (unit-norm "
                                 "embeddings, scaled q·k and logits, weights renormalised after each step) is the "
                                 "decoder-only GPT's alone")
        check_model_requires(self, self.connection, self.encoder_connection, self.decoder_connection)
        check_token_norms(self.connection, self.encoder_connection, self.decoder_connection)
        for name in ("encoder", "decoder"):  # designs across a stack that have no form in it
            check_stack(self.stack_connection(name), self.stack(name))

    def stack(self, name: str) -> Stack:
        """The ``encoder``'s or ``decoder``'s layers as the designs across them see the stack."""
        if name == "encoder":
            return Stack(self.encoder_layers, self.d_model, ("attn", "ffn"), "encoder")
        return Stack(self.decoder_layers, self.d_model, ("attn", "cross", "ffn"), "decoder")

    def stack_connection(self, stack: str) -> str:
        """The connection of the ``encoder``'s or ``decoder``'s sub-layers: its own field, else ``connection``."""
        return {"encoder": self.encoder_connection, "decoder": self.decoder_connection}[stack] or self.connection


class FeedForward(nn.Sequential):
    def __init__(self, d: int, inner: int):
        super().__init__(xavier_linear(d, inner), nn.ReLU(), xavier_linear(inner, d))

    def projections(self) -> dict[str, list[Tensor]]:
        return {"ffn": [self[0].weight, self[2].weight]}


def place(cfg: TransformerConfig, stack: str, layer: int, sublayer: int, role: str) -> Place:
    """Sub-layer ``sublayer`` (``role``) of layer ``layer`` (1-based) of the encoder or decoder stack."""
    return Place(layer, stack, cfg.encoder_layers, cfg.decoder_layers, sublayer, 2 if stack == "encoder" else 3, role)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig, layer: int = 1):
        super().__init__()
        d = cfg.d_model
        self.self_attn = SelfAttention(d, cfg.heads, cfg.attention_dropout, qk_norm=cfg.qk_norm, norm=cfg.norm)
        self.ffn = FeedForward(d, cfg.ffn_dim)
        spec = cfg.stack_connection("encoder")
        self.conn_attn = connection(spec, d, place=place(cfg, "encoder", layer, 1, "attn"), norm=cfg.norm)
        self.conn_ffn = connection(spec, d, place=place(cfg, "encoder", layer, 2, "ffn"), norm=cfg.norm)
        self.drop = nn.Dropout(cfg.dropout)
        self.first_sublayer = 2 * (layer - 1)

    def init_branches(self) -> None:
        self.conn_attn.init_branch(self.self_attn.projections())
        self.conn_ffn.init_branch(self.ffn.projections())

    def forward(self, x: Tensor, mask: Tensor, values=None, run=None) -> Tensor:  # (B, S, D)
        """``run``: the stack's pass where a design acts at the sub-layers, else None (as the LM's layer)."""
        def attn(h: Tensor, kv: tuple[Tensor, Tensor] | None = None) -> Tensor:
            return self.drop(self.self_attn(h, mask, values=values, kv=kv))

        def ffn(h: Tensor) -> Tensor:
            return self.drop(self.ffn(h))

        if run is None:
            return self.conn_ffn(self.conn_attn(x, attn), ffn)
        x = run.sublayer(self.first_sublayer, x, self.conn_attn, attn)
        return run.sublayer(self.first_sublayer + 1, x, self.conn_ffn, ffn)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig, layer: int = 1):
        super().__init__()
        d = cfg.d_model
        self.self_attn = SelfAttention(d, cfg.heads, cfg.attention_dropout, qk_norm=cfg.qk_norm, norm=cfg.norm)
        self.cross_attn = CrossAttention(d, cfg.heads, cfg.attention_dropout, qk_norm=cfg.qk_norm, norm=cfg.norm)
        self.ffn = FeedForward(d, cfg.ffn_dim)
        spec = cfg.stack_connection("decoder")
        self.conn_self = connection(spec, d, place=place(cfg, "decoder", layer, 1, "attn"), norm=cfg.norm)
        self.conn_cross = connection(spec, d, place=place(cfg, "decoder", layer, 2, "cross"), norm=cfg.norm)
        self.conn_ffn = connection(spec, d, place=place(cfg, "decoder", layer, 3, "ffn"), norm=cfg.norm)
        self.drop = nn.Dropout(cfg.dropout)
        self.first_sublayer = 3 * (layer - 1)

    def init_branches(self) -> None:
        self.conn_self.init_branch(self.self_attn.projections())
        self.conn_cross.init_branch(self.cross_attn.projections())
        self.conn_ffn.init_branch(self.ffn.projections())

    def forward(self, x: Tensor, cross_kv: tuple[Tensor, Tensor], memory_mask: Tensor,
                cache: dict[str, Tensor] | None = None, values=None, run=None) -> Tensor:
        """``x`` (B, T, D); with ``cache``, x holds the new positions only (see the shell); ``values``: the
        stack's map of the self-attention values (:class:`~skiplab.connections.Across`), or None; ``run``: the
        stack's pass where a design acts at the sub-layers, else None."""
        def attn(h: Tensor, kv: tuple[Tensor, Tensor] | None = None) -> Tensor:
            return self.drop(self.self_attn(h, causal=True, cache=cache, values=values, kv=kv))

        def cross(h: Tensor) -> Tensor:
            return self.drop(self.cross_attn(h, cross_kv, memory_mask))

        def ffn(h: Tensor) -> Tensor:
            return self.drop(self.ffn(h))

        if run is None:
            return self.conn_ffn(self.conn_cross(self.conn_self(x, attn), cross), ffn)
        k = self.first_sublayer
        x = run.sublayer(k, x, self.conn_self, attn)
        x = run.sublayer(k + 1, x, self.conn_cross, cross)
        return run.sublayer(k + 2, x, self.conn_ffn, ffn)


def stack_input(cfg: TransformerConfig, stack: str) -> nn.Module:
    """The module each stack begins with, asked of the design; the shell's embeddings already carry √d."""
    return input_norm(cfg.stack_connection(stack), cfg.d_model, norm=cfg.norm, embed_scale=math.sqrt(cfg.d_model))


class ResidualEncoder(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg, i + 1) for i in range(cfg.encoder_layers))
        spec = cfg.stack_connection("encoder")
        self.across = Across(spec, cfg.stack("encoder"))
        self.input_norm = stack_input(cfg, "encoder")
        self.norm = final_norm(spec, cfg.d_model, layers=cfg.encoder_layers, norm=cfg.norm)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.input_norm(x)
        run = self.across.start(x)
        for i, layer in enumerate(self.layers):
            x = layer(run.enter(i, x), mask, run.values(i), run.inner)
            run.leave(i, x)
        return self.norm(run.finish(x))


class ResidualDecoder(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg, i + 1) for i in range(cfg.decoder_layers))
        spec = cfg.stack_connection("decoder")
        self.across = Across(spec, cfg.stack("decoder"))
        self.input_norm = stack_input(cfg, "decoder")
        self.norm = final_norm(spec, cfg.d_model, layers=cfg.decoder_layers, norm=cfg.norm)

    def cross_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        return [layer.cross_attn.project_kv(memory) for layer in self.layers]

    def forward(self, x: Tensor, cross: list[tuple[Tensor, Tensor]], memory_mask: Tensor,
                caches: list[dict[str, Tensor]] | None = None) -> Tensor:
        x = self.input_norm(x)
        run = self.across.start(x)  # per position: exact under incremental decoding
        for i, layer in enumerate(self.layers):
            x = layer(run.enter(i, x), cross[i], memory_mask, None if caches is None else caches[i], run.values(i),
                      run.inner)
            run.leave(i, x)
        return self.norm(run.finish(x))


class Transformer(EncoderDecoder):
    """The residual Transformer: the shell around :class:`ResidualEncoder` and :class:`ResidualDecoder`."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__(cfg, ResidualEncoder(cfg), ResidualDecoder(cfg))
        for layer in [*self.encoder.layers, *self.decoder.layers]:  # designs that prescribe their branch's init
            layer.init_branches()
        self._register_load_state_dict_pre_hook(_upgrade_flat_stacks)


def _upgrade_flat_stacks(state: dict, prefix: str, *args) -> None:
    """Read checkpoints written before the shell held its stacks as modules (skiplab <= e670ab1):
    ``encoder.3.`` was ``encoder.layers.3.``, ``encoder_norm.`` was ``encoder.norm.`` (likewise decoder)."""
    for key in [k for k in state if k.startswith(prefix)]:
        rest = key[len(prefix):]
        for side in ("encoder", "decoder"):
            if rest.startswith(f"{side}_norm."):
                state[prefix + f"{side}.norm." + rest[len(side) + 6:]] = state.pop(key)
            elif rest.startswith(f"{side}.") and rest[len(side) + 1:].split(".")[0].isdigit():
                state[prefix + f"{side}.layers." + rest[len(side) + 1:]] = state.pop(key)
