"""The decoder-only language model family (GPT-style) with a skiplab connection on every sub-layer.

    tokens -> E (+ P, learned positions) -> dropout -> L x layer -> final norm -> logits = h E^T (tied)
    layer:  x <- conn(x, Dropout ∘ CausalSelfAttn) ; x <- conn(x, Dropout ∘ MLP)

Attention is causal on ``F.scaled_dot_product_attention(is_causal=True)`` (no mask tensor), with a key/value
cache for generation (one position a step; ``forward(tokens, caches)``, or ``start``/``step``/``select``, the
interface the translation families keep too: :mod:`skiplab.models.incremental`). Positions: ``rope`` rotates queries
and keys (Su et al. 2021; :class:`~skiplab.models.attention.Rotary`), ``learned`` adds a learned vector per
position (Radford et al. 2019, GPT-2). The MLP is ``gelu``: W2 GELU(W1 x) (GPT-2, tanh approximation), or
``swiglu``: W2 (SiLU(W1 x) ⊙ W3 x) (Shazeer 2020, Eq. 6; the LLaMA MLP). With pre-norm connections
(``PreLN``, ``PreRMS``) the stack ends with one norm of their kind; with post-norm ones (``PostLN``,
``2rSkip+LN``, ``SAS``) the last layer's output is already normalised and no final norm is added.

Initialisation (``init``): ``default`` draws every linear layer and the embeddings from N(0, 0.02²), biases
zero (GPT-2's ``initializer_range``, nanoGPT ``model.py`` ``_init_weights``); ``gpt2`` also scales the output
projection of every sub-layer (attention's W_O, the MLP's W2) to N(0, (0.02/√(2L))²), "a factor of 1/√N
where N is the number of residual layers" (Radford et al. 2019, Section 2.3; nanoGPT ``c_proj`` with
std 0.02/sqrt(2 * n_layer)); ``depth`` draws them by the layer's index instead, N(0, (0.02/√(2(l+1)))²) for the
0-based layer l (torchtitan's ``depth_init``: ``torchtitan/models/llama3/__init__.py`` ``_depth_init``, std
``depth_scaled_std(0.02, layer_id)`` = 0.02/sqrt(2 * (layer_id + 1)) of ``models/common/param_init.py``, on W_O
and on the feed-forward's w2 and w3: the MLP's W2, and with SwiGLU its value projection W3 too; torchtitan's
``trunc_normal_`` cuts at ±2, which at these stds cuts nothing, so a plain normal draw here). The connections keep
their own initialisation (e.g. SAS's gate biases ±3).

Width μP (``mup_base_width`` = d_base > 0; Yang et al. 2022, Tensor Programs V, arXiv 2203.03466, Table 3; the
``mup`` package's ``MuReadout``; EleutherAI/nanoGPT-mup ``model.py`` with ``mup_enabled``), m_d = d/d_base: the
output layer reads h/m_d (``x *= mup_output_alpha / mup_width_multiplier`` before ``lm_head``), attention scores are
q·k/d_head rather than q·k/√d_head, and the hidden matrices (attention's and the MLP's) are drawn with their init's
std over √m_d. The optimizer's side (hidden matrices' lr/m_d) is the training's
(:mod:`skiplab.train.parametrization`). ``mup_base_width=0``: the standard parametrisation.

``tie`` shares the embedding with the output projection (GPT-2); the LLaMA shapes of the Mix-LN and
curse-of-depth papers have a separate output layer (``tie=false``).

``norm`` is the model's norm kind: LN (GPT-2) or RMS (LLaMA, and the LLaMA presets). A connection whose spec names
no norm takes it, in its blocks and in the norms the stack begins and ends with (``MixLN`` and ``LNS`` on a LLaMA
preset build RMSNorm, as their papers' LLaMA models do); a spec that names one keeps it (``PreLN``, ``MixLN+LN``).
``pad_vocab`` rounds the embedding's and output layer's rows up to a multiple (:func:`padded_vocab`).
``norm_eps`` is every norm layer's eps (default 1e-5, ``skiplab.connections.norms.EPS``, as GPT-2's
``layer_norm_epsilon``; an imported checkpoint brings its own, e.g. ``rms_norm_eps`` 1e-6).
``qk_norm`` normalises queries and keys with the model's norm kind before the rotary positions: ``head`` per head
(Qwen 3), ``all`` across the heads (OLMo 2); :mod:`skiplab.models.attention`.

With the ``nGPT`` connection the GPT is the normalised Transformer (Loshchilov et al. 2025;
:mod:`skiplab.models.ngpt`): queries and keys normalised and scaled, the MLP's u and v and the logits scaled, no norm
layer, every matrix on the unit sphere, renormalised by :meth:`GPT.after_step`, which the training loop calls after
every update (a no-op for the other designs).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..connections import (EPS, MODEL_NORMS, Across, Place, check_model_requires, check_token_norms, connection,
                           final_norm, input_norm, iter_connections, parse_spec, set_norm_eps)
from ..connections.across import Stack, check_stack, not_recomputable
from ..connections.tie import tie_within_layers
from . import ngpt
from .attention import QK_NORMS, Rotary, SelfAttention, check_qk_norm
from .linear import stacked_linear, xavier_linear
from .linear_ce import linear_cross_entropy, wide

MLPS = ("gelu", "swiglu")
POSITIONS = ("rope", "learned")
GPT_INITS = ("default", "gpt2", "depth")
STD = 0.02


@dataclass(frozen=True)
class GPTConfig:
    """A decoder-only language model; ``vocab_size`` comes from the tokenizer."""

    vocab_size: int = field(default=256, metadata={"help": "vocabulary (the tokenizer's)"})
    d_model: int = field(default=256, metadata={"help": "model width d"})
    heads: int = field(default=4, metadata={"help": "attention heads"})
    layers: int = field(default=6, metadata={"help": "decoder layers L"})
    ffn_dim: int = field(default=1024, metadata={"help": "inner width of the MLP"})
    mlp: str = field(default="gelu", metadata={"help": "gelu (GPT-2) or swiglu (LLaMA)"})
    positions: str = field(default="rope", metadata={"help": "rope (rotary) or learned (GPT-2)"})
    context: int = field(default=256, metadata={"help": "longest sequence the model reads (its positions)"})
    dropout: float = field(default=0.0, metadata={"help": "dropout on embeddings, attention and sub-layer outputs"})
    bias: bool = field(default=True, metadata={"help": "biases in the linear layers"})
    tie: bool = field(default=True, metadata={"help": "output projection tied with the token embedding"})
    init: str = field(default="default", metadata={
        "help": "default: N(0, 0.02^2); gpt2: also each sub-layer's output projection scaled by 1/sqrt(2L); depth: "
                "by 1/sqrt(2(l+1)), l the 0-based layer (torchtitan's depth_init)"})
    rope_base: float = field(default=10000.0, metadata={"help": "rotary base (theta_i = base^(-2i/d_head))"})
    connection: str = field(default="PreLN", metadata={"help": "connection spec on every sub-layer"})
    # older_runs: the value every run had before the field existed; a run's key leaves the field out at it
    norm: str = field(default="LN", metadata={
        "help": "the model's norm kind, LN or RMS: a connection whose spec names no norm takes it",
        "older_runs": "LN"})
    pad_vocab: int = field(default=0, metadata={
        "help": "round the embedding's and output layer's rows up to a multiple of this (64: faster matmuls on "
                "GPUs); the padding's logits are cut off, never sampled or scored (0: none)", "older_runs": 0})
    norm_eps: float = field(default=EPS, metadata={
        "help": "eps of every norm layer, which divides by sqrt(statistic + eps) (a checkpoint's layer_norm_epsilon "
                "or rms_norm_eps)", "older_runs": EPS})
    qk_norm: str = field(default="none", metadata={
        "help": f"QK-norm: queries and keys normalised (the model's norm, before rotary) per head (Qwen 3) or across "
                f"all heads (OLMo 2), with qkv the values too (HybridNorm); one of {', '.join(QK_NORMS)}",
        "older_runs": "none"})
    mup_base_width: int = field(default=0, metadata={
        "help": "width muP's base width d_base (0: off): logits of h*d_base/d, attention scores q.k/d_head, hidden "
                "matrices' init std over sqrt(d/d_base)", "older_runs": 0})

    def __post_init__(self):
        for name, value, known in (("mlp", self.mlp, MLPS), ("positions", self.positions, POSITIONS),
                                   ("init", self.init, GPT_INITS), ("norm", self.norm, MODEL_NORMS)):
            if value not in known:
                raise ValueError(f"{name} must be one of {', '.join(known)}, got {value!r}")
        sizes = ("vocab_size", "d_model", "heads", "layers", "ffn_dim", "context", "pad_vocab", "mup_base_width")
        for name in sizes:  # from Python a float or a bool would build (context=2.5) and fail somewhere else
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if min(self.vocab_size, self.d_model, self.heads, self.layers, self.ffn_dim, self.context) < 1:
            raise ValueError("vocab_size, d_model, heads, layers, ffn_dim and context must be positive")
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        if self.pad_vocab < 0:
            raise ValueError(f"pad_vocab must be >= 0, got {self.pad_vocab}")
        if not 0 < self.norm_eps < 1:
            raise ValueError(f"norm_eps must be in (0, 1), got {self.norm_eps:g}")
        if not (math.isfinite(self.rope_base) and self.rope_base > 0):
            raise ValueError(f"rope_base must be a finite number > 0 (theta_i = base^(-2i/d_head)), got "
                             f"{self.rope_base:g}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        check_qk_norm(self.qk_norm)
        if self.mup_base_width < 0:
            raise ValueError(f"mup_base_width must be >= 0 (0: off), got {self.mup_base_width}")
        parse_spec(self.connection)
        if self.mup_base_width and ngpt.is_ngpt(self.connection):
            raise ValueError("mup_base_width: nGPT scales its logits and attention itself; width muP means nothing "
                             "on it")
        ngpt.check(self)  # the nGPT connection: the normalised model's fields (SwiGLU, rope, no biases, no dropout)
        check_model_requires(self, self.connection)  # HybridNorm: the attention's QKV-norm
        check_token_norms(self.connection)
        check_stack(self.connection, self.stack())  # a design across the stack that names a layer it has not

    def stack(self) -> Stack:
        """The layers as the designs across them see the stack: attention and MLP sub-layers, decoder-only."""
        return Stack(self.layers, self.d_model, ("attn", "ffn"), "lm")


def padded_vocab(cfg: GPTConfig) -> int:
    """The rows of the embedding and output layer: ``vocab_size`` rounded up to a multiple of ``pad_vocab``
    (nanoGPT pads GPT-2's 50,257 to 50,304 for the matmuls' sake). No token id reaches the padding's rows, and
    :meth:`GPT.forward` returns the ``vocab_size`` real logits alone."""
    return -(-cfg.vocab_size // cfg.pad_vocab) * cfg.pad_vocab if cfg.pad_vocab else cfg.vocab_size


class MLP(nn.Module):
    """gelu: W2 GELU(W1 x); swiglu: W2 (SiLU(W1 x) ⊙ W3 x), W1 and W3 in one matmul (``up``)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        if self.swiglu:
            self.up = stacked_linear(cfg.d_model, cfg.ffn_dim, 2, cfg.bias)
        else:
            self.up = xavier_linear(cfg.d_model, cfg.ffn_dim, cfg.bias)
        self.down = xavier_linear(cfg.ffn_dim, cfg.d_model, cfg.bias)

    def projections(self) -> dict[str, list[Tensor]]:
        up = list(self.up.weight.chunk(2, dim=0)) if self.swiglu else [self.up.weight]
        return {"ffn": [*up, self.down.weight]}

    def forward(self, x: Tensor) -> Tensor:
        if self.swiglu:
            gate, value = self.up(x).chunk(2, dim=-1)
            return self.down(F.silu(gate) * value)
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class Layer(nn.Module):
    def __init__(self, cfg: GPTConfig, rope: Rotary | None, layer: int = 1):
        super().__init__()
        d = cfg.d_model
        normalised = ngpt.is_ngpt(cfg.connection)  # nGPT: q and k normalised and scaled, u and v scaled
        self.attn = SelfAttention(d, cfg.heads, cfg.dropout, cfg.bias, rope,
                                  qk=ngpt.QKNorm(d, cfg.heads) if normalised else None, qk_norm=cfg.qk_norm,
                                  norm=cfg.norm, eps=cfg.norm_eps)
        self.mlp = ngpt.NormalizedMLP(d, cfg.ffn_dim) if normalised else MLP(cfg)
        self.conn_attn = connection(cfg.connection, d, place=Place.decoder_only(layer, cfg.layers, 1, 2, "attn"),
                                    norm=cfg.norm)
        self.conn_mlp = connection(cfg.connection, d, place=Place.decoder_only(layer, cfg.layers, 2, 2, "ffn"),
                                   norm=cfg.norm)
        self.drop = nn.Dropout(cfg.dropout)
        self.first_sublayer = 2 * (layer - 1)  # its sub-layers' indices over the stack: 2(l − 1), 2(l − 1) + 1

    def init_branches(self) -> None:
        self.conn_attn.init_branch(self.attn.projections())
        self.conn_mlp.init_branch(self.mlp.projections())

    def forward(self, x: Tensor, cache: dict[str, Tensor] | None = None, values=None, run=None) -> Tensor:
        """``x`` (B, T, D); with ``cache``, x holds the new positions only, after the cached ones; ``values``:
        the stack's map of the attention values (:class:`~skiplab.connections.Across`), or None; ``run``: the
        stack's pass where a design acts at the sub-layers (:attr:`~skiplab.connections.across.Run.inner`), or
        None."""
        def attn(h: Tensor, kv: tuple[Tensor, Tensor] | None = None) -> Tensor:
            return self.drop(self.attn(h, causal=True, cache=cache, values=values, kv=kv))

        def mlp(h: Tensor) -> Tensor:
            return self.drop(self.mlp(h))

        if run is None:
            return self.conn_mlp(self.conn_attn(x, attn), mlp)
        x = run.sublayer(self.first_sublayer, x, self.conn_attn, attn)
        return run.sublayer(self.first_sublayer + 1, x, self.conn_mlp, mlp)


