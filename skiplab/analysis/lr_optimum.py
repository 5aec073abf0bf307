"""Where the best learning rate lies at each depth, with its interval, and whether it moves with depth.

For one design (under one parametrisation) at one depth L, the runs give the test metric y_{η,k} of seed k at
learning rate η on a factor-2 grid. An lr is *stable* when every one of its runs finished (none diverged or
missing); the lrs *seeded* are the stable ones with the most seeds (n). With x = log₂ η and ȳ(η) the mean over seeds:

    best grid lr        η_g = argmin_η {ȳ(η) : η seeded}                   (argmax where higher is better)
    optimum             x* = the vertex of the parabola through (x_i, ȳ_i), i = η_g and its two neighbours on the
                        grid, when both neighbours are seeded; with Δ₁ = (ȳ₁ − ȳ₀)/(x₁ − x₀), Δ₂ = (ȳ₂ − ȳ₁)/(x₂ − x₁),
                        a = (Δ₂ − Δ₁)/(x₂ − x₀), b = Δ₁ − a(x₀ + x₁):  x* = −b / (2a)
                        (equally spaced, x* = x₁ + h (ȳ₀ − ȳ₂) / (2 (ȳ₀ − 2ȳ₁ + ȳ₂))); η* = 2^{x*}

Since ȳ(η_g) is the lowest of the three, the vertex lies within half a grid step of x_g (a factor √2 in lr on a
factor-2 grid) however steep one side is: a cliff on one side (an lr at which training degrades) pulls it by at
most that much towards the other. A replicate's vertex is clipped to [x₀, x₂] (the bracket); where its parabola has no minimum (a ≤ 0), its x* is the
bracket point with the lowest mean. Its 95% interval is the percentile interval of x* over B bootstrap replicates
that draw n seeds with replacement, the same seeds at the three lrs (seed k shares its initialisation and data
order across lrs, so the lrs are paired); with one seed there is no interval. Where η_g lies on the grid's edge the
optimum is only bounded (``edge``: at or beyond η_g); where a neighbour is not seeded, the bracket is open
(``open``: seed it, or it diverged).

Across depth, per design: the slope s of x* on log₂ L (least squares over the depths whose optimum is bracketed),
its 95% interval the percentiles of the slope over the replicates (replicate b takes each depth's b-th x*; the
depths' runs are independent). η* ∝ L^s: s = 0 is an lr that transfers across depth; the pre-norm family under the
standard parametrisation is expected to need a smaller lr as it deepens (s < 0), CompleteP claims s = 0 (Dey et
al., arXiv 2505.01618, Fig. 1; Bordelon et al., arXiv 2309.16620). The verdict says ``falls`` / ``rises`` where
the interval excludes 0, else ``no shift shown`` (with the interval, which says how large a shift is excluded).
"""

from __future__ import annotations

import math
import random
from typing import Any

SAMPLES = 2000


def vertex(xs: list[float], ys: list[float]) -> float:
    """The x of the parabola through three points (x ascending), clipped to [x₀, x₂]; where it opens downwards
    or is flat (a ≤ 0), the x of the lowest y (the module's formula)."""
    (x0, x1, x2), (y0, y1, y2) = xs, ys
    d1, d2 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
    a = (d2 - d1) / (x2 - x0)
    if not a > 0:
        return xs[min(range(3), key=lambda i: ys[i])]
    b = d1 - a * (x0 + x1)
    return min(max(-b / (2 * a), x0), x2)


def _percentiles(values: list[float], lo: float = 0.025, hi: float = 0.975) -> tuple[float, float]:
    """Linear-interpolated percentiles (numpy's default rule)."""
    v = sorted(values)

    def at(q: float) -> float:
        pos = q * (len(v) - 1)
        i = int(math.floor(pos))
        return v[i] if i + 1 >= len(v) else v[i] + (pos - i) * (v[i + 1] - v[i])

    return at(lo), at(hi)


