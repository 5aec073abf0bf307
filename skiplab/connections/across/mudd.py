"""MUDD: multiway dynamic dense connections; the next layer's queries, keys, values and residual each read their own
per-token mix of the embeddings and every earlier layer's output."""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..base import Branch, Connection
from ..spec import Spec
from .base import AcrossDesign, Stack, depth_sum, register_across

STREAMS = ("Q", "K", "V", "R")
EPS = 1e-6  # the weights' MLP's RMSNorm (the code's norm_eps, RMSnormNoscale's epsilon)


def hidden_width(layer: int, layers: int) -> int:
    """The width of layer ``layer``'s (0-based) weight MLP: C·(i + 2), ×4 for the last layer (C = 1), rounded
    up past a multiple of 64 as the code does, (h // 64 + 1)·64 (64 → 128)."""
    last = layer == layers - 1
    h = (1 if last else len(STREAMS)) * (layer + 2) * (4 if last else 1)
    return (h // 64 + 1) * 64


@register_across
class MUDD(AcrossDesign):
    """``+MUDD``: multiway dynamic dense connections (Xiao et al., ICML 2025, "MUDDFormer: Breaking Residual
    Bottlenecks in Transformers via Multiway Dynamic Dense Connections", arXiv 2502.12170, Section 2). With X_0
    the stack's input (the embeddings) and X_{i+1} layer i's output (0-based), after layer i < L − 1, per token
    and for each stream c ∈ {Q, K, V, R}

        A_i = W2_i GELU(W1_i RMSNorm(X_{i+1})) + B_i       (4 × (i + 2) numbers a token)
        X^c = Σ_{j=0}^{i+1} A_i[c, j] · X_j,

    and layer i + 1 runs its self-attention on the normalised streams and its residual on X^R,

        h = X^R + B_attn(X^Q; keys from X^K, values from X^V),   output = h + B_mlp(h)   (the MLP plain),

    B the connection's branch term, y = x + B(x) (its pre-norm G: queries, keys and values read G(X^Q), G(X^K),
    G(X^V); Peri-LN also normalises the attention's output); layer 0 reads X_0 in every stream (the plain layer).
    After the last layer one stream: the stack's output is Σ_j A_{L−1}[0, j] · X_j (before the final norm).
    RMSNorm has no scale (eps 1e-6); W1_i (h × d) starts at N(0, 1/d), W2_i at 0, the static bias B_i at 0 but
    for the newest output, B_i[c, i + 1] = 1: every stream is X_{i+1}, the plain model, at the start. The width
    h = C·(i + 2) (×4 for the last layer, C = 1) rounded to (h // 64 + 1)·64 (:func:`hidden_width`). B_i is kept
    1-d, so skiplab's AdamW (decay on matrices only) leaves it undecayed.

    Read: Caiyun-AI/MUDDFormer, ``pytorch/muddformer/modeling_muddformer.py`` (``MultiwayDynamicDenseBlock``:
    ``RMSnormNoscale``, ``w1``, ``GELU``, ``w2``, the rearrangement ``(C L)``, ``layer_mix``; ``MUDDFormer.forward``:
    ``dw + self.dense_bs[i]``, ``x = x[0]`` at the end; ``TransformerBlock.forward`` with ``dense_type='qkvr'``:
    ``res = x[-1]``, queries, keys and values projected from ``x[:3]``) and ``jax/MaxText/layers/llama2.py``
    (``LlamaDecoderLayer.setup``: the initialisation, ``nd_dense_init(1.0, "fan_in", "normal")``, ``dense_proj2``
    at 0.0, ``dense_proj2_bias`` [0, ..., 0, 1]; its ``nn.gelu`` is flax's, the tanh approximation, as here;
    the PyTorch inference port's ``nn.GELU()`` is the erf form). This is the PyTorch code's form, the jax code's
    with ``mudd_prenorm`` and ``mudd_postnorm`` off; its later options (normalised X_j, a post-norm on X^R, a
    bias of 0 for X_{i+1} with both on) are not here. The released config's ``sepln`` gives the Q, K and V inputs three norms of their own; here they share the
    connection's G, the code's ``sepln=False`` path. modded-nanogpt's trimmed form (pull request #259, by its
    description) mixes into the last two layers alone; this is the paper's, every layer.

    Keeps in memory, per position: X_0, ..., X_L (as DenseFormer) and each layer's four input streams and mixing
    weights A_i; the backward keeps them too. Per position throughout, so incremental decoding is exact (each
    layer's key/value cache holds the keys and values projected from its X^K, X^V). Transformer: the encoder's
    and the decoder's self-attention read the streams; the decoder's cross-attention and every MLP are plain.
    """

    name = "MUDD"
    patterns = {"+MUDD": "after layer i: X^c = Σ_{j≤i+1} A_i[c,j](X_{i+1}) X_j for c = Q, K, V, R, A_i = W2 GELU(W1 "
                         "RMSNorm(X_{i+1})) + B_i; the next attention reads Q, K, V from X^Q, X^K, X^V, its residual "
                         "X^R  (Xiao et al. 2025, MUDDFormer)"}
    owns_sublayers = True
    replaces_sum = True

    mix_axes = ("layer i's input stream (the last row: the output)", "X_j (0: the embeddings; j: layer j − 1's output)")

    def __init__(self, spec: Spec, stack: Stack):
        super().__init__(spec, stack)
        if stack.dim < 1:
            raise ValueError("+MUDD needs the stack's width (Stack.dim) for its weights' MLPs")
        self.stack = stack
        d, layers = stack.dim, stack.layers
        self.w1, self.w2, self.bias = nn.ParameterList(), nn.ParameterList(), nn.ParameterList()
        for i in range(layers):
            c, n, h = self.streams(i), i + 2, hidden_width(i, layers)
            self.w1.append(nn.Parameter(torch.randn(h, d) / math.sqrt(d)))  # variance 1/fan_in
            self.w2.append(nn.Parameter(torch.zeros(c * n, h)))
            bias = torch.zeros(c, n)
            bias[:, -1] = 1.0
            self.bias.append(nn.Parameter(bias.flatten()))
        self.kept: dict[int, list[Tensor]] | None = None  # each layer's A_i, inside keeping()

    def streams(self, i: int) -> int:
        """C, the streams layer i's weights mix: 4, and 1 (the output) after the last layer."""
        return 1 if i == self.stack.layers - 1 else len(STREAMS)

    def weights(self, i: int, x: Tensor) -> Tensor:
        """A_i (..., C, i + 2) of layer i's output ``x`` (..., d)."""
        c = self.streams(i)
        h = F.gelu(F.linear(F.rms_norm(x, x.shape[-1:], eps=EPS), self.w1[i].to(x.dtype)), approximate="tanh")
        a = F.linear(h, self.w2[i].to(x.dtype)) + self.bias[i].to(x.dtype)
        return a.unflatten(-1, (c, i + 2))

    def begin(self, x: Tensor, state: dict[str, Any]) -> None:
        state["hidden"] = [x]
        state["streams"] = {}  # layer -> its input streams, by layer: a recomputed layer reads its own

    def leave(self, i: int, x: Tensor, state: dict[str, Any]) -> None:
        hidden = state["hidden"]
        hidden.append(x)
        a = self.weights(i, x)
        if self.kept is not None:
            self.kept.setdefault(i, []).append(a.detach())
        if self.mix_log is not None:  # analyze gates (recording_mixes): row i + 1, one matrix a stream
            for c in range(self.streams(i)):
                self.record_mix(i + 1, a[..., c, :], STREAMS[c] if self.streams(i) > 1 else "R")
        state["streams"][i + 1] = tuple(self._mix(a[..., c, :], hidden) for c in range(self.streams(i)))

    @staticmethod
    def _mix(a: Tensor, hidden: list[Tensor]) -> Tensor:
        """Σ_j a_j X_j (the code's ``layer_mix``: no stacked copy of the X_j; :func:`depth_sum`)."""
        return depth_sum([a[..., j, None] for j in range(len(hidden))], hidden)

    def sublayer(self, k: int, x: Tensor, conn: Connection, branch: Branch, state: dict[str, Any]) -> Tensor:
        i = k // len(self.stack.roles)
        if i == 0 or self.stack.role(k) != "attn":
            return conn(x, branch)
        q, key, value, residual = state["streams"][i]
        g = conn.branch_input
        return residual + conn.branch_output(branch(g(q), kv=(g(key), g(value))))

    def finish(self, x: Tensor, state: dict[str, Any]) -> Tensor:
        return state["streams"][self.stack.layers][0]

    @contextmanager
    def keeping(self) -> Iterator[dict[int, list[Tensor]]]:
        """Within the block, each forward pass's A_i (detached) are kept: yields {layer i: [A_i of each pass]}
        for :meth:`reads`."""
        self.kept = {}
        try:
            yield self.kept
        finally:
            self.kept = None

    def reads(self, kept: dict[int, list[Tensor]]) -> tuple[Tensor, Tensor]:
        """The matrices "layer i reads j" of the passes in ``kept`` (:meth:`keeping`): the mean and the std over
        positions, (4, L + 1, L + 1), stream c = Q, K, V, R; row i the weights of X_0, ..., X_L in layer i's input
        streams (0-based; row 0 the embeddings alone, std 0; row L the stack's output, under R, its Q, K, V rows
        NaN), zero where there is no weight."""
        n = self.stack.layers + 1
        mean, std = torch.zeros(len(STREAMS), n, n), torch.zeros(len(STREAMS), n, n)
        mean[:, 0, 0] = 1.0
        mean[:3, -1], std[:3, -1] = float("nan"), float("nan")
        for i, passes in sorted(kept.items()):
            a = torch.cat([p.reshape(-1, *p.shape[-2:]) for p in passes]).float().cpu()  # (positions, C, i + 2)
            rows = slice(None) if a.shape[1] == len(STREAMS) else slice(3, 4)
            mean[rows, i + 1, : i + 2] = a.mean(0)
            std[rows, i + 1, : i + 2] = a.std(0, unbiased=False)
        return mean, std

    def static(self) -> Tensor:
        """The static biases B_i as a (4, L + 1, L + 1) matrix laid out as :meth:`reads` (row 0 the embeddings'
        1, the output's Q, K, V rows 0)."""
        n = self.stack.layers + 1
        m = torch.zeros(len(STREAMS), n, n)
        m[:, 0, 0] = 1.0
        for i, b in enumerate(self.bias):
            c = self.streams(i)
            rows = slice(None) if c == len(STREAMS) else slice(3, 4)
            m[rows, i + 1, : i + 2] = b.detach().float().cpu().view(c, i + 2)
        return m

    def stats(self) -> dict[str, Tensor]:
        """``bias_{c}_{j}``: B_i[c, j], the static weight of X_j in stream c after layer i (entry i = 0, ..., L − 1;
        0 where there is none: j > i + 1, and the output's Q, K, V)."""
        m = self.static()
        return {f"bias_{s}_{j}": m[c, 1:, j].clone() for c, s in enumerate(STREAMS) for j in range(m.shape[-1])}

    def rows(self) -> list[tuple[int, str, float]]:
        """(layer i, ``bias_{c}_{j}``, B_i[c, j]) for the learned biases alone (the output's single stream as R)."""
        out = []
        for i, b in enumerate(self.bias):
            names = STREAMS if self.streams(i) == len(STREAMS) else STREAMS[3:]
            b = b.detach().cpu().view(len(names), i + 2)
            out += [(i, f"bias_{s}_{j}", float(b[c, j])) for c, s in enumerate(names) for j in range(i + 2)]
        return out
