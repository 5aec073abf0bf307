"""What comparisons across variants (connections, models) and seeds share: the λ and G columns of the papers' tables
(Table 1 of the rSkip+LN paper: connection | λ | G | error mean ± std over seeds | ...), mean and sample standard
deviation (n - 1), Welch's t-test, and learning curves (mean over seeds, ± std shaded) as a plot. The blocked
table itself, with its paired statistics: :mod:`skiplab.analysis.blocks`.

p of Welch's t-test: two-sided, unequal variances (Welch 1947; ``scipy.stats.ttest_ind(equal_var=False)``),
undefined (None) with fewer than two values on a side or no spread on either.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

from ..connections import parse_spec


def scipy_stats():
    """``scipy.stats``, imported when a p or an interval is first asked for: it takes a second to import, and most
    commands never ask."""
    from scipy import stats

    return stats


def lambda_and_norm(spec: str) -> tuple[str, str]:
    """The λ and G columns of the papers' tables for a connection spec."""
    s = parse_spec(spec)
    norm = s.norm or "-"
    if s.name in ("xSkip", "rSkip"):
        lam = f"{s.number:g}" + (f" (f={s.options['f']:g})" if s.options.get("f", 1.0) != 1.0 else "")
        return lam, norm
    if s.name == "wSkip":
        return f"w (learned, init {s.options['init']:g})", norm
    return {
        "NoSkip": ("0", "-"),
        "SAS": ("α (learned)", norm),
        "Highway": ("1-T (gated)", "-"),
        "PreLN": ("1", "LN (pre)"),
        "PreRMS": ("1", "RMS (pre)"),
        "LNS": ("1", f"{norm} (pre)"),  # pre-norm with the model's norm (LN unless the model's is RMS)
    }.get(s.name, ("-", norm))  # designs without the papers' λ (the modern ones): none to show


def mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, math.sqrt(var)


def welch_p(a: list[float], b: list[float]) -> float | None:
    """Two-sided p of Welch's t-test that ``a`` and ``b`` have the same mean (None where undefined)."""
    if len(a) < 2 or len(b) < 2:
        return None
    if mean_std(a)[1] == 0 and mean_std(b)[1] == 0:
        return None
    with warnings.catch_warnings():  # nearly equal values: scipy warns of precision, the p it gives stands
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(scipy_stats().ttest_ind(a, b, equal_var=False).pvalue)
    return None if math.isnan(p) else p


def connection_columns(spec: str) -> dict[str, str]:
    """The describing columns of a connection's row: its spec, λ and G."""
    lam, norm = lambda_and_norm(spec)
    return {"connection": spec, "lambda": lam, "G": norm}


def plot_curves(curves: dict[str, list[list[dict[str, Any]]]], keys: tuple[str, ...], path: Path, title: str,
                x: str = "epoch") -> None:
    """Per connection, each key of the records against ``x``: mean over seeds, ± std shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 4.5), squeeze=False)
    draw_curves(list(axes[0]), curves, keys, x)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_curves(axes: list[Any], curves: dict[str, list[list[dict[str, Any]]]], keys: tuple[str, ...],
                x: str = "epoch") -> None:
    """:func:`plot_curves`'s panels, one key an axis of ``axes``: each group's runs at the values of ``x`` that every
    one of them recorded (seeds evaluated at other steps are not averaged across them)."""
    for ax, key in zip(axes, keys):
        for i, (spec, runs) in enumerate(curves.items()):
            at = [{r[x]: r for r in run} for run in runs]  # a step recorded twice (a resumed run): its last record
            epochs = sorted(set.intersection(*(set(a) for a in at))) if at else []
            if not epochs:
                continue
            stats = [mean_std([a[e][key] for a in at]) for e in epochs]
            m = [s[0] for s in stats]
            sd = [s[1] for s in stats]
            color, style = f"C{i % 10}", ("-", "--", ":")[i // 10 % 3]  # past ten designs: the colours again, dashed
            marker = "o" if len(epochs) == 1 else None  # one record (a run of one epoch): a line of one point is not drawn
            ax.plot(epochs, m, label=spec, color=color, linestyle=style, marker=marker)
            if len(epochs) == 1:
                ax.errorbar(epochs, m, yerr=sd, color=color, capsize=3)
            else:
                ax.fill_between(epochs, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)], color=color,
                                alpha=0.2)
        ax.set_xlabel(x)
        ax.set_ylabel(key.replace("_", " ") + (" (%)" if key.endswith("_error") else ""))  # errors are percentages
        if key.endswith("ppl"):  # perplexity spans orders of magnitude early in training
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
