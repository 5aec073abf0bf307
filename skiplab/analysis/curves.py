"""Learning curves of finished or running runs, read from their ``metrics.jsonl``, in one figure.

Runs are grouped by their connection (image) or model spec (MT) (from ``config.json``) unless labels are given; a group of
several seeds is drawn as mean ± std, as in ``compare``. Translation runs are plotted against the
update step, image runs against the epoch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import run_dir
from .comparison import plot_curves

DEFAULT_KEYS = {"step": ("train_loss", "valid_loss", "valid_ppl"), "epoch": ("train_loss", "test_error")}


def read_run(path: str | Path) -> tuple[str, list[dict[str, Any]]]:
    """(connection, metric records) of the run directory ``path``."""
    path = Path(path)
    if not (path / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{path} is not a run directory: no metrics.jsonl there")
    records = run_dir.read_metrics(path)
    if not records:
        raise ValueError(f"{path} has no metrics yet")
    try:
        stored = run_dir.read_json(path / "config.json")
        # image runs are named by their blocks' connection, MT runs by their model spec
        label = stored["model"]["connection"] if "dataset" in stored["config"] else stored["config"]["model"]
    except (FileNotFoundError, KeyError, TypeError, AttributeError):
        label = path.name
    return label, records


def plot_runs(paths: list[str], out: str | Path, keys: tuple[str, ...] = (), labels: tuple[str, ...] = (),
              title: str = "") -> Path:
    """Plot ``keys`` (default: the task's usual ones) of the runs in ``paths`` into ``out``; return it."""
    if not paths:
        raise ValueError("give at least one run directory")
    if labels and len(labels) != len(paths):
        raise ValueError(f"{len(labels)} labels for {len(paths)} runs")
    runs = [read_run(p) for p in paths]
    x = "step" if all("step" in r[1][0] for r in runs) else "epoch"
    keys = tuple(keys) or DEFAULT_KEYS[x]
    for path, (_, records) in zip(paths, runs):
        missing = [k for k in keys if any(k not in rec for rec in records)]
        if missing:
            raise ValueError(f"{path} has no {', '.join(missing)} in its metrics; it has: "
                             f"{', '.join(sorted(records[0]))}")
    groups: dict[str, list[list[dict[str, Any]]]] = {}
    for i, (label, records) in enumerate(runs):
        groups.setdefault(labels[i] if labels else label, []).append(records)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_curves(groups, keys, out, title or ", ".join(Path(p).name for p in paths), x=x)
    return out
