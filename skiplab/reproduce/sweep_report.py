"""A sweep (skiplab.reproduce.sweep) as Markdown, CSV and figures.

    depth.png    the test metric against depth (log2 axis), one line per design: mean ± std over the seeds of
                 each design's best lr at that depth; an 'x' at the top where no lr had every seed finish
    lr.png       (more than one lr) per design x depth the highest stable lr, as a table of cells; beside it
                 the test metric against lr per design at the deepest depth, an 'x' at the top where a seed
                 diverged
    curves.png   one panel per depth: the validation loss against steps per design at its best lr, mean over
                 the seeds (± std shaded)

depth.png and lr.png's right panel draw the task's context-free reference (sweep.json's ``reference``; LM: the
unigram model's test bits per byte) as a dashed grey line, or name it in the legend where it lies off the axes.
"""

from __future__ import annotations

import csv as _csv
import io
import math
from pathlib import Path
from typing import Any

from ..analysis.comparison import mean_std
from ..analysis.report import pyplot
from .report import _md_table, duration, seeds_text

COLUMNS = ("connection", "depth", "lr", "runs", "finished", "diverged", "stalled", "n", "mean", "std", "valid_mean",
           "s_per_update", "loss_spikes", "max_grad_norm", "delta", "ci_low", "ci_high", "pairs", "p_paired", "p_wilcoxon", "failed", "p_holm")


