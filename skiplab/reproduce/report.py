"""A reproduced table as Markdown and CSV: per cell the paper's number beside ours, and how ours was made."""

from __future__ import annotations

import csv as _csv
import dataclasses
import io
import re
import shlex
from pathlib import Path
from typing import Any

from .. import host
from ..analysis.report import pyplot
from .scales import GPU_BASIS


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _signed(v: float | None, digits: int = 2) -> str:
    """``v`` with its sign, at ``digits``; a value that rounds to zero reads +0.00, not -0.00."""
    return "-" if v is None else f"{round(v, digits) + 0.0:+.{digits}f}"


def _p(p: float | list[float | None] | None) -> str:
    if p is None:
        return "-"
    if isinstance(p, list):
        return " / ".join("-" if x is None else (f"{x:.3f}" if x >= 0.001 else "<0.001") for x in p) if p else "-"
    return f"{p:.3f}" if p >= 0.001 else "<0.001"


def ours(c: dict[str, Any], digits: int = 2) -> str:
    """``mean ± std (n)``, or why there is no number."""
    if not c.get("available"):
        return c["why"]
    if c.get("mean") is None:
        runs = len(c.get("values") or [])
        if c.get("diverged") and c["diverged"] == runs:
            return f"diverged ({runs} of {runs} seeds)"
        return "not run yet" + (f" ({c['diverged']} diverged)" if c.get("diverged") else "")
    text = f"{c['mean']:.{digits}f} ± {c['std']:.{digits}f} ({c['n']})"
    return text + (f", {c['diverged']} diverged" if c.get("diverged") else "")


HEAD = ("row", "column", "paper", "ours: mean ± std (seeds)", "Δ paper", "Δ ours", "p", "baseline")


def _units_differ(result: dict[str, Any]) -> bool:
    """Ours is measured in another unit than the paper's (the LM miniatures: bits per byte, not perplexity)."""
    return result.get("ours_metric", result["metric"]) != result["metric"]


def head(result: dict[str, Any]) -> tuple[str, ...]:
    """The table's header; where the units differ, each number column names its own."""
    holm = ("p paired, Holm",) if _holm(result) else ()
    if not _units_differ(result):
        return HEAD + holm
    paper, ours_ = result["metric"], result["ours_metric"]
    return ("row", "column", f"paper: {paper}", f"ours: {ours_}, mean ± std (seeds)", f"Δ paper ({paper})",
            f"Δ ours ({ours_})", "p", "baseline", *holm)


def source(result: dict[str, Any]) -> str:
    """Where the paper's numbers come from: a file of shared/papers, or the citation the table gives."""
    src = result["source"]
    return f"`shared/papers/{src}`" if src.endswith(".txt") else src


def _holm(result: dict[str, Any]) -> bool:
    """Some cell has a seed-paired p, Holm-corrected over the table (the table then shows the corrected p)."""
    return any(c.get("p_holm") is not None for c in result["cells"])


def rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    digits = 3 if result.get("ours_metric") == "bits per byte" else 2  # bits per byte differ in the third decimal
    out = []
    for c in result["cells"]:
        out.append((c["row"], c["column"], _num(c["paper"]), ours(c, digits), _signed(c.get("paper_delta")),
                    _signed(c.get("delta"), digits), _p(c.get("p")), c["baseline"],
                    *((_p(c.get("p_holm")),) if _holm(result) else ())))
    return out


def _md_table(head: tuple[str, ...], body: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)])


def scale_line(result: dict[str, Any]) -> str:
    """What the header says of the scale and where its runs trained: the scale's own description where every run
    trained on a CPU, else its settings and the kinds of machine they trained on (a scale sized for a 2-core CPU
    whose runs trained on a GPU says so)."""
    kinds = result.get("run_kinds") or {}
    where = "; ".join(f"{k} ({v['runs']} runs)" for k, v in kinds.items())
    seeds = seeds_text(result['seeds'])
    if any(v.get("gpu") for v in kinds.values()):
        return (f"Scale `{result['scale']}`: its settings (models, data, updates), trained on {where}, not on the "
                f"machine the scale is sized for; {seeds}.")
    trained = f" Trained on: {where}." if where else ""
    return f"Scale `{result['scale']}`: {result['scale_about']}; {seeds}.{trained}"


