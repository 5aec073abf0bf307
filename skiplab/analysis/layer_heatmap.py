"""Per-layer telemetry of one run as heatmaps (``skiplab curves --layers RUN``): for every quantity of its
``layers.jsonl`` (``train lm --log-layers N``, :mod:`skiplab.train.layer_telemetry`), one panel with a row per
sub-layer (``0.attn`` at the top, the deepest at the bottom) and a column per watched update, the colour its value
on a log scale (a value <= 0 left blank), a share (``dyt_saturated``) on a linear one from 0 to 1; a last panel draws
the final norm's input RMS against the update (and its DyT layer's saturated share, where it has one).
"""

from __future__ import annotations

import math
from pathlib import Path

from .. import run_dir
from .report import pyplot

FINAL = "final_norm"
SHARES = ("dyt_saturated",)  # quantities in [0, 1], drawn on a linear scale


def plot_layers(run: str | Path, out: str | Path, keys: tuple[str, ...] = (), title: str = "") -> Path:
    """The heatmaps of the run directory ``run`` (the quantities ``keys``; default all) into ``out``; return it."""
    run = Path(run)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: no such run directory")
    lines = run_dir.read_steps(run, run_dir.LAYERS_FILE)
    if not lines:
        raise ValueError(f"{run} has no per-layer lines ({run_dir.LAYERS_FILE}); `train lm --log-layers N` writes "
                         "them (the language models' telemetry)")
    subs = [n for n in lines[0]["layers"] if n != FINAL]
    known = list(lines[0]["layers"][subs[0]]) if subs else []
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise ValueError(f"--keys: {run} has no per-layer {unknown[0]!r}; it has: {', '.join(known)}")
    quantities = list(dict.fromkeys(keys)) or known  # a key given twice is one panel
    plt = pyplot()
    import numpy as np
    from matplotlib.colors import LogNorm, Normalize

    steps = [x["step"] for x in lines]
    # each column drawn from halfway to the update before it to halfway to the next: the updates watched need not be
    # evenly spaced (a run resumed with another --log-layers)
    mids = [(a + b) / 2 for a, b in zip(steps, steps[1:])]
    edges = np.array([steps[0] - (mids[0] - steps[0]) if mids else steps[0] - 0.5, *mids,
                      steps[-1] + (steps[-1] - mids[-1]) if mids else steps[-1] + 0.5])
    panels = len(quantities) + 1
    cols = min(3, panels)
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 0.25 * len(subs) * rows + 3 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, q in zip(flat, quantities):
        grid = np.array([[x["layers"][n].get(q, math.nan) for x in lines] for n in subs], dtype=float)
        if q in SHARES:
            shown, norm = grid, Normalize(vmin=0.0, vmax=1.0)
        else:
            shown = np.where(grid > 0, grid, np.nan)
            finite = shown[np.isfinite(shown)]
            norm = LogNorm(vmin=finite.min(), vmax=finite.max()) if finite.size and finite.min() < finite.max() else None
        image = ax.pcolormesh(edges, np.arange(len(subs) + 1) - 0.5, np.ma.masked_invalid(shown), norm=norm,
                              cmap="viridis")
        ax.set_ylim(len(subs) - 0.5, -0.5)  # the first sub-layer on top
        ax.set_yticks(range(len(subs)), subs, fontsize=7)
        ax.set_xlabel("update")
        ax.set_title(q)
        fig.colorbar(image, ax=ax)
    final = flat[len(quantities)]
    final.plot(steps, [x["layers"].get(FINAL, {}).get("input_rms", math.nan) for x in lines], marker=".")
    final.set_xlabel("update")
    final.set_title("final norm: input RMS")
    if any("dyt_saturated" in x["layers"].get(FINAL, {}) for x in lines):
        share = final.twinx()
        share.plot(steps, [x["layers"][FINAL].get("dyt_saturated", math.nan) for x in lines], color="C3", marker=".")
        share.set_ylim(-0.02, 1.02)
        share.set_ylabel("DyT: share of |α·x| > 2", color="C3")
        final.set_title("final norm: input RMS (blue), DyT saturated share (red)")
    for ax in flat[panels:]:
        ax.set_visible(False)
    fig.suptitle(title or f"{run.name}: per-layer telemetry")
    fig.tight_layout(rect=(0, 0, 1, 0.97))  # the panels below the figure's title, not under it
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)  # one file, written whole once drawn
    plt.close(fig)
    return out
