"""Compare variants across seeds: every variant x seed is one run, then one table.

A variant is what changes from the base config: a connection (image and MT), a model spec (MT: another
family or its options, ``dwlstm-small(share=all)``), or both. Runs are labelled by what varied.

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
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from .. import run_dir
from ..analysis import comparison
from ..connections import connection
from ..models import format_model_spec, parse_model_spec, with_options
from ..translate.translator import evaluate_split
from . import image, mt


@dataclass(frozen=True)
class Variant:
    """One row of a comparison: its ``label``, the config ``changes`` it makes, its describing ``columns``."""

    label: str
    changes: dict[str, Any]
    columns: dict[str, Any] = field(default_factory=dict)


def _score_mt(cfg, summary: dict[str, Any], progress: bool) -> dict[str, Any]:
    """Score the test set with the average of the last (up to) 5 checkpoints, beam 4, into the summary."""
    average = min(5, len(run_dir.step_checkpoints(Path(cfg.out))))
    result = evaluate_split(cfg.out, "test", average=average, beam=4, progress=progress)
    summary = dict(summary, test_bleu=result["bleu"], test_chrf=result["chrf"],
                   bleu_signature=result["bleu_signature"], averaged=average)
    run_dir.write_json(Path(cfg.out) / "summary.json", summary)
    return summary


@dataclass(frozen=True)
class Task:
    """What ``compare`` needs of a task: how to train and score a run, its metric, and its curves."""

    train: Callable[..., dict[str, Any]]
    score: Callable[..., dict[str, Any]] | None  # adds the metric to a finished run's summary
    metric: str
    label: str
    curves: tuple[str, ...]
    higher_is_better: bool


TASKS = {
    "image": Task(image.train, None, "final_test_error", "error %", ("train_loss", "test_error"), False),
    "mt": Task(mt.train, _score_mt, "test_bleu", "BLEU", ("train_loss", "valid_loss"), True),
}


def run_name(spec: str) -> str:
    """A directory name for a label: ``2rSkip+LN`` stays; characters a shell would mind become ``_``."""
    return re.sub(r"[^A-Za-z0-9+.=_-]", "_", spec)


def _connections(connections: tuple[str, ...]) -> list[str]:
    """The connection specs as the user names them (PostLN stays PostLN), each checked, none twice."""
    specs = [c.strip() for c in connections]
    canonical = [connection(c, 4).spec for c in specs]  # a bad spec fails before any run
    if len(set(canonical)) != len(canonical):
        raise ValueError(f"a connection is listed twice: {', '.join(connections)}")
    return specs


def connection_variants(base_model: str, connections: tuple[str, ...]) -> list[Variant]:
    """One variant per connection spec on ``base_model``, labelled by the spec."""
    return [Variant(c, {"model": with_options(base_model, connection=c)}, comparison.connection_columns(c))
            for c in _connections(connections)]


def model_variants(base_model: str, models: tuple[str, ...], connections: tuple[str, ...]) -> list[Variant]:
    """Every model spec x connection (either list may be empty: the base's model, the model's own connection).

    Labels say what varies: the connection alone (``PostLN``), the model alone (``dwlstm-small``), or both.
    """
    models = tuple(m.strip() for m in models) or (base_model,)
    for m in models:
        parse_model_spec(m)
    if len(set(models)) != len(models):
        raise ValueError(f"a model is listed twice: {', '.join(models)}")
    conns = _connections(connections) if connections else [None]
    out = []
    for m in models:
        for c in conns:
            spec = with_options(m, connection=c) if c else m  # a family without connections fails here
            label = " ".join(x for x, varies in ((m, len(models) > 1), (c, len(conns) > 1)) if varies) or m
            if len(models) > 1:
                columns = {"model": m, **(comparison.connection_columns(c) if c else {})}
            else:
                columns = comparison.connection_columns(c) if c else {"model": m}
            out.append(Variant(label, {"model": spec}, columns))
    return out


def compare(task: str, base, variants: list[Variant], seeds: int, progress: bool = True) -> list[dict[str, Any]]:
    """Train ``base`` once per variant and seed 1..``seeds`` under ``base.out``; print and write the table."""
    spec = TASKS[task]
    metric, label = spec.metric, spec.label
    if not variants or seeds < 1:
        raise ValueError("give at least one variant and seeds >= 1")
    for v in variants:  # a bad combination fails before any run
        dataclasses.replace(base, **v.changes)
    root = Path(base.out)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    results: dict[str, list[dict[str, Any]]] = {v.label: [] for v in variants}
    curves: dict[str, list[list[dict[str, Any]]]] = {v.label: [] for v in variants}
    columns = {v.label: dict(v.columns) for v in variants}
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
        if task == "mt" and (out / "config.json").is_file():
            columns[variant.label]["parameters"] = run_dir.read_json(out / "config.json")["parameters"]
            times = [r["train_time_s"] / r["steps"] for r in results[variant.label] if r.get("status") == "finished"]
            if times:
                columns[variant.label]["s/update"] = f"{sum(times) / len(times):.2f}"

    rows = comparison.summarise(results, metric, columns)
    table = comparison.markdown(rows, label)
    (root / "table.md").write_text(table + "\n")
    (root / "table.csv").write_text(comparison.to_csv(rows))
    data = getattr(base, "dataset", None) or f"{getattr(base, 'corpus', '') or 'files'} {base.src}-{base.tgt}"
    length = f"{base.epochs} epochs" if base.epochs else f"{base.max_steps} steps"
    specs = (parse_model_spec(dataclasses.replace(base, **v.changes).model) for v in variants)
    models = sorted({format_model_spec(name, {k: o for k, o in options.items() if k != "connection"})
                     for name, options in specs})  # the models compared, whatever connections they hold
    title = f"{models[0] if len(models) == 1 else 'models'} on {data}, {seeds} seed(s), {length}"
    comparison.plot_curves(curves, spec.curves, root / "curves.png", title, x="epoch" if task == "image" else "step")
    run_dir.write_json(root / "compare.json", {
        "config": dataclasses.asdict(base), "variants": [dataclasses.asdict(v) for v in variants], "seeds": seeds,
        "rows": rows, "runs": results, "wall_time_s": time.time() - t0, "environment": run_dir.environment(),
    })
    print(f"{title}; {label} over seeds ({'higher' if spec.higher_is_better else 'lower'} is better)")
    print(table)
    print(f"wrote {root / 'table.md'}, {root / 'table.csv'}, {root / 'curves.png'}")
    return rows


def check_same_run(cfg, advice: str = "use another --out") -> None:
    """An error when ``cfg.out`` holds a run with settings other than ``cfg``'s (where it lives aside:
    :data:`~skiplab.run_dir.PLACE`)."""
    out = Path(cfg.out)
    if (out / "config.json").is_file():
        stored = getattr(type(cfg), "upgrade", dict)(run_dir.read_json(out / "config.json").get("config") or {})
        diff = run_dir.changed_settings(stored, dataclasses.asdict(cfg), ignore=run_dir.PLACE)
        if diff:
            raise run_dir.RunDirError(f"{out} holds a run with other settings ({', '.join(diff)}); {advice}")


def train_or_resume(task: str, cfg, progress: bool = True) -> dict[str, Any]:
    """Train ``cfg``'s run into ``cfg.out``, resuming it from its last checkpoint when one is there."""
    out = Path(cfg.out)
    resume = (out / "last.pt").is_file()
    out.parent.mkdir(parents=True, exist_ok=True)
    return TASKS[task].train(cfg, resume=resume, overwrite=not resume and out.exists(), progress=progress)


def _existing(out: Path, cfg) -> dict[str, Any] | None:
    """The summary of a run already done as ``cfg`` asks; an error if ``out`` holds a different run."""
    check_same_run(cfg)
    if (out / "summary.json").is_file():
        return run_dir.read_json(out / "summary.json")
    return None