class GPT(nn.Module):
    """Token embedding, positions, the layers, the final norm and the output projection."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        rows = padded_vocab(cfg)
        self.embed = nn.Embedding(rows, d)
        self.pos_embed = nn.Embedding(cfg.context, d) if cfg.positions == "learned" else None
        rope = Rotary(d // cfg.heads, cfg.context, cfg.rope_base) if cfg.positions == "rope" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.embed_norm = input_norm(cfg.connection, d, norm=cfg.norm)  # the identity but for designs that need one
        self.layers = nn.ModuleList(Layer(cfg, rope, i + 1) for i in range(cfg.layers))
        # designs across the layers (+ValueRes, +UNet, +AttnRes ...), if any
        self.across = Across(cfg.connection, cfg.stack())
        self.norm = final_norm(cfg.connection, d, layers=cfg.layers, norm=cfg.norm)
        self.head = None if cfg.tie else nn.Linear(d, rows, bias=False)
        self.normalised = ngpt.is_ngpt(cfg.connection)  # nGPT (skiplab.models.ngpt): logits scaled by s_z
        self.width_multiplier = d / cfg.mup_base_width if cfg.mup_base_width else 1.0  # μP's m_d
        if cfg.mup_base_width:  # μP's attention: q·k/d_head
            for layer in self.layers:
                layer.attn.softmax_scale = 1.0 / (d // cfg.heads)
        self.logit_scale = ngpt.LogitScale(rows, d) if self.normalised else None
        self._init_weights()
        tie_within_layers(self)  # parameters a design shares across a layer's sub-layers (ReZero's α)
        # activation checkpointing (torch.utils.checkpoint, non-reentrant): while training with gradients, each
        # layer keeps its input alone and recomputes the rest in the backward, the same numbers with less memory.
        # A training run sets it (train lm --activation-checkpointing); evaluation, analyses and decoding never
        # recompute, so a forward hook sees one forward's values.
        self.checkpointing = False
        if cfg.norm_eps != EPS:
            set_norm_eps(self, cfg.norm_eps)

    @torch.no_grad()
    def _init_weights(self) -> None:
        kept = {id(m) for _, c in iter_connections(self) for m in c.modules()}
        for module in self.modules():
            if id(module) in kept:
                continue
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()
        if self.cfg.init == "gpt2":
            for layer in self.layers:
                for out in (layer.attn.out_proj, layer.mlp.down):
                    out.weight.normal_(0.0, STD / math.sqrt(2 * self.cfg.layers))
        if self.cfg.init == "depth":  # torchtitan's depth_init: W_O, W2 (and SwiGLU's W3) by the layer's index
            for l, layer in enumerate(self.layers):
                ffn = layer.mlp.projections()["ffn"]  # [W1, W2] or [W1, W3, W2]
                for weight in (layer.attn.out_proj.weight, *ffn[1:]):
                    weight.normal_(0.0, STD / math.sqrt(2 * (l + 1)))
        if self.cfg.mup_base_width:  # μP: hidden matrices' std over √m_d
            for layer in self.layers:
                for weight in (layer.attn.qkv_proj.weight, layer.attn.out_proj.weight, layer.mlp.up.weight,
                               layer.mlp.down.weight):
                    weight.div_(math.sqrt(self.width_multiplier))
        for layer in self.layers:  # designs that prescribe their branch's initialisation (DeepNorm)
            layer.init_branches()
        self.after_step()  # nGPT's matrices start on the unit sphere

    @torch.no_grad()
    def after_step(self) -> None:
        """What the model does after every optimizer step (the training loop calls it; ``after_step_does`` says
        what): nGPT renormalises its matrices (:func:`~skiplab.models.ngpt.normalise_matrices`); the other designs
        nothing."""
        if self.normalised:
            ngpt.normalise_matrices(self)

    @property
    def after_step_does(self) -> str:
        """:meth:`after_step` in words ('' where it does nothing), for the run's config and summary."""
        return ngpt.AFTER_STEP if self.normalised else ""

    def flops_per_token(self) -> float:
        """Training FLOPs per token, forward and backward: 6N + 12·L·d·T, N the weights less the position table,
        L layers, d the width, T the context (PaLM, Chowdhery et al. 2022, Appendix B: 6N + 12·L·H·Q·T, H·Q = d;
        nanoGPT's ``estimate_mfu``). The attention scores' causal half is not taken off."""
        n = sum(p.numel() for p in self.parameters()) - (self.pos_embed.weight.numel() if self.pos_embed else 0)
        c = self.cfg
        return 6.0 * n + 12.0 * c.layers * c.d_model * c.context

    def forward(self, tokens: Tensor, caches: list[dict[str, Tensor]] | None = None, targets: Tensor | None = None,
                head_loss: str = "eager") -> Tensor:
        """Logits (B, T, V) of the next token at every position of ``tokens`` (B, T). With ``caches`` (one
        dict per layer, empty at first) ``tokens`` continue the cached positions, whose keys and values
        each layer extends. With ``targets`` (B, T): the mean cross-entropy of those logits against them
        instead, computed by ``head_loss`` (:mod:`skiplab.models.linear_ce`: ``chunked`` and ``liger`` never
        hold the (B, T, V) logits)."""
        h = self.hidden(tokens, caches)
        if targets is None:
            return self.logits(h)
        if head_loss == "eager":
            return F.cross_entropy(wide(self.logits(h)).transpose(1, 2), targets)
        return linear_cross_entropy(*self.readout(h), targets, head_loss)

    def hidden(self, tokens: Tensor, caches: list[dict[str, Tensor]] | None = None) -> Tensor:
        """The last layer's states after the final norm (B, T, D): what the output projection reads."""
        offset = caches[0]["k"].shape[2] if caches is not None and "k" in caches[0] else 0
        t = tokens.shape[1]
        if offset + t > self.cfg.context:
            raise ValueError(f"a sequence of {offset + t} tokens is longer than the model's context ({self.cfg.context})")
        x = self.embed(tokens)
        if self.pos_embed is not None:
            x = x + self.pos_embed.weight[offset : offset + t]
        x = self.drop(self.embed_norm(x))
        run = self.across.start(x)
        recompute = self.checkpointing and self.training and torch.is_grad_enabled() and caches is None
        if recompute and (names := not_recomputable(self.cfg.connection)):
            raise ValueError(f"activation checkpointing runs a layer twice, which {names[0]} cannot")
        for i, layer in enumerate(self.layers):
            if recompute:  # activation checkpointing: the layer's inner activations made again in the backward
                x = checkpoint(layer, run.enter(i, x), None, run.values(i), run.inner, use_reentrant=False)
            else:
                x = layer(run.enter(i, x), None if caches is None else caches[i], run.values(i), run.inner)
            run.leave(i, x)
        return self.norm(run.finish(x))

    def output_weight(self) -> Tensor:
        """The output projection's weight (rows: the padded vocabulary): the embedding's where tied."""
        return self.head.weight if self.head is not None else self.embed.weight

    def logits(self, h: Tensor) -> Tensor:
        """Logits (B, T, V) of the states ``h``; the padding's rows (``pad_vocab``) cut off."""
        if self.width_multiplier != 1.0:  # μP's readout: h/m_d (MuReadout's x / width_mult)
            h = h / self.width_multiplier
        logits = self.head(h) if self.head is not None else F.linear(h, self.embed.weight)
        if self.logit_scale is not None:  # nGPT's s_z
            logits = self.logit_scale(logits)
        return logits[..., : self.cfg.vocab_size] if self.cfg.pad_vocab else logits

    def readout(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """``(h', W')`` with :meth:`logits` = h' W'ᵀ: μP's h/m_d, nGPT's s_z taken into the rows of W (z ⊙ s_z =
        h (s_z ⊙ W)ᵀ), the padding's rows cut off; what a loss that fuses the output layer reads."""
        if self.width_multiplier != 1.0:
            h = h / self.width_multiplier
        w = self.output_weight()
        if self.logit_scale is not None:
            w = w * self.logit_scale.s_z().unsqueeze(1)
        return h, w[: self.cfg.vocab_size] if self.cfg.pad_vocab else w

    def new_caches(self) -> list[dict[str, Tensor]]:
        """Empty key/value caches, one per layer, for :meth:`forward`."""
        return [{} for _ in self.layers]

    # -- incremental decoding (skiplab.models.incremental) --------------------------------------
    def start(self, prefix: Tensor) -> LMState:
        """A state for the N rows of ``prefix`` (N, P), P >= 0: every layer's cache holds the P positions
        (computed at once); the first :meth:`step` feeds the token after them (a prompt's last one)."""
        state = LMState(self.new_caches())
        if prefix.shape[1]:
            self(prefix, state.caches)
        return state

    def step(self, tokens: Tensor, state: LMState) -> Tensor:
        """Feed one position (tokens (N,)), extend the caches in place, return log-probs (N, V) of the next."""
        return F.log_softmax(self(tokens[:, None], state.caches)[:, 0].float(), dim=-1)

    @staticmethod
    def select(state: LMState, index: Tensor) -> LMState:
        """Rows ``index`` of ``state`` (beam expansion and reordering)."""
        return LMState([{n: t.index_select(0, index) for n, t in c.items()} for c in state.caches])


@dataclass
class LMState:
    """Incremental decoding state of N rows: each layer's self-attention keys and values."""

    caches: list[dict[str, Tensor]]