def markdown(result: dict[str, Any], brief: bool = False) -> str:
    """The table with its header (source, metric, scale, settings, seeds) and, unless ``brief``, how it was made."""
    direction = "higher" if result["higher_is_better"] else "lower"
    tests = sorted({c["test"] for c in result["cells"] if c.get("test")})
    metric = f"Metric: {result['metric']} ({direction} is better)."
    if _units_differ(result):
        metric = (f"Metric: the paper's {result['metric']}; ours at this scale {result['ours_metric']} ({direction} is "
                  f"better for both). The two are not the same quantity and cannot be compared as numbers: compare "
                  f"the orderings and the signs of the differences to the baseline.")
    parts = [f"### {result['table']}: {result['title']}",
             f"Source: {source(result)}. {metric} {scale_line(result)}",
             _md_table(head(result), rows(result)),
             "Δ: the row's mean minus its baseline row's in the same column (the paper's numbers and ours); "
             f"p: {'; '.join(tests) if tests else 'no test (one side has no runs or seeds to compare)'}."
             + (" p paired, Holm: the t-test of the seed-matched differences (seed k of the row minus seed k of its "
                "baseline), with Holm's correction over the table's experiments that have one, each pair of runs "
                "counted once however many cells it stands for"
                + (f" ({result['holm_m']} in the family)" if result.get("holm_m") is not None else "")
                + " (skiplab.analysis.blocks)." if _holm(result) else "")]
    if brief:
        return "\n\n".join(parts)
    if result["settings"]:
        parts.append("Settings at this scale:\n" + "\n".join(f"- `{k}`: {v}" for k, v in sorted(result["settings"].items())))
    for title, text in (("Reading", result["reading"]), *(("Note", n) for n in result["notes"])):
        if text:
            parts.append(f"{title}: {text}")
    env = result.get("environment") or {}
    made = f" Table made on {host.machine_name(env)}, torch {env['torch']}." if "cpu" in env else ""
    trained = "; ".join(f"{name} ({v['runs']} runs, code {', '.join(v['commits']) or 'unknown'})"
                        for name, v in (result.get("run_machines") or {}).items())
    runs_line = (f"Wall time of this invocation {duration(result['wall_time_s'])}; the runs' own training time "
                 f"{duration(result['train_time_s'])} in all (summed over runs, side by side or not)."
                 + (f" Runs trained on: {trained}." if trained else "") + made)
    parts.append("Made with:\n\n```bash\n" + result["command"] + "\n```\n\n" + runs_line)
    if result["train_commands"]:
        parts.append("Each run on its own (K = 1 .. seeds):\n\n```bash\n"
                     + "\n".join(result["train_commands"]) + "\n```")
    return "\n\n".join(parts) + "\n"


def csv(result: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = _csv.writer(buf)
    w.writerow(["table", "scale", "row", "column", "paper", "mean", "std", "n", "values", "paper_delta", "delta", "p",
                "test", "baseline", "available", "paper_metric", "ours_metric", "p_paired", "p_holm"])
    for c in result["cells"]:
        p = c.get("p")
        w.writerow([result["table"], result["scale"], c["row"], c["column"], c["paper"], c.get("mean"), c.get("std"),
                    c.get("n"), " ".join("" if v is None else f"{v:.4f}" for v in c.get("values") or []),
                    c.get("paper_delta"), c.get("delta"),
                    " ".join(str(x) for x in p) if isinstance(p, list) else p, c.get("test"), c["baseline"],
                    c.get("why") or "yes", result["metric"], result.get("ours_metric", result["metric"]),
                    c.get("p_paired"), c.get("p_holm")])
    return buf.getvalue()


def train_command(task: str, cfg: Any) -> str:
    """The ``skiplab train`` command of a run, for any seed K (fields at their defaults left out): trained so,
    in the directory it names, ``reproduce`` finds the run (one per GPU by hand, say)."""
    args = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if f.name in ("seed", "out") or value == default:
            continue
        text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value).lower() if isinstance(value, bool) else str(value)
        args += ["--" + f.name.replace("_", "-"), shlex.quote(text)]
    out = shlex.quote(str(Path(cfg.out).parent / "seed")) + "K"
    return " ".join(["skiplab", "train", task, *args, "--seed", "K", "--out", out])


def seeds_text(n: int) -> str:
    """"seeds 1-N", or "seed 1" for one."""
    return "seed 1" if n == 1 else f"seeds 1-{n}"


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    if h:
        return f"{h} h {rem // 60:02d} min"
    return f"{rem // 60} min {rem % 60:02d} s" if rem < 600 else f"{rem // 60} min"


