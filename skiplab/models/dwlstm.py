"""The Transformer with depth-wise LSTM (Xu, Liu, Xiong and van Genabith; the *depth-wise LSTM paper*).

An LSTM with layer normalisation steps over depth instead of over time: layer i's output and cell feed
layer i + 1. It replaces both the residual connections and the feed-forward sub-layer. At every position,
independently, with x the layer's input (its attention result) and (out_{i-1}, cell_{i-1}) the previous
layer's:

    c      = [x ; out_{i-1}]                                        (Eq. 2)
    i, f, o = σ(LN_i(W_i c + b_i)), σ(LN_f(W_f c + b_f)), σ(LN_o(W_o c + b_o))       (Eqs. 3-5)
    h      = act(LN(W_h c + b_h))                    hidden_layers=1  (Eq. 6)
    h      = W_h2 Drop(act(LN(W_h1 c + b_h1))) + b_h2   hidden_layers=2  (Eq. 8; inner width ffn_dim)
    cell_i = cell_{i-1} ⊙ f + h ⊙ i                                 (Eq. 9)
    out_i  = cell_i ⊙ o                    (no tanh on the cell)    (Eq. 10)

LN(z) = (z - μ) / σ · w + b with w = 1, b = 0 at the start (Eq. 7), ε = 1e-6 in every LN of the family
(Neutron's ``ieps_ln_default``); act is GeLU (Section 3.1) or tanh.

Encoder layer (Fig. 3): a = Dropout(SelfAttn(LN(out_{i-1}))); (out_i, cell_i) = LSTM(a, out_{i-1}, cell_{i-1}).
Decoder layer (Fig. 4): s = Dropout(CausalSelfAttn(LN(out_{i-1}))); a = Dropout(CrossAttn(LN(s + out_{i-1}),
memory)) -- the cross-attention reads the sum of the self-attention output and the layer's input
(Section 3.3); the LSTM's input is s + a (``merge=add``, the default) or [s ; a] (``merge=concat``,
Table 3). The figures are not in the text; normalising the attention inputs first, as a pre-norm layer
does, follows the authors' public code (Neutron). The first layer's (out, cell) both start from the
embedded input; each stack ends with a LayerNorm. There is no FFN sub-layer and no residual connection.

Sharing across the layers of a stack (Table 4): ``share=gates`` (default) binds W_{i,f,o}, b_{i,f,o} and
the gates' LNs, the hidden computation stays per layer; ``share=all`` binds the whole LSTM unit;
``share=none`` binds nothing. Attention is never shared. Dropout acts on h and, with two hidden layers, on
the activation inside (Drop above), as in the authors' code (Neutron ``modules/rfn.py``, ``LSTMCell4FFN``).
Where the equations or the text say otherwise, they are followed, not the code (docs/translation.md, "The depth-wise
LSTM against its authors' code", compares the two point by point): each gate has its own LN (Neutron
normalises the three pre-activations jointly), the gate and hidden layers have the biases the equations
write (Neutron has none), the decoder's LSTM input is the merge of the two sub-layers' outputs and the
cross-attention reads s + out (Section 3.3; Neutron feeds a + LN(s + LN(out)) and queries LN(s + LN(out))).

Neutron's own wiring and output layer are options, the paper's stay the default: ``wiring=neutron`` builds the
decoder layer as the authors' code does (``transformer/RFN/Decoder.py`` with ``norm_residual``, the toolkit's
default), q = LN_c(s + LN_s(out_{i-1})), a = Dropout(CrossAttn(q, memory)), and the LSTM's input a + q (the
cross-attention sub-layer's output with its residual taken from the normalised input); ``output_bias=true`` adds
Neutron's bias b (zero at the start) to the tied output, logits = h E^T + b (its ``classifier``, a linear layer with
a bias whose weight is the embedding).

Initialisation (``init``, the paper is silent; :mod:`skiplab.models.linear`): ``lipschitz`` by default, as
Neutron initialises its models: every linear layer (attention, W_{i,f,o}, W_h, W_h1, W_h2) is
U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with zero biases, the embedding U(-b, b) with b = sqrt(2 / (V + d)), the
LNs gain 1 and bias 0 (Eq. 7). ``init=xavier`` draws the linear layers Xavier-uniform instead (W_i, W_f and
W_o as the three (|c| -> d) matrices Eqs. 3-5 write) and the embedding N(0, d^-1/2), as the residual
Transformer family does.

Decoding: the LSTM runs over depth, so incremental decoding caches what the residual Transformer caches
(self-attention keys/values, the source's cross-attention keys/values) and nothing for the LSTM.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import CrossAttention, SelfAttention
from .linear import stacked_linear, xavier_linear
from .seq2seq import EncoderDecoder, Seq2SeqConfig

ACTIVATIONS = {"gelu": nn.GELU, "tanh": nn.Tanh}
MERGES, SHARES, WIRINGS = ("add", "concat"), ("gates", "all", "none"), ("paper", "neutron")
EPS = 1e-6  # every LN of the family (Neutron's ieps_ln_default)


@dataclass(frozen=True)
class DepthWiseLSTMConfig(Seq2SeqConfig):
    """The depth-wise LSTM Transformer: the shared fields and the paper's options (Tables 2-4)."""

    hidden_layers: int = field(default=2, metadata={"help": "LSTM hidden computation: 1 (Eq. 6) or 2 layers (Eq. 8)"})
    merge: str = field(default="add", metadata={"help": "decoder: merge self- and cross-attention by add or concat"})
    share: str = field(default="gates", metadata={"help": "LSTM parameters shared across a stack: gates, all or none"})
    activation: str = field(default="gelu", metadata={"help": "act of the LSTM hidden computation: gelu or tanh"})
    init: str = field(default="lipschitz", metadata={
        "help": "initialisation: lipschitz (Neutron's, the authors') or xavier (tensor2tensor's)"})
    wiring: str = field(default="paper", metadata={
        "help": "decoder layer: paper (LSTM input s + a, cross-attention on LN(s + out); Section 3.3) or neutron "
                "(the authors' code: input a + LN(s + LN(out)), cross-attention on LN(s + LN(out)))",
        "older_runs": "paper"})  # the value of every run before the field existed: run keys leave it out there
    output_bias: bool = field(default=False, metadata={
        "help": "a bias on the tied output layer, logits = h E^T + b, as the authors' code has",
        "older_runs": False})

    def __post_init__(self):
        super().__post_init__()
        for name, value, allowed in (("hidden_layers", self.hidden_layers, (1, 2)), ("merge", self.merge, MERGES),
                                     ("share", self.share, SHARES), ("activation", self.activation, tuple(ACTIVATIONS)),
                                     ("wiring", self.wiring, WIRINGS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}, got {value!r}")
        if self.wiring == "neutron" and self.merge != "add":
            raise ValueError("wiring=neutron adds the cross-attention output to its normalised input (the authors' "
                             "code); it has no concat merge: use merge=add, or wiring=paper with merge=concat")


class GateNorm(nn.Module):
    """LN over each of ``gates`` blocks of d features, with a gain and bias per gate (Eqs. 3-5 and 7)."""

    def __init__(self, gates: int, d: int, eps: float = EPS):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(gates, d))
        self.bias = nn.Parameter(torch.zeros(gates, d))
        self.eps = eps

    def forward(self, z: Tensor) -> Tensor:  # (..., gates * d) -> (..., gates, d)
        z = z.unflatten(-1, tuple(self.weight.shape))
        return F.layer_norm(z, z.shape[-1:], eps=self.eps) * self.weight + self.bias