def _num(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _p(v: float | None) -> str:
    return "-" if v is None else f"{v:.2g}"


def _lr(v: float | None) -> str:
    return "none" if v is None else f"{v:g}"


def _metric_cell(row: dict[str, Any], digits: int) -> str:
    if row["mean"] is None:
        return "all diverged" if row["diverged"] == row["runs"] else "not scored" if row["finished"] else "not run"
    return f"{row['mean']:.{digits}f} ± {row['std']:.{digits}f}"


def _lr_note(result: dict[str, Any]) -> str:
    lrs = result["axes"]["lrs"]
    return f"lr {_lr(lrs[0])}" if len(lrs) == 1 else "each design's best lr per depth"


def _stable_cell(s: dict[str, Any]) -> str:
    return "none" if s["best_lr"] is None else f"{_lr(s['highest_stable_lr'])} (best {_lr(s['best_lr'])})"


def _delta_cell(row: dict[str, Any], base: str, digits: int) -> str:
    if row["connection"] == base or row.get("delta") is None:
        return "-"
    ci = (f" [{row['ci_low']:+.{digits}f}, {row['ci_high']:+.{digits}f}]" if row.get("ci_low") is not None else "")
    return f"{row['delta']:+.{digits}f}{ci}"


def title(result: dict[str, Any]) -> str:
    return f"{result['model']} on {result['data']}, {result['length']}, {seeds_text(result['axes']['seeds'])}"


def markdown(result: dict[str, Any], brief: bool = False) -> str:
    """The rows (one per design x depth x lr), the stability table where lrs vary and, unless ``brief``, how
    they were made."""
    digits = 3 if result["metric"].endswith("bpb") else 2  # bits per byte differ in the third decimal
    label = result["metric_label"]
    head = ("connection", "depth", "lr", "finished", "diverged", f"test {label} (mean ± std)",
            f"{result['valid'][1]} (mean)", "s/update")
    body = [(r["connection"], str(r["depth"]), _lr(r["lr"]), f"{r['finished']}/{r['runs']}", str(r["diverged"]),
             _metric_cell(r, digits), _num(r["valid_mean"], digits), _num(r["s_per_update"], 2))
            for r in result["rows"]]
    if any(r.get("loss_spikes") is not None for r in result["rows"]):  # runs with per-step telemetry
        head += ("loss spikes", "max grad norm")
        body = [(*b, "-" if r.get("loss_spikes") is None else str(r["loss_spikes"]), _num(r.get("max_grad_norm"), 2))
                for b, r in zip(body, result["rows"])]
    pairing = result.get("pairing")
    if pairing:  # paired with the first design in each block (seed) of the same depth and lr
        base = pairing["baseline"]
        head += (f"Δ vs {base} [95% CI]", "p Wilcoxon", "p Holm", "stalled")
        body = [(*b, _delta_cell(r, base, digits), _p(r.get("p_wilcoxon")),
                 "failed: not in the family" if r.get("failed") else _p(r.get("p_holm")),
                 str(r.get("stalled", 0))) for b, r in zip(body, result["rows"])]
    direction = "higher" if result["higher_is_better"] else "lower"
    parts = [f"### Sweep: {title(result)}",
             f"Test {label} ({direction} is better): mean ± std (n − 1) over the seeds that finished; a diverged "
             "run is counted, never averaged in. s/update: training time over updates, mean over finished seeds.",
             _md_table(head, body)]
    if pairing:
        n = pairing.get("blocks") or result["axes"]["seeds"]
        kind = f"Kind of machine: {pairing['kind']}, every run. " if pairing.get("kind") else ""
        if pairing.get("codes"):
            listed = ", ".join(f"{c} ({k} run{'s' if k > 1 else ''})" for c, k in sorted(pairing["codes"].items()))
            kind += f"Code: {listed}. "
        parts.append(f"{kind}Δ: the paired difference to {pairing['baseline']} at the same depth and lr, block by "
                     "block (block k: seed k), mean with its 95% CI (Student's t); p Wilcoxon: the exact signed-rank "
                     f"test of the same differences, uncorrected (with n = {n} blocks the smallest attainable exact "
                     f"Wilcoxon p is 2/2^{n} = {2 / 2 ** n:.2g}); p Holm: the paired t-test's p with Holm's "
                     f"correction over the {pairing['holm_m']} rows that have one and no failed run; stalled: "
                     "finished less than the task's margin better than the context-free reference, or worse "
                     "(skiplab.analysis.blocks).")
        if pairing.get("failed"):
            parts.append("Failures are not findings: a row with a stalled or diverged run is outside Holm's family, "
                         "and where the baseline's run stalled or diverged no row is paired: "
                         + "; ".join(pairing["failed"]) + ".")
        if pairing["unpaired"]:
            parts.append("WARNING: no same-machine baseline, left out of Δ: " + "; ".join(pairing["unpaired"]))
    ref = result.get("reference")
    if ref:
        parts.append(f"Context-free reference: the {ref['label']} reaches {ref['value']:.{digits}f} test {label}; a "
                     "run that ends near it trained without learning much beyond the data's frequencies.")
    if len(result["axes"]["lrs"]) > 1:
        depths = result["axes"]["depths"]
        by = {(s["connection"], s["depth"]): s for s in result["stability"]}
        stable = [(c, *(_stable_cell(by[c, d]) for d in depths)) for c in result["axes"]["connections"]]
        parts += ["Highest stable lr per design and depth (every seed finished), with the best of the stable lrs "
                  f"({'highest' if result['higher_is_better'] else 'lowest'} mean):",
                  _md_table(("connection", *(f"depth {d}" for d in depths)), stable)]
    if brief:
        return "\n\n".join(parts)
    env = result.get("environment") or {}
    machine = f" Machine: {env['cpu']} ({env['cpu_capability']} kernels), torch {env['torch']}." if "cpu" in env else ""
    parts.append("Made with:\n\n```bash\n" + result["command"] + "\n```\n\n"
                 f"Wall time of this invocation {duration(result['wall_time_s'])}; the runs' own training time "
                 f"{duration(result['train_time_s'])} in all.{machine} Each run's own command is in sweep.json.")
    return "\n\n".join(parts) + "\n"


def csv(result: dict[str, Any]) -> str:
    """The rows as they are (numbers unrounded; empty where there are none)."""
    buf = io.StringIO()
    w = _csv.writer(buf)
    w.writerow(COLUMNS)
    for r in result["rows"]:
        w.writerow(["" if r.get(k) is None else r[k] for k in COLUMNS])
    return buf.getvalue()


# ---- figures -------------------------------------------------------------------------------------------------
def _diverged_marks(ax, xs: list[float], i: int) -> None:
    """An 'x' in design ``i``'s colour at each x, at the top of the axes (one row per design, so that designs
    diverging at the same x stay apart)."""
    if xs:
        ax.plot(xs, [0.97 - 0.04 * i] * len(xs), "x", color=f"C{i}", markersize=8, mew=2,
                transform=ax.get_xaxis_transform(), clip_on=False)


def _legend(ax, marked: bool, what: str) -> None:
    """The designs' legend, with one black 'x' saying what the marks at the top mean where there are any."""
    handles, labels = ax.get_legend_handles_labels()
    if marked:
        handles.append(ax.plot([], [], "x", color="black", mew=2)[0])
        labels.append(f"x (top): {what}")
    ax.legend(handles, labels, fontsize=8)


def _reference_line(ax, result: dict[str, Any]) -> None:
    """The task's context-free reference level (sweep.json's ``reference``), dashed grey, where there is one; where
    it lies outside the runs' range it is named in the legend with its value rather than stretch the axes."""
    ref = result.get("reference")
    if not ref:
        return
    low, high = ax.get_ylim()
    if low <= ref["value"] <= high:
        ax.axhline(ref["value"], color="grey", linestyle="--", linewidth=1, label=ref["label"])
    else:
        where = "above" if ref["value"] > high else "below"
        ax.plot([], [], color="grey", linestyle="--", linewidth=1,
                label=f"{ref['label']}: {ref['value']:.3f} ({where} the axes)")


def depth_figure(result: dict[str, Any], path: Path) -> Path:
    """The test metric against depth per design (the module's first figure)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.8))
    marked = False
    for i, conn in enumerate(result["axes"]["connections"]):
        cells = [s for s in result["stability"] if s["connection"] == conn]
        ok = [s for s in cells if s["best_mean"] is not None]
        if ok:
            ax.errorbar([s["depth"] for s in ok], [s["best_mean"] for s in ok], yerr=[s["best_std"] for s in ok],
                        marker="o", capsize=3, color=f"C{i}", label=conn)
        bad = [s["depth"] for s in cells if s["best_mean"] is None]
        _diverged_marks(ax, bad, i)
        marked = marked or bool(bad)
    _reference_line(ax, result)
    ax.set_xscale("log", base=2)
    ax.set_xticks(result["axes"]["depths"], [str(d) for d in result["axes"]["depths"]])
    ax.set_xlabel(f"depth ({', '.join(result['depth_options'])})")
    ax.set_ylabel(f"test {result['metric_label']}")
    ax.set_title(f"{title(result)}\nmean ± std over seeds, at {_lr_note(result)}", fontsize=9)
    ax.grid(True, alpha=0.3)
    _legend(ax, marked, "a seed diverged" if len(result["axes"]["lrs"]) == 1 else "no lr at which every seed finished")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def lr_figure(result: dict[str, Any], path: Path) -> Path:
    """The highest stable lr per design x depth, and the metric against lr at the deepest depth."""
    plt = pyplot()
    conns, depths, lrs = result["axes"]["connections"], result["axes"]["depths"], result["axes"]["lrs"]
    by = {(s["connection"], s["depth"]): s["highest_stable_lr"] for s in result["stability"]}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.5 * len(conns) + 3.5))
    level = [[lrs.index(by[c, d]) if by[c, d] is not None else math.nan for d in depths] for c in conns]
    cmap = plt.get_cmap("viridis").with_extremes(bad="lightgrey")  # none stable: grey
    left.imshow(level, cmap=cmap, vmin=-0.5, vmax=len(lrs) - 0.5, aspect="auto")
    for y, c in enumerate(conns):
        for x, d in enumerate(depths):
            dark = not math.isnan(level[y][x]) and level[y][x] < (len(lrs) - 1) / 2
            left.text(x, y, _lr(by[c, d]), ha="center", va="center", fontsize=9, color="white" if dark else "black")
    left.set_xticks(range(len(depths)), [str(d) for d in depths])
    left.set_yticks(range(len(conns)), conns)
    left.set_xlabel("depth")
    left.set_title("highest lr at which every seed finished (brighter: higher; grey: none)", fontsize=9)

    deepest = depths[-1]
    marked = False
    for i, conn in enumerate(conns):
        rows = [r for r in result["rows"] if r["connection"] == conn and r["depth"] == deepest]
        ok = [r for r in rows if r["mean"] is not None]
        if ok:
            right.errorbar([r["lr"] for r in ok], [r["mean"] for r in ok], yerr=[r["std"] for r in ok], marker="o",
                           capsize=3, color=f"C{i}", label=conn)
        bad = [r["lr"] for r in rows if r["diverged"]]
        _diverged_marks(right, bad, i)
        marked = marked or bool(bad)
    _reference_line(right, result)
    right.set_xscale("log")
    right.set_xlabel("lr (peak)")
    right.set_ylabel(f"test {result['metric_label']}")
    right.set_title(f"depth {deepest}: mean ± std over the seeds that finished", fontsize=9)
    right.grid(True, alpha=0.3)
    _legend(right, marked, "a seed diverged")
    fig.suptitle(title(result), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def curves_figure(result: dict[str, Any], curves: dict[int, dict[str, list[list[dict[str, Any]]]]], key: str,
                  x: str, path: Path) -> Path:
    """One panel per depth, ``key`` against ``x`` per design: mean over seeds, ± std shaded (the seeds' common
    length)."""
    plt = pyplot()
    depths, conns = result["axes"]["depths"], result["axes"]["connections"]
    fig, axes = plt.subplots(1, len(depths), figsize=(max(4.5 * len(depths), 7), 4), squeeze=False, sharey=True)
    for ax, depth in zip(axes[0], depths):
        for i, conn in enumerate(conns):
            seeds = [r for r in curves.get(depth, {}).get(conn, []) if r]
            length = min((len(r) for r in seeds), default=0)
            if not length:
                continue
            xs = [seeds[0][e][x] for e in range(length)]
            m, sd = zip(*(mean_std([r[e][key] for r in seeds]) for e in range(length)))
            ax.plot(xs, m, color=f"C{i}", label=conn)
            ax.fill_between(xs, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)], color=f"C{i}",
                            alpha=0.2)
        ax.set_title(f"depth {depth}", fontsize=9)
        ax.set_xlabel(x)
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no finished run", ha="center", va="center", transform=ax.transAxes)
    axes[0][0].set_ylabel(key.replace("_", " "))
    fig.suptitle(f"{title(result)}\n{key.replace('_', ' ')}, mean ± std over seeds, at {_lr_note(result)}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

