"""Learning curves of finished or running runs, read from their ``metrics.jsonl``, in one figure.

Where every run has per-step lines (``steps.jsonl``, :mod:`skiplab.train.telemetry`) and no keys are given, a
second row shows the loss and the gradient norm before clipping at every logged update (log scale), mean ± std
over seeds, each run's loss spikes marked ``x``.

Runs are named by their connection (from ``config.json``: as the model spec names it, ``connection=PostLN``, as
``compare`` names it; else the blocks' connection of an image run, the connections a translation or language model
was built with, else its model spec) unless labels are given. Runs of one name and one
config but their seeds are seeds of one setting, drawn as mean ± std as in ``compare``, at the steps (epochs) every one
of them recorded; runs of one name that differ in anything else (a learning rate, a budget) are lines of their own,
their names given the settings that differ. Translation and language-model runs are plotted against the update step,
image runs against the epoch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .. import run_dir
from ..models import parse_model_spec
from .comparison import draw_curves, plot_curves

DEFAULT_KEYS = {"step": ("train_loss", "valid_loss", "valid_ppl"), "epoch": ("train_loss", "test_error")}


def read_run(path: str | Path) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """(name, metric records, setting) of the run directory ``path``: its setting is its config less the seed and
    where it ran (:data:`skiplab.run_dir.PLACE`), what seeds of one setting share."""
    path = Path(path)
    if not (path / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{path} is not a run directory: no metrics.jsonl there")
    records = run_dir.read_metrics(path)
    if not records:
        raise ValueError(f"{path} has no metrics yet")
    try:
        stored = run_dir.read_json(path / "config.json")
        config = stored["config"]
        written = _written_connection(config["model"])  # as the command named it (PostLN)
        if "dataset" in config:  # image runs: their blocks' connection
            label = written or stored["model"]["connection"]
        else:  # as named, else the connections as built (a preset's own ones), else the model spec
            label = written or " / ".join(stored.get("connections") or []) or config["model"]
        setting = {k: v for k, v in config.items() if k not in ("seed", *run_dir.PLACE)}
    except (FileNotFoundError, KeyError, TypeError, AttributeError):
        label, setting = path.name, {"run": str(path)}
    return label, records, setting


def _written_connection(model: str) -> str | None:
    """The ``connection=`` option of a model spec as written, None where it has none (or is no model spec)."""
    try:
        return parse_model_spec(model)[1].get("connection")
    except ValueError:
        return None


def axis(runs: list[tuple[str, list[dict[str, Any]], dict[str, Any]]]) -> str:
    """``epoch`` for image runs (their records score the test split each epoch: ``test_error``, no ``valid_loss``;
    they log their update ``step`` too), else ``step`` where every run logs one."""
    if all("test_error" in r[1][0] and "valid_loss" not in r[1][0] for r in runs):
        return "epoch"
    return "step" if all("step" in r[1][0] for r in runs) else "epoch"


def names(runs: list[tuple[str, list[dict[str, Any]], dict[str, Any]]]) -> list[str]:
    """Each run's line: its name, and where runs of that name differ in more than their seed, the settings in
    which they differ (``PreLN (lr=0.003)``), so that only seeds of one setting share a line."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for name, _, setting in runs:
        by_name.setdefault(name, []).append(setting)
    out = []
    for name, _, setting in runs:
        others = by_name[name]
        keys = sorted({k for s in others for k in s if any(o.get(k) != s.get(k) for o in others)})
        out.append(f"{name} ({', '.join(f'{k}={_short(setting.get(k))}' for k in keys)})" if keys else name)
    return out


def _short(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def plot_runs(paths: list[str], out: str | Path, keys: tuple[str, ...] = (), labels: tuple[str, ...] = (),
              title: str = "") -> Path:
    """Plot ``keys`` (default: the task's usual ones) of the runs in ``paths`` into ``out``; return it."""
    if not paths:
        raise ValueError("give at least one run directory")
    if labels and len(labels) != len(paths):
        raise ValueError(f"{len(labels)} labels for {len(paths)} runs")
    folders = [Path(p).resolve() for p in paths]
    twice = list(dict.fromkeys(str(p) for p, f in zip(paths, folders) if folders.count(f) > 1))
    if twice:  # it was drawn as two seeds of one group, its mean and spread over copies of itself
        raise ValueError(f"{', '.join(twice)}: a run given twice")
    runs = [read_run(p) for p in paths]
    x = axis(runs)
    given = bool(keys)
    keys = tuple(keys) or DEFAULT_KEYS[x]
    for path, (_, records, _) in zip(paths, runs):
        missing = [k for k in keys if any(k not in rec for rec in records)]
        if missing:
            raise ValueError(f"{path} has no {', '.join(missing)} in its metrics; it has: "
                             f"{', '.join(sorted(records[0]))}")
    lines = list(labels) if labels else names(runs)
    groups: dict[str, list[list[dict[str, Any]]]] = {}
    for line, (_, records, _) in zip(lines, runs):
        groups.setdefault(line, []).append(records)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    named = ", ".join(_name(Path(p)) for p in paths)
    title = title or (named if len(named) <= 100 else f"{len(paths)} runs (named in the legend)")  # within the figure
    steps = [run_dir.read_steps(p) for p in paths]
    if given or not all(steps):
        plot_curves(groups, keys, out, title, x=x)
        return out
    _with_steps(groups, keys, x, steps, lines, out, title)
    return out


def _with_steps(groups: dict[str, list[list[dict[str, Any]]]], keys: tuple[str, ...], x: str,
                steps: list[list[dict[str, Any]]], names: list[str], out: Path, title: str) -> None:
    """The metric panels over a row of per-update panels: loss and gradient norm, spikes marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, max(len(keys), 2), figsize=(6 * max(len(keys), 2), 9), squeeze=False)
    draw_curves(list(axes[0]), groups, keys, x)
    per_step: dict[str, list[list[dict[str, Any]]]] = {}
    for name, lines in zip(names, steps):
        per_step.setdefault(name, []).append([r for r in lines if all(_finite(r[k]) for k in STEP_KEYS)])
    draw_curves(list(axes[1]), per_step, STEP_KEYS, "step")
    colours = {name: f"C{i}" for i, name in enumerate(per_step)}
    for name, lines in zip(names, steps):
        spikes = [r for r in lines if r.get("spike")]
        axes[1][0].scatter([r["step"] for r in spikes], [r["loss"] for r in spikes], marker="x", color=colours[name],
                           zorder=3, label=None)
    axes[1][0].set_ylabel("loss (every logged update; x: spikes)")
    axes[1][1].set_ylabel("gradient norm before clipping")
    axes[1][1].set_yscale("log")
    for ax in axes[0][len(keys):]:
        ax.set_visible(False)
    for ax in axes[1][2:]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


STEP_KEYS = ("loss", "grad_norm")


def _name(path: Path) -> str:
    """A run's name for a title: a seed's directory with its variant's (PreLN/seed1)."""
    return f"{path.parent.name}/{path.name}" if path.name.startswith("seed") else path.name


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)
