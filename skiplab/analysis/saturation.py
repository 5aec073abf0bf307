"""How much of each DyT layer's input sits in the flat part of its tanh, checkpoint by checkpoint: why a model
whose norms are Dynamic Tanh stops learning.

DyT(x) = γ ⊙ tanh(α·x) + β (Zhu et al. 2025, "Transformers without Normalization", arXiv 2503.10622, Eq. 2)
passes ∂DyT/∂x = γ · α · tanh'(α·x), tanh'(z) = 1 − tanh²(z). The paper's case for it (its Section 3 and
Figs. 2–4) is that LN's input-output map is nearly linear for most entries and squashes only the extreme ones;
DyT does the same only while most of α·x stays in tanh's linear range. Per DyT layer, over the entries of its
input x at real positions of ``examples`` examples of ``split``:

    saturated = share of entries with |α·x| > t          (t = 2 by default: tanh'(2) = 0.071, tanh(2) = 0.964)
    gain      = mean of tanh'(α·x) = 1 − tanh²(α·x)      (1 in the linear range, → 0 in the flat part)

where a layer's saturated share is near 1 its output is γ ⊙ sign(x) + β whatever x's size, and the gradient through
it is cut by 1/gain. Read at every step checkpoint the run kept (``checkpoint_<step>.pt``, oldest first) and
its ``last.pt``, beside the run's validation loss at those steps (``metrics.jsonl``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from .. import run_dir
from ..connections.norms import SATURATED, DyT
from .report import legend_labels, markdown, pyplot
from .trained import Examples, Trained


def dyt_layers(model: torch.nn.Module) -> dict[str, DyT]:
    """The model's DyT layers by module name, in the model's order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, DyT)}


def entries(tr: Trained, ex: Examples, name: str, x: Tensor, layout: str) -> Tensor:
    """The entries of a DyT layer's input ``x`` that count: every entry of a feature map (``conv``), the
    features of real positions of a sequence (its stack's mask; a norm outside the blocks, e.g. a stack's
    final norm, takes the mask of its stack by name, or the one mask of its shape)."""
    if layout == "conv" or not ex.masks:
        return x.reshape(-1)
    try:
        mask = tr.mask(ex, tr.block_of(name))
    except ValueError:
        fits = [m for m in ex.masks.values() if m.shape == x.shape[:2]]
        mask = ex.masks.get(name.split(".")[0], fits[0] if len(fits) == 1 else None)
    return x.reshape(-1) if mask is None else x[mask].reshape(-1)


def checkpoints(run: Path, kind: str) -> list[Path]:
    """The run's step checkpoints, oldest first, and its ``last.pt`` where it is a later step."""
    files = run_dir.step_checkpoints(run)
    last = run / "last.pt"
    if last.is_file() and not (files and _step(files[-1], kind) >= _step(last, kind)):
        files.append(last)
    return files


def _step(path: Path, kind: str) -> int:
    stem = path.stem.split("_")[-1]
    if stem.isdigit():
        return int(stem)
    return int(run_dir.load_checkpoint(path, kind=kind).get("step", 0))


def valid_losses(run: Path, key: str = "valid_loss") -> dict[int, float]:
    """step -> the loss ``key`` the run recorded there (``metrics.jsonl``; empty where it has none)."""
    return {int(r["step"]): float(r[key]) for r in run_dir.read_metrics(run)
            if isinstance(r.get(key), (int, float)) and "step" in r}


def held_out_losses(run: Path) -> tuple[str, dict[int, float]]:
    """``(key, step -> loss)`` of the held-out loss the run recorded: its validation loss (language models), else
    its test loss (image runs, which have no validation split); ``("valid_loss", {})`` where it recorded neither."""
    for key in ("valid_loss", "test_loss"):
        losses = valid_losses(run, key)
        if losses:
            return key, losses
    return "valid_loss", {}


