"""Where an analysis of a run goes, and the small pieces every analysis shares.

    RUN/analysis/<name>.json   the numbers, with what produced them (split, examples, mode, seed, run config)
    RUN/analysis/<name>.md     the table, as printed
    RUN/analysis/<name>.png    the figure (several runs overlaid with ``--compare``)

Nothing already there is replaced without ``overwrite``; that is checked before any work starts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from torch import Tensor

from .. import run_dir
from ..config import show_value
from ..models import model_config, parse_model_spec

SUFFIXES = (".json", ".md", ".png")


def outputs(run: Path, name: str, overwrite: bool) -> dict[str, Path]:
    """The three files an analysis writes into ``run``; an error if one exists and ``overwrite`` is false."""
    files = {s: run / "analysis" / f"{name}{s}" for s in SUFFIXES}
    present = [str(p) for p in files.values() if p.exists()]
    if present and not overwrite:
        raise run_dir.RunDirError(f"{present[0]} exists; use --overwrite to replace it")
    return files


def write(files: dict[str, Path], result: dict[str, Any], table: str, figure) -> None:
    """Write the JSON result, the markdown table and the figure (a matplotlib Figure)."""
    files[".json"].parent.mkdir(parents=True, exist_ok=True)
    run_dir.write_json(files[".json"], result)
    files[".md"].write_text(table + "\n")
    figure.savefig(files[".png"], dpi=120)


def markdown(head: list[str], rows: list[list[Any]]) -> str:
    """A markdown table; floats with 4 significant digits."""
    cells = [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in r] for r in rows]
    widths = [max(len(x[i]) for x in [head] + cells) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells])


class Moments:
    """Running count, mean and standard deviation (population) of values fed in batches, in float64."""

    def __init__(self) -> None:
        self.n, self.sum, self.sumsq = 0, 0.0, 0.0

    def add(self, values: Tensor) -> None:
        v = values.detach().double().flatten()
        self.n += v.numel()
        self.sum += v.sum().item()
        self.sumsq += v.pow(2).sum().item()

    @property
    def mean(self) -> float:
        return self.sum / self.n if self.n else math.nan

    @property
    def std(self) -> float:
        return math.sqrt(max(self.sumsq / self.n - self.mean**2, 0.0)) if self.n else math.nan


def read_what(result: dict[str, Any]) -> str:
    """What an analysis read, for a title or a header: ``N split examples`` (``unit``: what it counted, where that
    is not examples), or that it read learned parameters only."""
    if not result.get("examples"):
        return "learned parameters only (no examples read)"
    return f"{result['examples']} {result['split']} {result.get('unit', 'examples')}"


def per_position(value: Tensor, mask: Tensor | None, batch: int) -> Tensor:
    """Rows of ``value`` that count: one per example (``mask`` None: images, all entries of an example in
    its row) or one per real position (``mask`` (B, T), True at real tokens: MT), features in the columns.
    Broadcast (size-1) batch or position axes are expanded first."""
    if mask is None:
        value = value.expand(batch, *value.shape[1:])
        return value.reshape(batch, -1)
    value = value.expand(*mask.shape, value.shape[-1])
    return value[mask]


def legend_labels(results: list[dict[str, Any]]) -> list[str]:
    """Short legend entries for runs labelled by model specs: only what differs between them, the connection
    by its spec alone (``PreLN``; ``layers=8, PostLN``); a run's full label where nothing differs or a label
    is not a model spec."""
    try:
        specs = [parse_model_spec(r["label"]) for r in results]
    except (ValueError, KeyError):
        return [r["label"] for r in results]
    keys = sorted({k for _, options in specs for k in options})
    differ = [k for k in keys if len({options.get(k) for _, options in specs}) > 1]
    if len({name for name, _ in specs}) > 1 or not differ:
        return [r["label"] for r in results]
    return [", ".join(_option(r["label"], o, k) for k in differ) for r, (_, o) in zip(results, specs)]


def _option(spec: str, options: dict[str, str], key: str) -> str:
    """One differing option of a legend entry: the connection by its spec, others as key=value; an option the spec
    leaves to its preset named by the preset's value (``PreLN``), not a dash."""
    value = options.get(key)
    if value is None:
        try:
            value = show_value(getattr(model_config(spec), key))
        except (ValueError, KeyError, AttributeError):
            value = "-"
    return value if key == "connection" else f"{key}={value}"


def integer_ticks(*axes, y: bool = False) -> None:
    """Whole numbers only on the x axes (block and layer indices), and on the y axes with ``y``."""
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if y:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt

