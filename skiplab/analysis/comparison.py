"""Comparison tables across variants (connections, models) and seeds, in the form of Table 1 of the rSkip+LN paper.

    connection | λ | G | error mean ± std over seeds | Δ to the first connection | p | diverged runs

The columns before the metric describe each variant (for connections: the spec, λ and G; for models:
the model spec and its parameter count); they are given per variant, so one table serves every comparison.

Mean and sample standard deviation (n - 1) are taken over the runs that finished; a diverged run is
counted, never averaged in. p is the two-sided p of Welch's t-test (unequal variances; Welch 1947;
``scipy.stats.ttest_ind(equal_var=False)``) between a row's seeds and the first row's, undefined (-) with
fewer than two seeds on a side or no spread on either. Also: learning curves (mean over seeds, ± std
shaded) as a plot.
"""

from __future__ import annotations

import csv
import io
import math
import warnings
from pathlib import Path
from typing import Any

from scipy import stats as _scipy

from ..connections import parse_spec


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
        p = float(_scipy.ttest_ind(a, b, equal_var=False).pvalue)
    return None if math.isnan(p) else p


def connection_columns(spec: str) -> dict[str, str]:
    """The describing columns of a connection's row: its spec, λ and G."""
    lam, norm = lambda_and_norm(spec)
    return {"connection": spec, "lambda": lam, "G": norm}


_STATS = ("mean", "std", "delta", "p", "runs", "finished", "diverged")
_HEADS = {"lambda": "λ"}


def summarise(results: dict[str, list[dict[str, Any]]], metric: str,
              columns: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per variant from its runs' summaries (each with ``status`` and ``metric``).

    ``columns`` gives each variant's describing columns; by default the variants are connection specs.
    """
    columns = columns if columns is not None else {spec: connection_columns(spec) for spec in results}
    rows, first = [], None
    for label, runs in results.items():
        values = [r[metric] for r in runs if r.get("status") == "finished"]
        mean, std = mean_std(values)
        first = (mean, values) if first is None else first
        rows.append({**columns[label], "mean": mean, "std": std, "delta": mean - first[0],
                     "p": welch_p(values, first[1]) if rows else None, "runs": len(runs),
                     "finished": len(values), "diverged": sum(r.get("status") == "diverged" for r in runs)})
    return rows


def _describing(row: dict[str, Any]) -> list[str]:
    return [k for k in row if k not in _STATS]


def _fmt(row: dict[str, Any], decimals: int) -> list[str]:
    ok, d = not math.isnan(row["mean"]), decimals
    return [*(str(row[k]) for k in _describing(row)),
            f"{row['mean']:.{d}f} ± {row['std']:.{d}f}" if ok else "all diverged",
            f"{row['delta']:+.{d}f}" if ok and not math.isnan(row["delta"]) else "-",
            f"{row['p']:.3g}" if row.get("p") is not None else "-",
            f"{row['diverged']}/{row['runs']}"]


def markdown(rows: list[dict[str, Any]], label: str, decimals: int = 2) -> str:
    names = _describing(rows[0])
    head = [*(_HEADS.get(k, k) for k in names), f"{label} (mean ± std)", f"Δ vs {rows[0][names[0]]}", "p (Welch)",
            "diverged"]
    body = [_fmt(r, decimals) for r in rows]
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in body])


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


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
    """:func:`plot_curves`'s panels, one key an axis of ``axes``."""
    for ax, key in zip(axes, keys):
        for i, (spec, runs) in enumerate(curves.items()):
            length = min((len(r) for r in runs), default=0)
            if not length:
                continue
            stats = [mean_std([r[e][key] for r in runs]) for e in range(length)]
            epochs = [runs[0][e][x] for e in range(length)]
            m = [s[0] for s in stats]
            sd = [s[1] for s in stats]
            ax.plot(epochs, m, label=spec, color=f"C{i}")
            ax.fill_between(epochs, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)], color=f"C{i}", alpha=0.2)
        ax.set_xlabel(x)
        ax.set_ylabel(key.replace("_", " "))
        if key.endswith("ppl"):  # perplexity spans orders of magnitude early in training
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
