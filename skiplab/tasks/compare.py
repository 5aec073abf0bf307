"""Compare variants across seeds: every variant x seed is one run, then one table.

A variant is what changes from the base config (skiplab.tasks.variants): a connection, a model spec, or
both. Runs are labelled by what varied. What the table reports is the task's (skiplab.tasks.base.Task).

    OUT/<label>/seed<k>/        a full run directory each (config, metrics, checkpoints, summary)
    OUT/table.md, table.csv     Table 1 of the rSkip+LN paper's form (see skiplab.analysis.comparison)
    OUT/curves.png              learning curves, mean ± std over seeds
    OUT/compare.json            the comparison's config, every run's summary, and the table rows

Runs already finished (or diverged) are skipped, finished runs not yet scored are scored, and runs cut
short are resumed, so an interrupted comparison continues where it stopped when the same command is
given again; runs trained with ``train`` into the same layout (in parallel, say) are picked up alike.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .. import run_dir
from ..analysis import comparison
from ..models import format_model_spec, parse_model_spec
from . import check_same_run, get, train_or_resume
from .variants import Variant, run_name


def compare(task: str, base, variants: list[Variant], seeds: int, progress: bool = True) -> list[dict[str, Any]]:
    """Train ``base`` once per variant and seed 1..``seeds`` under ``base.out``; print and write the table."""
    spec = get(task)
    metric, label = spec.metric, spec.metric_label
    if not variants or seeds < 1:
        raise ValueError("give at least one variant and seeds >= 1")
    for v in variants:  # a bad combination fails before any run
        dataclasses.replace(base, **v.changes)
    root = Path(base.out)
    root.mkdir(parents=True, exist_ok=True)
    base = spec.shared_data(base, root, progress)  # e.g. the LM corpus tokenised once for every run
    t0 = time.time()
    results: dict[str, list[dict[str, Any]]] = {v.label: [] for v in variants}
    curves: dict[str, list[list[dict[str, Any]]]] = {v.label: [] for v in variants}
    columns = {v.label: dict(v.columns) for v in variants}
    machines: dict[str, set[str]] = {v.label: set() for v in variants}
    jobs = [(v, k) for v in variants for k in range(1, seeds + 1)]
    for variant, seed in tqdm(jobs, desc="compare", unit="run", disable=not progress):
        out = root / run_name(variant.label) / f"seed{seed}"
        cfg = dataclasses.replace(base, **variant.changes, seed=seed, out=str(out))
        summary = _existing(out, cfg)
        if summary is None:
            summary = train_or_resume(task, cfg, progress)
        if summary["status"] == "finished" and metric not in summary and spec.score:  # trained, not yet scored
            summary = spec.score(cfg, summary, progress)
        results[variant.label].append(summary)
        if summary["status"] == "finished":
            curves[variant.label].append(run_dir.read_metrics(out))
        if spec.cost_columns and (out / "config.json").is_file():
            stored = run_dir.read_json(out / "config.json")
            columns[variant.label]["parameters"] = stored["parameters"]
            machines[variant.label].add(run_dir.machine_name(stored.get("environment", {})))
            times = [r["train_time_s"] / r["steps"] for r in results[variant.label] if r.get("status") == "finished"]
            if times:
                columns[variant.label]["s/update"] = f"{sum(times) / len(times):.2f}"

    watched = {v.label: [r for r in results[v.label] if r.get("loss_spikes") is not None] for v in variants}
    if any(watched.values()):  # runs with per-step telemetry: loss spikes per seed, the largest gradient norm
        for name, runs in watched.items():
            columns[name]["loss spikes"] = " / ".join(str(r["loss_spikes"]) for r in runs) or "-"
            columns[name]["max grad norm"] = f"{max(r['max_grad_norm'] for r in runs):.2f}" if runs else "-"
    if len(set().union(*machines.values())) > 1:  # seconds from different machines: say which is which
        for name, names in machines.items():
            columns[name]["machine"] = " + ".join(sorted(names))
    rows = comparison.summarise(results, metric, columns)
    table = comparison.markdown(rows, label, spec.decimals)
    (root / "table.md").write_text(table + "\n")
    (root / "table.csv").write_text(comparison.to_csv(rows))
    data = spec.describe_data(base)
    length = f"{base.epochs} epochs" if getattr(base, "epochs", 0) else f"{base.max_steps} steps"
    specs = (parse_model_spec(dataclasses.replace(base, **v.changes).model) for v in variants)
    models = sorted({format_model_spec(name, {k: o for k, o in options.items() if k != "connection"})
                     for name, options in specs})  # the models compared, whatever connections they hold
    title = f"{models[0] if len(models) == 1 else 'models'} on {data}, {seeds} seed(s), {length}"
    comparison.plot_curves(curves, spec.curves, root / "curves.png", title, x=spec.x)
    run_dir.write_json(root / "compare.json", {
        "config": dataclasses.asdict(base), "variants": [dataclasses.asdict(v) for v in variants], "seeds": seeds,
        "rows": rows, "runs": results, "wall_time_s": time.time() - t0, "environment": run_dir.environment(),
    })
    print(f"{title}; {label} over seeds ({'higher' if spec.higher_is_better else 'lower'} is better)")
    print(table)
    print(f"wrote {root / 'table.md'}, {root / 'table.csv'}, {root / 'curves.png'}")
    return rows


def _existing(out: Path, cfg) -> dict[str, Any] | None:
    """The summary of a run already done as ``cfg`` asks; an error if ``out`` holds a different run."""
    check_same_run(cfg)
    if (out / "summary.json").is_file():
        return run_dir.read_json(out / "summary.json")
    return None