class LSTMGates(nn.Module):
    """i, f, o = σ(LN(W c + b)), one LN per gate (Eqs. 3-5)."""

    def __init__(self, in_dim: int, d: int):
        super().__init__()
        self.proj = stacked_linear(in_dim, d, 3)  # W_i, W_f, W_o, each drawn as an (in_dim -> d) layer
        self.norm = GateNorm(3, d)

    def forward(self, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        i, f, o = torch.sigmoid(self.norm(self.proj(c))).unbind(-2)
        return i, f, o


class LSTMHidden(nn.Module):
    """h = act(LN(W_h c + b_h)) (Eq. 6, ``layers=1``) or h = W_h2 Drop(act(LN(W_h1 c + b_h1))) + b_h2 (Eq. 8)."""

    def __init__(self, in_dim: int, d: int, inner: int, layers: int, activation: str, dropout: float = 0.0):
        super().__init__()
        width = inner if layers == 2 else d
        self.proj = xavier_linear(in_dim, width)
        self.norm = nn.LayerNorm(width, eps=EPS)
        self.act = ACTIVATIONS[activation]()
        self.drop = nn.Dropout(dropout) if layers == 2 else nn.Identity()
        self.out = xavier_linear(inner, d) if layers == 2 else nn.Identity()

    def forward(self, c: Tensor) -> Tensor:
        return self.out(self.drop(self.act(self.norm(self.proj(c)))))


class DepthWiseLSTM(nn.Module):
    """One step over depth: (x, (out_{i-1}, cell_{i-1})) -> (out_i, cell_i) (Eqs. 2, 9, 10)."""

    def __init__(self, gates: LSTMGates, hidden: LSTMHidden, dropout: float):
        super().__init__()
        self.gates, self.hidden = gates, hidden
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        out, cell = state
        c = torch.cat([x, out], dim=-1)  # Eq. 2
        i, f, o = self.gates(c)
        h = self.drop(self.hidden(c))
        cell = cell * f + h * i  # Eq. 9
        return cell * o, cell  # Eq. 10


def lstm_units(cfg: DepthWiseLSTMConfig, layers: int, input_dim: int) -> list[DepthWiseLSTM]:
    """One LSTM unit per layer of a stack, sharing as ``cfg.share`` says (Table 4)."""
    d = cfg.d_model
    c_dim = input_dim + d

    def gates() -> LSTMGates:
        return LSTMGates(c_dim, d)

    def hidden() -> LSTMHidden:
        return LSTMHidden(c_dim, d, cfg.ffn_dim, cfg.hidden_layers, cfg.activation, cfg.dropout)

    if cfg.share == "all":
        return [DepthWiseLSTM(gates(), hidden(), cfg.dropout)] * layers
    shared = gates() if cfg.share == "gates" else None
    return [DepthWiseLSTM(shared or gates(), hidden(), cfg.dropout) for _ in range(layers)]


class EncoderLayer(nn.Module):
    def __init__(self, cfg: DepthWiseLSTMConfig, lstm: DepthWiseLSTM):
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.d_model, eps=EPS)
        self.self_attn = SelfAttention(cfg.d_model, cfg.heads, cfg.attention_dropout)
        self.lstm = lstm
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, out: Tensor, cell: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:  # (B, S, D) each
        h = self.attn_norm(out)
        a = self.drop(self.self_attn(h, mask))
        return self.lstm(a, (out, cell))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DepthWiseLSTMConfig, lstm: DepthWiseLSTM):
        super().__init__()
        d = cfg.d_model
        self.self_norm = nn.LayerNorm(d, eps=EPS)
        self.self_attn = SelfAttention(d, cfg.heads, cfg.attention_dropout)
        self.cross_norm = nn.LayerNorm(d, eps=EPS)
        self.cross_attn = CrossAttention(d, cfg.heads, cfg.attention_dropout)
        self.lstm = lstm
        self.drop = nn.Dropout(cfg.dropout)
        self.merge, self.neutron = cfg.merge, cfg.wiring == "neutron"

    def forward(self, out: Tensor, cell: Tensor, cross_kv: tuple[Tensor, Tensor], memory_mask: Tensor,
                cache: dict[str, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        h = self.self_norm(out)
        s = self.drop(self.self_attn(h, causal=True, cache=cache))
        if self.neutron:  # q = LN_c(s + LN_s(out)); the LSTM reads a + q
            q = self.cross_norm(s + h)
            return self.lstm(self.drop(self.cross_attn(q, cross_kv, memory_mask)) + q, (out, cell))
        a = self.drop(self.cross_attn(self.cross_norm(s + out), cross_kv, memory_mask))
        merged = s + a if self.merge == "add" else torch.cat([s, a], dim=-1)
        return self.lstm(merged, (out, cell))


class DepthWiseLSTMEncoder(nn.Module):
    def __init__(self, cfg: DepthWiseLSTMConfig):
        super().__init__()
        units = lstm_units(cfg, cfg.encoder_layers, cfg.d_model)
        self.layers = nn.ModuleList(EncoderLayer(cfg, u) for u in units)
        self.norm = nn.LayerNorm(cfg.d_model, eps=EPS)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        out = cell = x  # the first layer's (out, cell) start from the embedded input
        for layer in self.layers:
            out, cell = layer(out, cell, mask)
        return self.norm(out)


class DepthWiseLSTMDecoder(nn.Module):
    def __init__(self, cfg: DepthWiseLSTMConfig):
        super().__init__()
        width = cfg.d_model * (2 if cfg.merge == "concat" else 1)
        units = lstm_units(cfg, cfg.decoder_layers, width)
        self.layers = nn.ModuleList(DecoderLayer(cfg, u) for u in units)
        self.norm = nn.LayerNorm(cfg.d_model, eps=EPS)

    def cross_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        return [layer.cross_attn.project_kv(memory) for layer in self.layers]

    def forward(self, x: Tensor, cross: list[tuple[Tensor, Tensor]], memory_mask: Tensor,
                caches: list[dict[str, Tensor]] | None = None) -> Tensor:
        out = cell = x
        for i, layer in enumerate(self.layers):
            out, cell = layer(out, cell, cross[i], memory_mask, None if caches is None else caches[i])
        return self.norm(out)


class DepthWiseLSTMTransformer(EncoderDecoder):
    """The shell around :class:`DepthWiseLSTMEncoder` and :class:`DepthWiseLSTMDecoder`."""

    def __init__(self, cfg: DepthWiseLSTMConfig):
        super().__init__(cfg, DepthWiseLSTMEncoder(cfg), DepthWiseLSTMDecoder(cfg))
        self.output_bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if cfg.output_bias else None

    def output(self, h: Tensor) -> Tensor:
        """Logits over the vocabulary through the tied embedding: h E^T, + b with ``output_bias``."""
        return F.linear(h, self.embed.weight, self.output_bias)