def optimum(runs: list[dict[str, Any]], lrs: list[float], higher_is_better: bool = False,
            samples: int = SAMPLES, seed: int = 0) -> dict[str, Any]:
    """One design at one depth. ``runs``: {lr, seed, status, value} (value None unless finished); ``lrs``: the grid
    swept (ascending). Returns the best grid lr, the optimum η* with its interval and status, the per-lr means
    and the bootstrap replicates of x* (for the slope across depth)."""
    sign = -1.0 if higher_is_better else 1.0
    per_lr: dict[float, dict[int, float | None]] = {lr: {} for lr in lrs}
    for r in runs:
        if r["lr"] not in per_lr:
            raise ValueError(f"a run at lr {r['lr']:g} is off the grid {', '.join(f'{v:g}' for v in lrs)}")
        ok = r["status"] == "finished" and r.get("value") is not None and math.isfinite(r["value"])
        per_lr[r["lr"]][r["seed"]] = r["value"] if ok else None
    cells = []
    for lr in lrs:
        got = per_lr[lr]
        values = [v for v in got.values() if v is not None]
        stable = bool(got) and len(values) == len(got)
        n = len(values)
        mean = sum(values) / n if n else None
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else (0.0 if n else None)
        cells.append({"lr": lr, "runs": len(got), "finished": n, "stable": stable, "mean": mean, "std": std,
                      "seeds": sorted(k for k, v in got.items() if v is not None)})
    n_max = max((c["finished"] for c in cells if c["stable"]), default=0)
    seeded = [i for i, c in enumerate(cells) if c["stable"] and c["finished"] == n_max and n_max > 0]
    out: dict[str, Any] = {"cells": cells, "seeds": n_max, "best_grid_lr": None, "lr_star": None, "ci": None,
                           "status": "none", "replicates": []}
    if not seeded:
        out["why"] = "no lr at which every run finished"
        return out
    g = min(seeded, key=lambda i: sign * cells[i]["mean"])  # min keeps the smaller lr on a tie
    out["best_grid_lr"] = lrs[g]
    out["best_mean"], out["best_std"] = cells[g]["mean"], cells[g]["std"]
    if g == 0 or g == len(lrs) - 1:
        out["status"] = "edge"
        out["why"] = (f"the best lr is the grid's {'lowest' if g == 0 else 'highest'} ({lrs[g]:g}): the optimum is "
                      f"at or {'below' if g == 0 else 'above'} it; widen the grid")
        return out
    if g - 1 not in seeded or g + 1 not in seeded:
        missing = [lrs[i] for i in (g - 1, g + 1) if i not in seeded]
        out["status"] = "open"
        out["why"] = (f"lr {', '.join(f'{v:g}' for v in missing)} beside the best ({lrs[g]:g}) has not every run "
                      f"finished at {n_max} seed(s)")
        return out
    idx = [g - 1, g, g + 1]
    xs = [math.log2(lrs[i]) for i in idx]
    fit = lambda means: vertex(xs, [sign * m for m in means])  # noqa: E731
    x_star = fit([cells[i]["mean"] for i in idx])
    out.update(status="bracketed", lr_star=2.0 ** x_star, x_star=x_star)
    common = sorted(set.intersection(*(set(cells[i]["seeds"]) for i in idx)))
    if len(common) < 2:
        out["why"] = "one seed: no interval"
        return out
    rng = random.Random(seed)
    table = {(i, k): per_lr[lrs[i]][k] for i in idx for k in common}
    reps = []
    for _ in range(samples):
        draw = [rng.choice(common) for _ in common]
        reps.append(fit([sum(table[(i, k)] for k in draw) / len(draw) for i in idx]))
    lo, hi = _percentiles(reps)
    out.update(ci=[2.0 ** lo, 2.0 ** hi], replicates=reps)
    return out


def slope(points: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """The slope of x* on log₂ L over the (depth, optimum) pairs whose optimum is bracketed, with its bootstrap
    interval where every one of them has replicates (the module's formula); None where fewer than two depths."""
    use = [(d, o) for d, o in points if o["status"] == "bracketed"]
    left = [d for d, o in points if o["status"] != "bracketed"]
    out: dict[str, Any] = {"depths": [d for d, _ in use], "left_out": left, "slope": None, "ci": None,
                           "verdict": "fewer than two depths with a bracketed optimum"}
    if len(use) < 2:
        return out
    ls = [math.log2(d) for d, _ in use]
    mean_l = sum(ls) / len(ls)
    sxx = sum((v - mean_l) ** 2 for v in ls)

    def fit(ys: list[float]) -> float:
        mean_y = sum(ys) / len(ys)
        return sum((a - mean_l) * (b - mean_y) for a, b in zip(ls, ys)) / sxx

    out["slope"] = fit([o["x_star"] for _, o in use])
    reps = [o["replicates"] for _, o in use]
    if any(not r for r in reps):
        out["verdict"] = "one seed at some depth: no interval"
        return out
    lo, hi = _percentiles([fit([r[b] for r in reps]) for b in range(min(len(r) for r in reps))])
    out["ci"] = [lo, hi]
    out["verdict"] = "falls" if hi < 0 else "rises" if lo > 0 else "no shift shown"
    return out
