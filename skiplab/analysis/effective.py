"""Effective compute: how many of the baseline's updates a design is worth, read off the baseline trained at
several lengths in the same blocks (``compare --baseline-updates 1.25,1.5``; the Attention Residuals paper's claim
that Block AttnRes matches a baseline trained with 1.25x the compute).

In block b the baseline is trained for f·S updates, f ∈ {1, f_1, f_2, ...} (its cosine schedule spanning each
length), and scores y_b(f). A design trained for S updates scores y_d. Its effective-compute multiplier m_b is
where the baseline's curve reaches y_d, interpolated linearly in log-updates between the two lengths that
bracket it:

    ln m_b = ln f_i + (y_d − y_b(f_i)) · (ln f_{i+1} − ln f_i) / (y_b(f_{i+1}) − y_b(f_i))

and beyond the shortest or longest length, the nearest segment's line extended (the entry is then marked as
extrapolated). Where the baseline's scores in a block do not improve with its length (not strictly better at each
longer length), the least-squares line of y on ln f over that block's lengths is used instead, and where that
line does not fall either, the block has no multiplier for any design (reported). Over blocks: the geometric mean
of m_b, exp(mean ln m_b), with its 95% interval exp(mean ± t·sd/√n) (Student's t over blocks, the same blocks
for every design). Lower-is-better metrics (bits per byte, loss) as read; a higher-is-better metric is negated.
"""

from __future__ import annotations

import math
from typing import Any

from .blocks import RunRecord, mean_difference
from .report import markdown


def scaled_label(baseline: str, factor: float) -> str:
    """The label of the baseline trained for ``factor`` times the updates: ``PreLN@1.25x``."""
    return f"{baseline}@{factor:g}x"


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope of y on x."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def multiplier(lengths: list[tuple[float, float]], score: float) -> tuple[float, bool, str]:
    """(m, extrapolated, how) for one block: ``lengths`` the baseline's (factor, score) pairs, lower is better;
    m is NaN where the baseline does not improve with its length."""
    pts = sorted((math.log(f), y) for f, y in lengths)
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    if all(b < a for a, b in zip(ys, ys[1:])):
        i = next((j for j in range(len(ys) - 1) if ys[j] >= score >= ys[j + 1]), None)
        extrapolated = i is None
        if i is None:
            i = 0 if score > ys[0] else len(ys) - 2
        x = xs[i] + (score - ys[i]) * (xs[i + 1] - xs[i]) / (ys[i + 1] - ys[i])
        return math.exp(x), extrapolated, "interpolated"
    a, c = _line(xs, ys)
    if c >= 0:
        return math.nan, False, "baseline does not improve with its length"
    x = (score - a) / c
    return math.exp(x), not xs[0] <= x <= xs[-1], "least-squares line"


def effective_compute(records: list[RunRecord], baseline: str, factors: tuple[float, ...], labels: list[str],
                      higher_is_better: bool = False) -> dict[str, Any]:
    """Per design (every label but the baseline's and its scaled copies): each block's multiplier and the
    geometric mean over blocks with its 95% interval."""
    sign = -1.0 if higher_is_better else 1.0
    value = {(r.label, r.seed): sign * r.value for r in records if r.status == "finished" and r.value is not None}
    seeds = sorted({r.seed for r in records})
    scaled = {scaled_label(baseline, f): f for f in factors}
    designs = [lab for lab in labels if lab != baseline and lab not in scaled]
    rows = []
    for d in designs:
        per_block = []
        for s in seeds:
            lengths = [(f, value[(lab, s)]) for lab, f in ((baseline, 1.0), *scaled.items()) if (lab, s) in value]
            if len(lengths) < 2 or (d, s) not in value:
                continue
            m, extra, how = multiplier(lengths, value[(d, s)])
            per_block.append({"seed": s, "multiplier": m, "extrapolated": extra, "how": how})
        logs = [math.log(b["multiplier"]) for b in per_block if math.isfinite(b["multiplier"])]
        row: dict[str, Any] = {"design": d, "blocks": per_block, "n": len(logs),
                               "extrapolated": sum(b["extrapolated"] for b in per_block)}
        if logs:
            mean, lo, hi = mean_difference(logs)
            row["multiplier"] = math.exp(mean)
            if lo is not None:
                row["ci"] = [math.exp(lo), math.exp(hi)]
        rows.append(row)
    return {"baseline": baseline, "factors": [1.0, *factors], "seeds": seeds, "rows": rows}


def table(result: dict[str, Any]) -> str:
    """The multipliers as a markdown table, with what they mean."""
    lengths = ", ".join(f"{f:g}x" for f in result["factors"])
    body = []
    for r in result["rows"]:
        m = f"{r['multiplier']:.3f}x" if "multiplier" in r else "-"
        ci = f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" if "ci" in r else "-"
        per = ", ".join(f"{b['multiplier']:.2f}" + ("*" if b["extrapolated"] else "") for b in r["blocks"])
        body.append([r["design"], m, ci, f"{r['n']}", f"{r['extrapolated']}", per])
    head = ["design", "effective compute (geometric mean)", "95% CI", "blocks", "extrapolated", "per block"]
    return (f"Effective compute: the multiple of {result['baseline']}'s updates at which {result['baseline']} "
            f"(trained at {lengths} its updates, in the same blocks) scores as the design does at 1x, interpolated "
            f"in log-updates (skiplab.analysis.effective); * marks a block read beyond the lengths trained.\n\n"
            + markdown(head, body))