def gpu_estimate(resolved: list[Any], seeds: int) -> str:
    """Estimated GPU-hours of a table's distinct paper-scale runs over ``seeds`` (see GPU_BASIS)."""
    seen: dict[str, float] = {}
    for r in resolved:
        if r.config is not None:
            seen[repr(dataclasses.replace(r.config, seed=1))] = r.setting.gpu_hours
    if not seen:
        return "-"
    return f"~{sum(seen.values()) * seeds:,.0f} GPU-hours (estimate)"


def _panel_title(column: str, cells: list[dict[str, Any]]) -> str:
    """The paper's column, and the data ours trained on where the scale put other data in its place (Fashion-MNIST
    for CIFAR-10 on a CPU): a panel never names data its bars did not come from."""
    ours = sorted({str(c["config"].get("dataset") or c["config"].get("corpus") or "") for c in cells
                   if c.get("config")} - {""})
    plain = lambda s: re.sub(r"[^a-z0-9]", "", s.lower())  # noqa: E731
    if not ours or [plain(o) for o in ours] == [plain(column)]:
        return column
    return f"{column} (paper); ours: {', '.join(ours)}"


def deltas_figure(result: dict[str, Any], path: Path) -> bool:
    """Per column, each row's difference to its baseline: the paper's (a bar) beside ours (mean ± std over seeds).

    The two are on one axis so that the ordering of the designs can be compared at a glance, whatever the
    absolute level of the scale; where ours is in another unit (the LM miniatures' bits per byte against the
    papers' perplexity) ours get an axis of their own on the right. Returns False (nothing written) where no
    cell has ours.
    """
    columns = list(dict.fromkeys(c["column"] for c in result["cells"]))
    panels = [(col, [c for c in result["cells"] if c["column"] == col and c["row"] != c["baseline"]
                     and (c.get("delta") is not None or c.get("paper_delta") is not None)]) for col in columns]
    panels = [(col, cells) for col, cells in panels if any(c.get("delta") is not None for c in cells)]
    if not panels:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(max(6.0, 1.1 * max(len(c) for _, c in panels) + 2) * len(panels),
                                                       4.2), squeeze=False)
    for ax, (col, cells) in zip(axes[0], panels):
        xs = range(len(cells))
        paper = [(x, c["paper_delta"]) for x, c in zip(xs, cells) if c.get("paper_delta") is not None]
        ours_ = [(x, c["delta"], c.get("std") or 0) for x, c in zip(xs, cells) if c.get("delta") is not None]
        ax.bar([x - 0.2 for x, _ in paper], [v for _, v in paper], 0.4, label="paper", color="C0")
        ours_ax = ax.twinx() if _units_differ(result) else ax
        ours_ax.bar([x + 0.2 for x, *_ in ours_], [v for _, v, _ in ours_], 0.4, label="ours (mean)", color="C1",
                    yerr=[sd for *_, sd in ours_], capsize=3)
        for x, c in zip(xs, cells):  # a row of ours that is missing says so, rather than reading as a zero
            if c.get("delta") is None:
                ours_ax.text(x + 0.2, 0, " not run", rotation=90, ha="center", va="bottom", fontsize=7, color="0.4")
        ax.axhline(0, color="k", lw=0.8)
        if ours_ax is not ax:  # both axes symmetric about zero, so that the two zeros are one line
            for a in (ax, ours_ax):
                top = max(abs(v) for v in a.get_ylim())
                a.set_ylim(-top, top)
            ours_ax.set_ylabel(f"Δ ours: {result['ours_metric']}", color="C1")
            ours_ax.legend(fontsize=8, loc="lower right")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([c["row"] for c in cells], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"Δ {'paper: ' if _units_differ(result) else ''}{result['metric']} vs "
                      f"{cells[0]['baseline'] if cells else ''}")
        ax.set_title(_panel_title(col, cells), fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    better = "higher" if result["higher_is_better"] else "lower"
    fig.suptitle(f"{result['table']} at {result['scale']} scale: difference to the baseline\n"
                 f"({better} is better; error bars: std of the row over seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


__all__ = ["markdown", "csv", "head", "source", "train_command", "duration", "gpu_estimate", "deltas_figure",
           "GPU_BASIS"]
