"""DenseFormer: after a block, a depth-weighted average of the embeddings and every earlier block's output."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..spec import Option, Spec, positive_int
from .base import AcrossDesign, Stack, depth_sum, register_across


@register_across
class DenseFormer(AcrossDesign):
    """``+DenseFormer(dilation=k, period=p)``: depth-weighted averages (DWA; Pagliardini et al., NeurIPS 2024,
    "DenseFormer: Enhancing Information Flow in Transformers via Depth Weighted Averaging", arXiv 2402.02622,
    Section 3). With X_0 the stack's input (the embeddings) and X_i block i's output (i = 1, ..., L, 1-based),
    a DWA after block i gives the next block's input (after block L: the stack's output, before its final norm)

        Y_i = Σ_{j ∈ S_i} α_ij · X_j,   S_i = {j ≤ i : j ≡ i (mod k)},   only where i ≡ 0 (mod p);

    a block not followed by a DWA hands its output on as it is (Y_i = X_i). k = p = 1 is the paper's
    DenseFormer, k > 1 its dilated one, p > 1 its periodic one (its "k×p-DenseFormer"). The α_i are learned,
    |S_i| = ⌊i/k⌋ + 1 numbers a DWA, starting at α_ii = 1 and the rest 0: the plain model, exactly. The X_j are
    the blocks' raw outputs (X_i, not Y_i, is what later DWAs read), every one of them kept, whether or not a DWA
    follows its block.

    Read: epfml/DenseFormer, ``denseformer/denseformer.py``, ``DWAModules``: the accumulator of dilation group
    (i mod k) receives X_i after block i (X_0 in group 0 at the start); ``nn.Linear((i+1+dilation)//dilation, 1)``
    a DWA for 0-based block index i with (i+1) % period == 0, weights zero but the last (X_i itself) at 1;
    ``torch.tensordot`` of them with that group's X_j. (``experiments/models/denseformer.py`` forms its groups
    with ``increase_T_every`` instead; the package's module is the one its README gives.) The α are 1-d here, so
    skiplab's AdamW (decay on matrices only) leaves them undecayed; the experiments' code decays them as
    ``nn.Linear`` weights.

    Keeps in memory: X_0, ..., X_L of every position (references to tensors the backward keeps anyway). Every
    quantity is per position, so incremental decoding is exact.
    """

    name = "DenseFormer"
    options = {"dilation": Option(1, positive_int, "k: a DWA after block i reads X_j with j ≡ i (mod k) only"),
               "period": Option(1, positive_int, "p: a DWA after every p-th block only")}
    patterns = {"+DenseFormer(dilation=k,period=p)": "after block i ≡ 0 (mod p): Y_i = Σ_{j≤i, j≡i (mod k)} α_ij X_j, "
                                                     "X_0 the embeddings; α_ii = 1, the rest 0 at the start  "
                                                     "(Pagliardini et al. 2024, DenseFormer)"}

    mix_axes = ("layer i's input (the last row: the output)", "X_j (0: the embeddings; j: layer j − 1's output)")

    def __init__(self, spec: Spec, stack: Stack):
        super().__init__(spec, stack)
        self.dilation, self.period = int(spec.options["dilation"]), int(spec.options["period"])
        self.layers = stack.layers
        self.points = [i for i in range(1, self.layers + 1) if i % self.period == 0]  # blocks (1-based) with a DWA
        starts = [torch.zeros(len(self.sources(i))) for i in self.points]
        for a in starts:
            a[-1] = 1.0  # α_ii
        self.alpha = nn.ParameterList(nn.Parameter(a) for a in starts)

    @classmethod
    def conflict(cls, spec: Spec, named: str, registry: dict[str, type], across: dict[str, type]) -> str | None:
        """A DWA's Y_i is made from the X_j alone, in place of the input it is handed: a design written before
        this one that changes a layer's input or the stack's output (``+UNet``, ``+Scalars``, ``+Backout``) would
        have its change thrown away, so it must come after (``PreLN+DenseFormer+UNet``: the U-Net adds to the
        averaged input)."""
        names = [s.name for s in spec.stack]
        before = names[: names.index(cls.name)]
        lost = next((n for n in before if across[n].enter is not AcrossDesign.enter
                     or across[n].finish is not AcrossDesign.finish), None)
        if lost:
            return (f"+{cls.name}'s averages replace the stream that +{lost}, written before it, changes; write "
                    f"+{cls.name} before +{lost}")
        return super().conflict(spec, named, registry, across)

    def sources(self, i: int) -> list[int]:
        """S_i: the j whose X_j the DWA after block i reads, oldest first (the last is i)."""
        return list(range(i % self.dilation, i + 1, self.dilation))

    def begin(self, x: Tensor, state: dict[str, Any]) -> None:
        state["dense"] = [x]

    def leave(self, i: int, x: Tensor, state: dict[str, Any]) -> None:
        state["dense"].append(x)  # X_{i+1}: layer i is block i + 1

    def enter(self, i: int, x: Tensor, state: dict[str, Any]) -> Tensor:
        self._record(i)
        return self._average(i, x, state) if i else x

    def finish(self, x: Tensor, state: dict[str, Any]) -> Tensor:
        self._record(self.layers)
        return self._average(self.layers, x, state)

    def _record(self, i: int) -> None:
        """Row i of :meth:`reads` (the weights of X_0, ..., X_i), for analyze gates (inside recording_mixes)."""
        if self.mix_log is not None:
            self.record_mix(i, self.reads()[i, : i + 1])

    def _average(self, i: int, x: Tensor, state: dict[str, Any]) -> Tensor:
        """Y_i from X_i = ``x`` and the earlier X_j (the input of layer i, 0-based; i = L: the output)."""
        if i % self.period:
            return x
        alpha, xs = self.alpha[i // self.period - 1], state["dense"]
        # a sum of α_ij X_j that keeps no stacked copy of the X_j (depth_sum)
        return depth_sum(list(alpha.unbind()), [xs[j] for j in self.sources(i)])

    def reads(self) -> Tensor:
        """The matrix M (L + 1, L + 1) of "layer i reads j": row i the weights of X_0, ..., X_L in layer i's
        input (0-based; row 0 the embeddings alone, row L the stack's output), zero where there is no weight."""
        m = torch.eye(self.layers + 1, dtype=torch.float32)
        for i, a in zip(self.points, self.alpha):
            m[i] = 0.0
            m[i, self.sources(i)] = a.detach().float().cpu()
        return m

    def stats(self) -> dict[str, Tensor]:
        """``alpha_j``: X_j's weight in the input of layer i + 1 (entry i, i = 0, ..., L − 1: the DWA after layer
        i, 0-based; the last entry the output's), rows 1, ..., L of :meth:`reads`."""
        m = self.reads()
        return {f"alpha_{j}": m[1:, j].clone() for j in range(self.layers + 1)}

    def rows(self) -> list[tuple[int, str, float]]:
        """(layer i, ``alpha_j``, α) for the learned weights alone: the DWA after layer i (0-based), j ∈ S_{i+1}."""
        return [(i - 1, f"alpha_{j}", float(v)) for i, a in zip(self.points, self.alpha)
                for j, v in zip(self.sources(i), a.detach().cpu())]
