"""How a trained model's activations are distributed, block by block (the tutorial's point, on a trained model).

For each block's output y (a depth-wise LSTM layer: its output, not its cell): mean, std, the share of
near-zero values |y| < ``near_zero`` and of large ones |y| > ``large``, and a histogram. For every
connection that normalises (λxSkip+G, krSkip+G: its first G, wSkip+G, SAS), the same of the sum it
normalises, h = λx + F (x + F for SAS and krSkip's first step), against G(h): without the norm the sum's
scale grows with depth; after it, it is held near zero mean and unit variance.

Values count once per example entry (images) or per real position (MT: padding left out).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from tqdm import tqdm

from ..connections import iter_connections, recording
from .report import Moments, markdown, per_position, pyplot
from .trained import Trained

EDGES = torch.linspace(-8.0, 8.0, 161)  # histogram bins of width 0.1; values beyond go to the edge bins


class Distribution:
    """Moments, tail shares and a fixed-bin histogram of values fed in batches."""

    def __init__(self, near_zero: float, large: float) -> None:
        self.m, self.near_zero, self.large = Moments(), near_zero, large
        self.small_n = self.large_n = 0
        self.hist = torch.zeros(len(EDGES) - 1, dtype=torch.float64)

    def add(self, v: torch.Tensor) -> None:
        v = v.detach().float().flatten()
        self.m.add(v)
        self.small_n += int((v.abs() < self.near_zero).sum())
        self.large_n += int((v.abs() > self.large).sum())
        idx = torch.bucketize(v.clamp(EDGES[0], EDGES[-1]), EDGES[1:-1])
        self.hist += torch.bincount(idx, minlength=len(EDGES) - 1).double()

    def summary(self) -> dict[str, Any]:
        n = max(self.m.n, 1)
        return {"mean": self.m.mean, "std": self.m.std, "near_zero": self.small_n / n, "large": self.large_n / n,
                "count": self.m.n, "histogram": (self.hist / n).tolist()}


def activations(tr: Trained, split: str = "test", examples: int = 2000, seed: int = 0, near_zero: float = 0.01,
                large: float = 5.0, progress: bool = True) -> dict[str, Any]:
    blocks = tr.blocks()
    outputs: dict[str, torch.Tensor] = {}
    hooks = [b.register_forward_hook(lambda m, i, o, name=name: outputs.__setitem__(name, o[0] if isinstance(o, tuple) else o))
             for name, b in blocks.items()]
    out_dist = {n: Distribution(near_zero, large) for n in blocks}
    norm_dist: dict[str, dict[str, Distribution]] = {}
    seen, t0 = 0, time.time()
    tr.model.eval()
    bar = tqdm(total=examples, desc=f"activations {tr.path.name}", unit="ex", disable=not progress)
    try:
        with torch.no_grad(), recording(tr.model) as logs:
            for ex in tr.examples(split, examples, seed):
                outputs.clear()
                tr.forward(ex)
                for name, y in outputs.items():
                    out_dist[name].add(_rows(tr, name, y, ex))
                for name, log in logs.items():
                    for entry in log:
                        if "pre" in entry:
                            d = norm_dist.setdefault(name, {k: Distribution(near_zero, large) for k in ("pre", "post")})
                            for k in ("pre", "post"):
                                d[k].add(_rows(tr, name, entry[k], ex))
                    log.clear()
                seen += len(ex)
                bar.update(len(ex))
    finally:
        bar.close()
        for h in hooks:
            h.remove()
    conns = dict(iter_connections(tr.model))
    return {"analysis": "activations", "run": str(tr.path), "label": tr.label, "split": split, "examples": seen,
            "mode": "eval", "seed": seed, "near_zero": near_zero, "large": large, "bin_edges": EDGES.tolist(),
            "blocks": [{"block": n, "stage": tr.stage_of(n), **out_dist[n].summary()} for n in blocks],
            "normalised": [{"connection": n, "block": tr.block_of(n), "spec": conns[n].spec,
                            "pre": d["pre"].summary(), "post": d["post"].summary()} for n, d in norm_dist.items()],
            "time_s": time.time() - t0, "config": tr.config}


def _rows(tr: Trained, name: str, value: torch.Tensor, ex) -> torch.Tensor:
    """The values that count: an image block's whole output, an MT layer's real positions (every stream of a
    hyper-connection layer's (B, T, n, D) output at them: its padding counted too, before)."""
    mask = tr.mask(ex, name)
    return per_position(value.flatten(2), mask, len(ex)) if mask is not None and value.dim() >= 3 else value


def table(result: dict[str, Any]) -> str:
    nz, lg = result["near_zero"], result["large"]
    body = [[b["block"], b["mean"], b["std"], b["near_zero"], b["large"]] for b in result["blocks"]]
    text = markdown(["block output", "mean", "std", f"share |y| < {nz:g}", f"share |y| > {lg:g}"], body)
    if result["normalised"]:
        body = [[c["connection"], c["spec"], c["pre"]["mean"], c["pre"]["std"], c["post"]["mean"], c["post"]["std"]]
                for c in result["normalised"]]
        text += "\n\n" + markdown(["connection", "spec", "h mean", "h std", "G(h) mean", "G(h) std"], body)
    return text


def figure(results: list[dict[str, Any]]):
    """Left: each block's output std (mean dashed) per run. Right: histograms of the middle normalising
    connection's sum h against G(h) (per run), or of the first, middle and last block outputs."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    centres = [(a + b) / 2 for a, b in zip(results[0]["bin_edges"][:-1], results[0]["bin_edges"][1:])]
    for i, r in enumerate(results):
        xs = range(1, len(r["blocks"]) + 1)
        left.plot(xs, [b["std"] for b in r["blocks"]], marker="o", ms=3, color=f"C{i}", label=f"{r['label']}: std")
        left.plot(xs, [b["mean"] for b in r["blocks"]], ls="--", color=f"C{i}", label=f"{r['label']}: mean")
        if r["normalised"]:
            mid = r["normalised"][len(r["normalised"]) // 2]
            right.plot(centres, mid["pre"]["histogram"], color=f"C{i}", ls="--", label=f"{r['label']}: h ({mid['connection']})")
            right.plot(centres, mid["post"]["histogram"], color=f"C{i}", label=f"{r['label']}: G(h)")
        else:
            for j, b in enumerate((r["blocks"][0], r["blocks"][len(r["blocks"]) // 2], r["blocks"][-1])):
                right.plot(centres, b["histogram"], color=f"C{i}", alpha=0.4 + 0.3 * j, label=f"{r['label']}: {b['block']}")
    left.set_xlabel("block (input side first)")
    left.set_ylabel("block output")
    left.grid(True, alpha=0.3)
    left.legend(fontsize=7)
    right.set_xlabel("value (the edge bins hold everything beyond ±8)")
    right.set_ylabel("share per bin of width 0.1")
    right.set_yscale("log")
    right.grid(True, alpha=0.3)
    right.legend(fontsize=7)
    first = results[0]
    fig.suptitle(f"activations, {first['examples']} {first['split']} examples")
    fig.tight_layout()
    return fig
