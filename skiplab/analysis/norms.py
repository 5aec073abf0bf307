"""How large a trained model's hidden states and sub-layer outputs are, layer by layer: the norm growth of
Pre-LN stacks ("The Curse of Depth in Large Language Models", Sun et al. 2025, Section 3 and Fig. 3; the
Peri-LN paper, Kim et al. 2025, Fig. 1) and the massive activations of Sun, Chen, Kolter & Liu 2024
("Massive Activations in Large Language Models", Section 2: activations about 10^3-10^4 times the median).

For the hidden state h_t ∈ R^D entering block l at real position t (a stack of n residual streams: their
sum, as :func:`~skiplab.analysis.redundancy.stream_state`), and for the state leaving the last block:

    rms_t = sqrt((1/D) Σ_i h_t,i²)        reported as mean_t rms_t and max_t rms_t

and the same of every sub-layer's output F (what each connection's branch returns: attention, FFN,
cross-attention). The massive-activation share of a state is the share of its entries with
|h_t,i| > ``ratio`` · median |h| (ratio 100 by default), the median taken over the batch's entries of that
state at real positions; ``max_abs`` is the largest |h_t,i| seen, and ``max_over_median`` its ratio to the
batches' median (the largest per batch).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from ..connections import iter_connections
from .redundancy import stream_state
from .report import integer_ticks, legend_labels, markdown, per_position, pyplot
from .trained import Trained


class Sizes:
    """Running per-position RMS statistics and massive-activation counts of one state, fed in batches."""

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio
        self.n = self.entries = self.massive = 0
        self.rms_sum, self.rms_max, self.max_abs, self.max_over_median = 0.0, 0.0, 0.0, 0.0

    def add(self, rows: Tensor) -> None:
        """``rows`` (N, D): one row per real position."""
        rows = rows.detach().double()
        rms = rows.pow(2).mean(-1).sqrt()
        self.n += rows.shape[0]
        self.rms_sum += float(rms.sum())
        self.rms_max = max(self.rms_max, float(rms.max()))
        magnitude = rows.abs()
        median = float(magnitude.median())
        self.entries += magnitude.numel()
        self.massive += int((magnitude > self.ratio * median).sum())
        self.max_abs = max(self.max_abs, float(magnitude.max()))
        if median > 0:
            self.max_over_median = max(self.max_over_median, float(magnitude.max()) / median)

    def summary(self) -> dict[str, float]:
        return {"rms_mean": self.rms_sum / max(self.n, 1), "rms_max": self.rms_max,
                "massive_share": self.massive / max(self.entries, 1), "max_abs": self.max_abs,
                "max_over_median": self.max_over_median, "positions": self.n}


def norms(tr: Trained, split: str = "test", examples: int = 200, seed: int = 0, ratio: float = 100.0,
          progress: bool = True) -> dict[str, Any]:
    """The sizes of the state entering each block (and leaving the last, per stack) and of every sub-layer's
    output, over ``examples`` examples of ``split`` (in its order)."""
    if ratio <= 0:
        raise ValueError(f"ratio must be positive, got {ratio}")
    t0 = time.time()
    blocks = tr.blocks()
    last: dict[str, str] = {}  # stack -> its last block, whose output is the stack's final state
    for name in blocks:
        last[tr.stage_of(name)] = name
    inputs: dict[str, Tensor] = {}
    outputs: dict[str, Tensor] = {}
    branches: dict[str, list[Tensor]] = {}

    def wrap(name, args):
        if len(args) < 2 or not callable(args[1]):
            return None
        branch = args[1]

        def recorded(h, *rest, **kw):
            y = branch(h, *rest, **kw)
            branches.setdefault(name, []).append(y)
            return y
        return (args[0], recorded, *args[2:])

    hooks = [b.register_forward_pre_hook(lambda m, a, name=name: inputs.__setitem__(name, a[0]))
             for name, b in blocks.items()]
    hooks += [blocks[name].register_forward_hook(
        lambda m, a, o, name=name: outputs.__setitem__(name, o[0] if isinstance(o, tuple) else o))
        for name in last.values()]
    conns = dict(iter_connections(tr.model))
    hooks += [c.register_forward_pre_hook(lambda m, a, name=name: wrap(name, a)) for name, c in conns.items()]
    order = [n for stack in last for n in (*(b for b in blocks if tr.stage_of(b) == stack), f"{stack}.out")]
    states = {n: Sizes(ratio) for n in order}
    subs: dict[str, Sizes] = {}
    seen = 0
    tr.model.eval()
    bar = tqdm(total=examples, desc=f"norms {tr.path.name}", unit="ex", disable=not progress)
    try:
        with torch.no_grad():
            for ex in tr.examples(split, examples, seed):
                inputs.clear()
                outputs.clear()
                branches.clear()
                tr.forward(ex)
                for name, h in inputs.items():
                    mask = tr.mask(ex, name)
                    states[name].add(per_position(stream_state(h, mask), mask, len(ex)))
                for stack, name in last.items():
                    mask = tr.mask(ex, name)
                    states[f"{stack}.out"].add(per_position(stream_state(outputs[name], mask), mask, len(ex)))
                for name, ys in branches.items():
                    mask = tr.mask(ex, tr.block_of(name))
                    for y in ys:
                        subs.setdefault(name, Sizes(ratio)).add(per_position(y, mask, len(ex)))
                seen += len(ex)
                bar.update(len(ex))
    finally:
        bar.close()
        for h in hooks:
            h.remove()
    rows = [{"state": n, "stage": n.split(".")[0], **s.summary()} for n, s in states.items()]
    return {"analysis": "norms", "run": str(tr.path), "label": tr.label, "split": split, "examples": seen,
            "mode": "eval", "seed": seed, "ratio": ratio, "states": rows,
            "sublayers": [{"connection": n, "block": tr.block_of(n), "spec": conns[n].spec, **s.summary()}
                          for n, s in subs.items()],
            "time_s": time.time() - t0, "config": tr.config}


def table(result: dict[str, Any]) -> str:
    r = result["ratio"]
    head = ["state entering", "mean RMS", "max RMS", f"share > {r:g}x median", "max |h|", "max / median"]
    body = [[s["state"] if not s["state"].endswith(".out") else f"{s['stage']} end", s["rms_mean"], s["rms_max"],
             s["massive_share"], s["max_abs"], s["max_over_median"]] for s in result["states"]]
    text = markdown(head, body)
    if result["sublayers"]:
        body = [[c["connection"], c["rms_mean"], c["rms_max"], c["max_abs"]] for c in result["sublayers"]]
        text += "\n\n" + markdown(["sub-layer output F", "mean RMS", "max RMS", "max |F|"], body)
    return text


def figure(results: list[dict[str, Any]]):
    """Left: the hidden state's RMS entering each block (mean solid, max dashed), log scale. Middle: each
    sub-layer's output RMS. Right: the largest |h| over its batch median, per state, with the ratio marked."""
    plt = pyplot()
    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(16, 4.5))
    names = legend_labels(results)
    for i, r in enumerate(results):
        xs = range(1, len(r["states"]) + 1)
        left.plot(xs, [s["rms_mean"] for s in r["states"]], marker="o", ms=3, color=f"C{i}", label=f"{names[i]}: mean")
        left.plot(xs, [s["rms_max"] for s in r["states"]], ls="--", color=f"C{i}", label=f"{names[i]}: max")
        if r["sublayers"]:
            mid.plot(range(1, len(r["sublayers"]) + 1), [c["rms_mean"] for c in r["sublayers"]], marker="o", ms=3,
                     color=f"C{i}", label=names[i])
        right.plot(xs, [s["max_over_median"] for s in r["states"]], marker="o", ms=3, color=f"C{i}", label=names[i])
    right.axhline(results[0]["ratio"], color="gray", ls=":", label=f"{results[0]['ratio']:g}x (massive)")
    left.set_xlabel("state (entering block l; the last: the stack's end)")
    left.set_ylabel("RMS over features")
    mid.set_xlabel("sub-layer (input side first)")
    mid.set_ylabel("output RMS, mean over positions")
    right.set_xlabel("state (entering block l; the last: the stack's end)")
    right.set_ylabel("max |h| / median |h|")
    for ax in (left, mid, right):
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    integer_ticks(left, mid, right)
    first = results[0]
    fig.suptitle(f"hidden-state and sub-layer sizes, {first['examples']} {first['split']} examples")
    fig.tight_layout()
    return fig
