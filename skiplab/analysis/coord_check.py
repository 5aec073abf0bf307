"""What a coordinate check says (the measurements: :mod:`skiplab.train.coord_check`): per design, parametrisation,
axis (width or depth) and quantity, the slope b of the least-squares line

    log₂ q = a + b · log₂ n        over every point n of the axis and every seed, at step t ≥ 1,

with its 95% interval (b ± t_{0.975, N−2} · se(b), N the points × seeds), and a verdict at the last step: **flat**
where the interval lies within [−τ, τ] (τ = 0.25 unless told: doubling n changes q by at most 19%), **grows** or
**shrinks** where it lies beyond τ or −τ, **unclear** otherwise (too few points or too much spread to say). A
design is flat along an axis when every quantity is. The figure: as the μP papers draw it, one panel per quantity
and axis, x = width or depth, a line per step (the mean over seeds), both axes logarithmic, each panel spanning at least a
factor of 16, so that a flat line looks flat.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .comparison import scipy_stats
from .report import markdown, pyplot

TOLERANCE = 0.25
SPAN = 16.0  # the least ratio of a panel's top to its bottom


def slope(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """(b, low, high): the least-squares slope of log₂ y on log₂ x and its 95% interval (infinite where N < 3)."""
    x, y = np.log2(np.asarray(xs, float)), np.log2(np.asarray(ys, float))
    n = len(x)
    sxx = float(((x - x.mean()) ** 2).sum())
    b = float(((x - x.mean()) * (y - y.mean())).sum() / sxx)
    if n < 3:
        return b, -math.inf, math.inf
    resid = y - (y.mean() + b * (x - x.mean()))
    se = math.sqrt(float((resid ** 2).sum()) / (n - 2) / sxx)
    half = float(scipy_stats().t.ppf(0.975, n - 2)) * se
    return b, b - half, b + half


def verdict(low: float, high: float, tolerance: float = TOLERANCE) -> str:
    if -tolerance <= low and high <= tolerance:
        return "flat"
    if low > tolerance:
        return "grows"
    if high < -tolerance:
        return "shrinks"
    return "unclear"


def slopes(result: dict[str, Any], tolerance: float = TOLERANCE) -> list[dict[str, Any]]:
    """A row per axis, quantity and step t ≥ 1 of one design's check: the slope, its interval and the verdict."""
    rows = result["rows"]
    out = []
    for axis in result["axes"]:
        for q in result["quantities"]:
            for t in sorted({r["step"] for r in rows if r["step"] > 0}):
                pts = [(r["value"], r[q]) for r in rows if r["axis"] == axis and r["step"] == t]
                if any(y <= 0 or not math.isfinite(y) for _, y in pts):
                    out.append({"axis": axis, "quantity": q, "step": t, "slope": math.nan, "low": math.nan,
                                "high": math.nan, "verdict": "unclear"})
                    continue
                b, lo, hi = slope([x for x, _ in pts], [y for _, y in pts])
                out.append({"axis": axis, "quantity": q, "step": t, "slope": b, "low": lo, "high": hi,
                            "verdict": verdict(lo, hi, tolerance)})
    return out


def summary(result: dict[str, Any], tolerance: float = TOLERANCE) -> dict[str, Any]:
    """The last step's slopes of one design, and per axis the verdict over every quantity ("flat" only where each
    is)."""
    last = max(r["step"] for r in result["rows"])
    rows = [s for s in slopes(result, tolerance) if s["step"] == last]
    axes = {}
    for axis in result["axes"]:
        verdicts = {s["verdict"] for s in rows if s["axis"] == axis}
        axes[axis] = "flat" if verdicts == {"flat"} else ("grows" if "grows" in verdicts else
                                                           "shrinks" if "shrinks" in verdicts else "unclear")
    return {"label": result["label"], "step": last, "tolerance": tolerance, "slopes": rows, "axes": axes,
            "quantities": list(result["quantities"])}


def table(summaries: list[dict[str, Any]]) -> str:
    """One row per design and axis: the verdict, then each quantity's slope [interval] at the last step."""
    quantities = list(dict.fromkeys(q for s in summaries for q in s["quantities"]))
    head = ["design (parametrisation)", "axis", "verdict", *quantities]
    body = []
    for s in summaries:
        for axis, overall in s["axes"].items():
            cells = {r["quantity"]: r for r in s["slopes"] if r["axis"] == axis}
            body.append([s["label"], axis, overall, *(_cell(cells[q]) if q in cells else "-" for q in quantities)])
    return markdown(head, body)


def _cell(r: dict[str, Any]) -> str:
    if math.isnan(r["slope"]):
        return "-"
    lo, hi = (f"{v:+.2f}" if math.isfinite(v) else ("-inf" if v < 0 else "inf") for v in (r["low"], r["high"]))
    return f"{r['slope']:+.2f} [{lo}, {hi}] {r['verdict']}"


def figure(result: dict[str, Any]):
    """One design: a row per axis, a panel per quantity; a line per step, the mean over seeds."""
    plt = pyplot()
    rows, names, quantities = result["rows"], result["axes"], result["quantities"]
    steps = sorted({r["step"] for r in rows})
    fig, axes = plt.subplots(len(names), len(quantities), figsize=(3.0 * len(quantities), 2.8 * len(names)),
                             squeeze=False)
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(steps)))
    for i, axis in enumerate(names):
        values = sorted({r["value"] for r in rows if r["axis"] == axis})
        for j, q in enumerate(quantities):
            ax = axes[i][j]
            for t, color in zip(steps, colors):
                means = [np.mean([r[q] for r in rows if r["axis"] == axis and r["value"] == v and r["step"] == t])
                         for v in values]
                if q.startswith("delta") and t == 0:
                    continue  # no change yet
                ax.plot(values, means, "o-", color=color, ms=3, lw=1.2, label=f"t = {t}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            low, high = ax.get_ylim()
            if high < SPAN * low:  # a flat curve drawn flat: at least a factor SPAN from bottom to top
                mid = math.sqrt(low * high)
                ax.set_ylim(mid / math.sqrt(SPAN), mid * math.sqrt(SPAN))
            ax.set_xlabel(axis)
            ax.set_title(q, fontsize=9)
            ax.grid(True, alpha=0.3, which="both")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"coordinate check: {result['label']}", fontsize=10)
    fig.tight_layout()
    return fig
