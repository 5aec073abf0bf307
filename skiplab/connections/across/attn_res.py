"""Attention Residuals (Kimi Team 2026): each sub-layer's input a softmax mix over depth of the earlier outputs."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor, nn

from ..base import Branch, Connection
from ..norms import make_norm
from ..spec import Option, Spec, choice
from .base import AcrossDesign, Stack, depth_sum, register_across

LORA_RANK = 64  # x-transformers' DEFAULT_ATTN_RESIDUAL_LORA_RANK


def _count(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < least:
            raise ValueError(f"must be an integer >= {least}, got {text}")
        return int(text)

    return parse


@register_across
class AttnRes(AcrossDesign):
    """``+AttnRes(block=S, query=static|lora, rank=64)``: Attention Residuals (Kimi Team, "Attention Residuals",
    arXiv 2603.15031, Section 3; MoonshotAI/Attention-Residuals, the README's ``block_attn_res`` pseudocode). The
    mix replaces the residual sum: with an additive connection y = x + B(x) (PreLN, PreRMS, LNS, PeriLN,
    SandwichLN; B(x) = branch_output(F(branch_input(x))), the connection supplying the pre-norm) the values are

        v_0 = the stack's input (the embeddings),   v_j = B_j(h_j), the additive term of sub-layer j = 1, ..., K

    (K = L·S_roles sub-layers: attention and MLP, in the Transformer's decoder cross-attention too; numbered from 1
    here, the hooks' k = l − 1), and sub-layer l reads, in place of the running sum x_l = v_0 + ... + v_{l−1},

        h_l = Σ_i α_{i→l} s_i,   α_{i→l} = φ(q_l, s_i) / Σ_j φ(q_l, s_j),   φ(q, k) = exp(qᵀ RMSNorm_l(k))

    over its sources s_i. ``block=0`` (Full AttnRes): the sources of sub-layer l are v_0, ..., v_{l−1}.
    ``block=S`` (Block AttnRes): sub-layers are grouped in blocks of S (block n = sub-layers
    (n−1)S + 1, ..., nS; the last may be shorter), b_0 = v_0 and b_n = the sum of block n's v_j; inside a block the
    sum is the plain residual one, and sub-layer l of block n reads the sources b_0, ..., b_{n−1} and, after the
    block's first sub-layer, the partial sum b_n^{l−1} of its earlier v_j. ``block=1`` is Full AttnRes. The stack's
    output, before its final norm, is one more mix with its own query, over every source (Full: v_0, ..., v_K;
    Block: b_0, ..., b_N). The stream that passes from sub-layer to sub-layer is the next mix: sub-layer l computes
    v_l, then h_{l+1} from the sources, and hands it on (the last one the output's mix), so a layer's output is the
    next layer's input, as in a residual stack, and what a hook or a gradient taken there sees.

    ``query=static`` (the paper's): q_l = w_l ∈ ℝ^d, a learned pseudo-query per mix, initialised to zero, so that
    every mix starts uniform (α = 1/n over n sources), as the paper prescribes.
    ``query=lora``: x-transformers' ``AttentionResidual`` (lucidrains/x-transformers 2.31.10, arXiv 2601.21582),
    the query made from the latest source s_last:

        q_l = RMSNorm_out(s_last + U_l D_l RMSNorm_in(s_last)),   logits_i = q_lᵀ RMSNorm_l(s_i) / √d

    with D_l ∈ ℝ^{r×d} drawn as ``nn.Linear``'s default (U(−1/√d, 1/√d)), U_l ∈ ℝ^{d×r} zero (r = ``rank`` < d), so
    that at the start q = RMSNorm(s_last), which weights the latest source most. x-transformers applies it over the
    residual-stream states (the hidden state before each layer) and keeps the residual sum (the layer's output is
    added to the unmixed state); skiplab's form is the same aggregation over the paper's values v_j (or block sums),
    the mix replacing the sum, as for ``query=static``. Every RMSNorm has its own gain (starting at 1); the keys'
    RMSNorm is one per mix (the README's pseudocode hands each call its ``norm``).

    Memory (in a pass without gradients): Full keeps every sub-layer's output, K + 1 tensors (B, T, d); Block one
    sum per block, b_0 and the completed ones and the partial one, at most N + 1 for N = ⌈K/S⌉ blocks. Under training autograd keeps every mix's
    sources for the backward in both. Computed as logits_i = ρ_i ⟨q ⊙ g, s_i⟩ with ρ_i = 1/√(mean(s_i²) + ε) and g
    the key norm's gain (the same number as qᵀ RMSNorm(s_i), without a normalised copy of each source per mix).
    Every quantity is per position, so incremental decoding is exact. A layer must not run twice (activation
    checkpointing): each run appends its output to the pass's sources.
    """

    name = "AttnRes"
    options = {"block": Option(0, _count(0), "sub-layers a block (Block AttnRes); 0: Full AttnRes"),
               "query": Option("static", choice("static", "lora"), "static: the paper's w_l from 0; lora: "
                                                                    "x-transformers' query from the latest source"),
               "rank": Option(LORA_RANK, _count(1), "the LoRA query's rank (query=lora)")}
    patterns = {"+AttnRes(block=0|S,query=static|lora)":
                "h_l = Σ_i softmax_i(w_lᵀ RMSNorm(v_i)) v_i over the embedding and earlier sub-layers' outputs "
                "(block=S: over block sums), replacing the residual sum  (Kimi Team 2026, Attention Residuals)"}
    owns_sublayers = True
    replaces_sum = True
    recomputable = False

    mix_axes = ("mix before sub-layer i (the last row: the output's)",
                "source j (0: the embeddings; j: sub-layer j − 1's output, or block j's sum)")

    def __init__(self, spec: Spec, stack: Stack):
        super().__init__(spec, stack)
        if stack.dim < 1:
            raise ValueError("+AttnRes needs the stack's width")
        d, mixes = stack.dim, stack.sublayers + 1  # one mix before each sub-layer and one for the output
        self.stack, self.block = stack, int(spec.options["block"]) or 1
        self.lora = spec.options["query"] == "lora"
        self.key_norms = nn.ModuleList(make_norm("RMS", d) for _ in range(mixes))
        if not self.lora:
            self.query = nn.Parameter(torch.zeros(mixes, d))
            return
        rank = int(spec.options["rank"])
        if rank >= d:
            raise ValueError(f"+AttnRes(query=lora): rank {rank} must be less than the width {d}")
        self.query_in = nn.ModuleList(make_norm("RMS", d) for _ in range(mixes))
        self.query_out = nn.ModuleList(make_norm("RMS", d) for _ in range(mixes))
        bound = 1.0 / math.sqrt(d)
        self.down = nn.Parameter(torch.empty(mixes, rank, d).uniform_(-bound, bound))
        self.up = nn.Parameter(torch.zeros(mixes, d, rank))

    @classmethod
    def conflict(cls, spec: Spec, named: str, registry: dict[str, type], across: dict[str, type]) -> str | None:
        mine = next(s for s in spec.stack if s.name == cls.name)
        if mine.options["query"] == "static" and mine.options["rank"] != LORA_RANK:
            return "+AttnRes(rank=...) is the LoRA query's rank; query=static has none (write query=lora)"
        return super().conflict(spec, named, registry, across)

    def begin(self, x: Tensor, state: dict[str, Any]) -> None:
        # sources: the completed values (Full: v_0, ..., v_l; Block: b_0, ..., b_{n−1}); partial: b_n so far
        state["attnres"] = {"sources": [x], "squares": [_mean_square(x)], "partial": None}

    def _query(self, m: int, latest: Tensor) -> Tensor:
        """q_m times the key norm's gain (and, for the LoRA query, 1/√d): (d,), or (B, T, d) for the LoRA query."""
        gain = self.key_norms[m].weight
        if not self.lora:
            return self.query[m] * gain
        delta = (self.query_in[m](latest) @ self.down[m].T) @ self.up[m].T
        return self.query_out[m](latest + delta) * gain / math.sqrt(latest.shape[-1])

    def mix(self, m: int, sources: list[Tensor], squares: list[Tensor] | None = None) -> Tensor:
        """Mix m (before sub-layer m; m = K: the output): Σ_i softmax_i(q_mᵀ RMSNorm_m(s_i)) s_i over ``sources``
        (each (B, T, d), the latest last); ``squares``: their mean(s²) over the features, where already known."""
        squares = [_mean_square(s) for s in sources] if squares is None else squares
        q = self._query(m, sources[-1])
        eps = self.key_norms[m].eps
        logits = torch.stack([_wide(s @ q.to(s.dtype) if q.dim() == 1 else (s * q.to(s.dtype)).sum(-1))
                              * torch.rsqrt(ms + eps) for s, ms in zip(sources, squares)], dim=-1)
        alpha = logits.softmax(-1)  # (B, T, n)
        self.record_mix(m, alpha)  # kept only inside depth_weights() or recording_mixes()
        return depth_sum([alpha[..., i : i + 1] for i in range(len(sources))], sources)

    def sublayer(self, k: int, x: Tensor, conn: Connection, branch: Branch, state: dict[str, Any]) -> Tensor:
        st = state["attnres"]
        h = self.mix(0, st["sources"], st["squares"]) if k == 0 else x  # h_0 = v_0; then what k − 1 handed on
        v = conn.branch_output(branch(conn.branch_input(h)))
        st["partial"] = v if st["partial"] is None else st["partial"] + v
        return self._next(k + 1, st)

    def _next(self, k: int, st: dict[str, Any]) -> Tensor:
        """Mix k over the sources it reads (k = K: the output's, over every block): the stream handed on."""
        if st["partial"] is not None and (k % self.block == 0 or k == self.stack.sublayers):  # a block completed
            st["sources"].append(st["partial"])
            st["squares"].append(_mean_square(st["partial"]))
            st["partial"] = None
        if st["partial"] is None:
            return self.mix(k, st["sources"], st["squares"])
        return self.mix(k, [*st["sources"], st["partial"]], [*st["squares"], _mean_square(st["partial"])])

    def finish(self, x: Tensor, state: dict[str, Any]) -> Tensor:
        return x  # the last sub-layer handed on the output's mix

    @torch.no_grad()
    def depth_weights(self, forward: Callable[[], Any]) -> tuple[Tensor, Tensor]:
        """The weights "sub-layer i reads source j" of one batch: runs ``forward()`` (a pass of the model that
        holds this stack) without gradients and returns their mean and std over every position, each a
        (K + 1, C) tensor: row i < K the mix before sub-layer i, row K the output's; column j source j (Full,
        C = K + 1: 0 the embedding, j the output of sub-layer j − 1; Block, C = N + 1: 0 the embedding, j the sum
        of block j, complete or partial); NaN where row i does not read source j."""
        self.mix_log = []
        try:
            forward()
            seen = [(m, a) for _, m, a in self.mix_log]
        finally:
            self.mix_log = None
        if not seen:
            raise ValueError("+AttnRes: forward() ran no pass through this stack; nothing to average")
        k = self.stack.sublayers
        cols = -(-k // self.block) + 1  # b_0 and the ⌈K/S⌉ blocks (S = 1: every sub-layer's output)
        mean, std = torch.full((2, k + 1, cols), float("nan"))
        for m in range(k + 1):
            alpha = torch.cat([a.reshape(-1, a.shape[-1]) for i, a in seen if i == m]).float().cpu()
            mean[m, : alpha.shape[1]] = alpha.mean(0)
            std[m, : alpha.shape[1]] = alpha.std(0, unbiased=False)
        return mean, std

    def stats(self) -> dict[str, Tensor]:
        """One entry per mix (sub-layer 0, ..., K − 1, then the output): ``query_norm`` ‖w_l‖ (query=static), or
        ``lora_norm`` ‖U_l D_l‖_F, the LoRA's departure from q = RMSNorm(s_last) (query=lora)."""
        if not self.lora:
            return {"query_norm": self.query.detach().norm(dim=-1).cpu()}
        return {"lora_norm": torch.linalg.matrix_norm(self.up.detach() @ self.down.detach()).cpu()}

    def rows(self) -> list[tuple[int, str, float]]:
        """(layer, quantity_role, value): a sub-layer's entry at its layer with its role ("query_norm_attn"), the
        output's at layer L ("query_norm_out")."""
        roles = len(self.stack.roles)
        return [(m // roles, f"{key}_{self.stack.role(m)}", float(v)) if m < self.stack.sublayers
                else (self.stack.layers, f"{key}_out", float(v))
                for key, t in self.stats().items() for m, v in enumerate(t)]


def _wide(x: Tensor) -> Tensor:
    """``x`` in float32 where it is in a half type (float16, bfloat16), else as it is."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _mean_square(x: Tensor) -> Tensor:
    """mean(x²) over the features, (B, T), at least float32: what every mix's RMSNorm of ``x`` divides by."""
    return _wide(x).square().mean(-1)

