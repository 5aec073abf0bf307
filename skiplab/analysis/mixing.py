"""Depth mixing, for ``analyze gates``: with which weights each layer or sub-layer of a stack reads the earlier
ones, for the designs across a stack that mix earlier outputs (Attention Residuals, DenseFormer, MUDD).

For a target t (a layer or sub-layer, or the stack's output) and its sources j (the embeddings and the earlier
outputs, or block sums), the matrix entry is the mean over positions of the weight w_tj with which t reads j,
beside its standard deviation over positions (0 for a static design, whose weights are the same everywhere).
A design with several inputs per target (MUDD's query, key, value and residual streams) gives one matrix a
stream. Every real position counts once (MT: padding left out), as in the rest of ``gates``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from ..connections.across import recording_mixes
from .trained import Trained


class _Rows:
    """Running sum and sum of squares of weight vectors (per source), in float64."""

    def __init__(self) -> None:
        self.n, self.sum, self.sumsq = 0, None, None

    def add(self, rows: Tensor) -> None:
        rows = rows.double()
        s, q = rows.sum(0), rows.pow(2).sum(0)
        self.n += rows.shape[0]
        self.sum = s if self.sum is None else self.sum + s
        self.sumsq = q if self.sumsq is None else self.sumsq + q

    def moments(self) -> tuple[list[float], list[float]]:
        mean = self.sum / self.n
        return mean.tolist(), (self.sumsq / self.n - mean.pow(2)).clamp(min=0).sqrt().tolist()


def _rows(weights: Tensor, mask: Tensor | None) -> Tensor:
    """(count, sources): one row per real position, or the one row of a static design's weights."""
    if weights.dim() == 1:
        return weights[None]
    if mask is not None and weights.dim() == 3:
        return weights[mask]
    return weights.reshape(-1, weights.shape[-1])


def mixing(tr: Trained, split: str = "train", examples: int = 10000, seed: int = 0,
           progress: bool = True) -> list[dict[str, Any]]:
    """One entry per stack, design and stream that mixes earlier outputs: ``targets`` (their indices), ``mean``
    and ``std`` (a row per target, a column per source; NaN where a target has fewer sources), ``axes`` (what
    targets and sources are), ``examples`` (how many were read). Empty where the model holds no such design."""
    with recording_mixes(tr.model) as designs:
        if not designs:
            return []
        where = {}  # design -> the prefix of the stack that holds it
        for prefix, path in tr.stacks.items():
            held = getattr(tr.model.get_submodule(path.rpartition(".")[0]), "across", None)
            where.update({id(d): prefix for d in (held.designs if held is not None else ())})
        acc: dict[tuple[str, str, str, int], _Rows] = {}
        seen = 0
        tr.model.eval()
        bar = tqdm(total=examples, desc=f"depth mixing {tr.path.name}", unit="ex", disable=not progress)
        with torch.no_grad():
            for ex in tr.examples(split, examples, seed):
                tr.forward(ex)
                for d in designs:
                    prefix = where.get(id(d), "")
                    mask = tr.mask(ex, f"{prefix}.0")
                    for stream, target, w in d.mix_log:
                        acc.setdefault((prefix, d.name, stream, target), _Rows()).add(_rows(w, mask))
                    d.mix_log.clear()
                seen += len(ex)
                bar.update(len(ex))
        bar.close()
        axes = {d.name: d.mix_axes for d in designs}
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for (prefix, name, stream, target), rows in sorted(acc.items()):
        entry = out.setdefault((prefix, name, stream), {"stack": prefix, "design": name, "stream": stream,
                                                       "axes": list(axes[name]), "examples": seen, "targets": [],
                                                       "mean": [], "std": []})
        mean, std = rows.moments()
        entry["targets"].append(target)
        entry["mean"].append(mean)
        entry["std"].append(std)
    for entry in out.values():  # rows of one length: NaN where a target reads fewer sources
        width = max(len(m) for m in entry["mean"])
        for key in ("mean", "std"):
            entry[key] = [m + [math.nan] * (width - len(m)) for m in entry[key]]
    return list(out.values())


def draw(axes_list, entries: list[dict[str, Any]]) -> None:
    """One heatmap a matrix (its mean weights; the largest std over positions in the title)."""
    for ax, e in zip(axes_list, entries):
        mean = torch.tensor(e["mean"])
        image = ax.imshow(mean.numpy(), cmap="viridis", aspect="auto", vmin=0.0,
                          vmax=max(1.0, float(mean.nan_to_num(0).max())))
        spread = torch.tensor(e["std"]).nan_to_num(0).max().item()
        stream = f", stream {e['stream']}" if e["stream"] else ""
        ax.set_title(f"{e['stack']} +{e['design']}{stream}: mean weight (largest std {spread:.3f})", fontsize=8)
        ax.set_ylabel(f"{e['axes'][0]} (row: targets {e['targets'][0]}..{e['targets'][-1]})", fontsize=8)
        ax.set_xlabel(e["axes"][1], fontsize=8)
        ax.figure.colorbar(image, ax=ax, fraction=0.046)