def saturation(tr: Trained, split: str = "test", examples: int = 200, seed: int = 0,
               threshold: float = SATURATED, progress: bool = True) -> dict[str, Any]:
    """Per DyT layer and kept checkpoint of the run: the saturated share and the mean gain tanh'(α·x) of
    :mod:`this module <skiplab.analysis.saturation>`, over ``examples`` examples of ``split``."""
    if not threshold > 0:
        raise ValueError(f"threshold must be positive, got {threshold}")
    if tr.source is not None:  # one checkpoint named: the result would be every checkpoint's, filed under it
        raise ValueError(f"{tr.source}: saturation reads every checkpoint of a run, across its training; give the "
                         f"run folder ({tr.path})")
    layers = dyt_layers(tr.model)
    if not layers:
        raise ValueError(f"{tr.path}: its model ({tr.label}) has no DyT layer; saturation reads DyT's tanh "
                         "(PreDyT, the +DyT designs)")
    t0 = time.time()
    files = checkpoints(tr.path, tr.kind)
    if not files:
        raise ValueError(f"{tr.path}: no checkpoint to read (checkpoint_<step>.pt or last.pt)")
    loss_key, held_out = held_out_losses(tr.path)
    original = {k: v.clone() for k, v in tr.model.state_dict().items()}
    counts: dict[str, list[float]] = {}

    def hook(module: DyT, args: tuple, name: str) -> None:
        ex = current["ex"]
        x = entries(tr, ex, name, args[0].detach().double(), module.layout)
        c = counts.setdefault(name, [0.0, 0.0, 0.0])
        c[0] += x.numel()
        c[1] += float(module.saturated(x, threshold).sum())
        c[2] += float((1 - torch.tanh(x * float(module.alpha.detach())) ** 2).sum())

    current: dict[str, Examples] = {}
    hooks = [m.register_forward_pre_hook(lambda m, a, name=name: hook(m, a, name)) for name, m in layers.items()]
    rows, seen = [], 0
    bar = tqdm(files, desc=f"saturation {tr.path.name}", unit="ckpt", disable=not progress)
    try:
        for path in bar:
            state = run_dir.load_checkpoint(path, kind=tr.kind)
            tr.model.load_state_dict(state["model"])
            tr.model.eval()
            counts.clear()
            seen = 0
            with torch.no_grad():
                for ex in tr.examples(split, examples, seed):
                    current["ex"] = ex
                    tr.forward(ex)
                    seen += len(ex)
            step = int(state.get("step", _step(path, tr.kind)))
            rows.append({"step": step, "file": path.name, loss_key: held_out.get(step),
                         "layers": [{"layer": name, "alpha": float(layers[name].alpha.detach()),
                                     "saturated": counts[name][1] / counts[name][0],
                                     "gain": counts[name][2] / counts[name][0], "entries": int(counts[name][0])}
                                    for name in layers if name in counts]})
    finally:
        bar.close()
        for h in hooks:
            h.remove()
        tr.model.load_state_dict(original)
    return {"analysis": "saturation", "run": str(tr.path), "label": tr.label, "split": split, "examples": seen,
            "mode": "eval", "seed": seed, "threshold": threshold, "loss": loss_key, "checkpoints": rows,
            "time_s": time.time() - t0, "config": tr.config}


def short(name: str) -> str:
    """A DyT layer's name for a table's head: ``layers.3.conn_mlp.norm`` -> ``3.mlp``."""
    parts = [p for p in name.split(".") if p not in ("layers", "norm", "blocks")]
    return ".".join(p.removeprefix("conn_") for p in parts) or name


def table(result: dict[str, Any]) -> str:
    """One row per checkpoint: the step, the held-out loss (validation; test for an image run), and per DyT layer
    its saturated share (its mean gain in brackets)."""
    rows, key = result["checkpoints"], result.get("loss", "valid_loss")
    names = [r["layer"] for r in rows[0]["layers"]] if rows else []
    head = ["step", key.replace("_", " "), *(f"{short(n)}" for n in names)]
    body = [[r["step"], "-" if r.get(key) is None else r[key],
             *(f"{x['saturated']:.2f} ({x['gain']:.2g})" for x in r["layers"])] for r in rows]
    return (f"share of |α·x| > {result['threshold']:g} per DyT layer (mean tanh'(α·x) in brackets)\n\n"
            + markdown(head, body))


def figure(results: list[dict[str, Any]]):
    """A row per run: the saturated share per DyT layer against the step (lighter: nearer the input), the mean
    gain tanh'(α·x) (log scale), and the held-out loss (validation; test for an image run)."""
    plt = pyplot()
    fig, axes = plt.subplots(len(results), 3, figsize=(16, 4.2 * len(results)), squeeze=False)
    names = legend_labels(results)
    cmap = plt.get_cmap("viridis")
    for (share, gain, loss), r, label in zip(axes, results, names):
        steps = [c["step"] for c in r["checkpoints"]]
        layers = [x["layer"] for x in r["checkpoints"][0]["layers"]] if r["checkpoints"] else []
        for i, name in enumerate(layers):
            color = cmap(0.85 * (1 - i / max(len(layers) - 1, 1)))
            ys = [next(x for x in c["layers"] if x["layer"] == name) for c in r["checkpoints"]]
            share.plot(steps, [y["saturated"] for y in ys], marker="o", ms=3, color=color, label=short(name))
            gain.plot(steps, [max(y["gain"], 1e-6) for y in ys], marker="o", ms=3, color=color, label=short(name))
        key = r.get("loss", "valid_loss")
        points = [(c["step"], c[key]) for c in r["checkpoints"] if c.get(key) is not None]
        if points:
            loss.plot(*zip(*points), marker="o", ms=3, color="C3")
        share.set_ylim(-0.02, 1.02)
        share.set_ylabel(f"share of |α·x| > {r['threshold']:g}")
        gain.set_yscale("log")
        gain.set_ylabel("mean tanh'(α·x)")
        loss.set_ylabel("validation loss" if key == "valid_loss" else "test loss")
        share.set_title(label, fontsize=9)
        for ax in (share, gain, loss):
            ax.set_xlabel("update")
            ax.grid(True, alpha=0.3)
        share.legend(fontsize=7, ncol=2)
    first = results[0]
    fig.suptitle(f"DyT saturation over training, {first['examples']} {first['split']} examples")
    fig.tight_layout()
    return fig


__all__ = ["checkpoints", "dyt_layers", "figure", "held_out_losses", "saturation", "table", "valid_losses"]
