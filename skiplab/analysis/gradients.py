"""Per-block gradient norms of a trained model (Fig. 3 of the rSkip+LN paper, Fig. 4 of the SAS paper).

    g_b = (1/N) Σ_n ‖∂L_n / ∂y_{b,n}‖₂

over N random examples of a split (the papers: 10,000 training examples), with y_{b,n} block b's output
for example n: a residual block's feature maps, an MT layer's outputs at every position of the sentence
(a depth-wise LSTM layer's (out, cell) pair, concatenated). In evaluation mode (the default) examples are
independent, so L = Σ_n L_n gives every example's gradient in one backward pass; in training mode batch
statistics and dropout act as in training, and examples of a batch influence each other through them.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from tqdm import tqdm

from .report import Moments, markdown, pyplot
from .trained import Trained

MODES = ("eval", "train")


def gradient_norms(tr: Trained, split: str = "train", examples: int = 10000, mode: str = "eval", seed: int = 0,
                   progress: bool = True) -> dict[str, Any]:
    """g_b for every block of ``tr`` (and its spread over examples)."""
    if mode not in MODES:
        raise ValueError(f"mode must be eval or train, got {mode!r}")
    blocks = tr.blocks()
    outputs: dict[str, Any] = {}
    hooks = [b.register_forward_hook(lambda m, i, o, name=name: outputs.__setitem__(name, o))
             for name, b in blocks.items()]
    norms = {name: Moments() for name in blocks}  # of ‖∂L_n/∂y_{b,n}‖ over examples
    seen, t0 = 0, time.time()
    tr.model.train(mode == "train")
    bar = tqdm(total=examples, desc=f"gradients {tr.path.name}", unit="ex", disable=not progress)
    try:
        for ex in tr.examples(split, examples, seed):
            outputs.clear()
            loss = tr.losses(ex, tr.forward(ex)).sum()
            names = list(outputs)
            parts = [list(outputs[n]) if isinstance(outputs[n], tuple) else [outputs[n]] for n in names]
            flat = [t for p in parts for t in p]
            grads = iter(torch.autograd.grad(loss, flat, allow_unused=True))
            for name, p in zip(names, parts):
                sq = sum((g.flatten(1).pow(2).sum(1) if g is not None else torch.zeros(len(ex)))
                         for g in (next(grads) for _ in p))
                norms[name].add(sq.double().sqrt())
            seen += len(ex)
            bar.update(len(ex))
    finally:
        bar.close()
        for h in hooks:
            h.remove()
        tr.model.eval()
    rows = [{"block": name, "stage": tr.stage_of(name), "grad_norm": m.mean, "std": m.std} for name, m in norms.items()]
    return {"analysis": "gradients", "run": str(tr.path), "label": tr.label, "split": split, "examples": seen,
            "mode": mode, "seed": seed, "loss": "L_n: the example's cross-entropy (MT: summed over its tokens)",
            "blocks": rows, "time_s": time.time() - t0, "config": tr.config}


def table(result: dict[str, Any]) -> str:
    head = ["block", "stage", "mean ‖∂L_n/∂y_n‖", "std over examples"]
    return markdown(head, [[r["block"], r["stage"], r["grad_norm"], r["std"]] for r in result["blocks"]])


def figure(results: list[dict[str, Any]]):
    """Gradient norm against block index, one line per run, log scale (as the papers plot it)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        ax.plot(range(1, len(r["blocks"]) + 1), [b["grad_norm"] for b in r["blocks"]], marker="o", ms=3,
                label=r["label"])
    ax.set_yscale("log")
    ax.set_xlabel("block (input side first)")
    ax.set_ylabel("mean ‖∂L_n/∂y_n‖")
    first = results[0]
    ax.set_title(f"per-block gradient norm, {first['examples']} {first['split']} examples, {first['mode']} mode")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
