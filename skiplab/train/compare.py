"""Compare connections across seeds: every connection x seed is one run, then one table.

    OUT/<connection>/seed<k>/   a full run directory each (config, metrics, checkpoints, summary)
    OUT/table.md, table.csv     Table 1 of the rSkip+LN paper's form (see skiplab.analysis.comparison)
    OUT/curves.png              learning curves, mean ± std over seeds
    OUT/compare.json            the comparison's config, every run's summary, and the table rows

Runs already finished (or diverged) are skipped and runs cut short are resumed, so an interrupted
comparison continues where it stopped when the same command is given again.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..analysis import comparison
from ..connections import connection
from . import image, run_dir


def _train_image(cfg, resume: bool, overwrite: bool, progress: bool) -> dict[str, Any]:
    return image.train(cfg, resume=resume, overwrite=overwrite, progress=progress)


def _train_mt(cfg, resume: bool, overwrite: bool, progress: bool) -> dict[str, Any]:
    """Train, then score the test set with the average of the last (up to) 5 checkpoints, beam 4."""
    from ..translate.translator import evaluate_split, step_checkpoints
    from .mt import train as train_mt

    summary = train_mt(cfg, resume=resume, overwrite=overwrite, progress=progress)
    if summary["status"] == "finished":
        average = min(5, len(step_checkpoints(Path(cfg.out))))
        result = evaluate_split(cfg.out, "test", average=average, beam=4, progress=progress)
        summary.update(test_bleu=result["bleu"], test_chrf=result["chrf"], bleu_signature=result["bleu_signature"],
                       averaged=average)
        run_dir.write_json(Path(cfg.out) / "summary.json", summary)
    return summary


# task -> (train function, the summary's metric, its label, curves to plot, higher is better)
TASKS = {
    "image": (_train_image, "final_test_error", "error %", ("train_loss", "test_error"), False),
    "mt": (_train_mt, "test_bleu", "BLEU", ("train_loss", "valid_loss"), True),
}


def run_name(spec: str) -> str:
    """A directory name for a spec: ``2rSkip+LN`` stays; characters a shell would mind become ``_``."""
    return re.sub(r"[^A-Za-z0-9+.=_-]", "_", spec)


def compare(task: str, base, connections: tuple[str, ...], seeds: int, progress: bool = True) -> list[dict[str, Any]]:
    """Train ``base`` once per connection and seed 1..``seeds`` under ``base.out``; print and write the table."""
    train, metric, label, keys, higher = TASKS[task]
    if not connections or seeds < 1:
        raise ValueError("give at least one connection and seeds >= 1")
    specs = tuple(c.strip() for c in connections)  # as the user names them (PostLN stays PostLN)
    canonical = [connection(c, 4).spec for c in specs]  # a bad spec fails before any run
    if len(set(canonical)) != len(canonical):
        raise ValueError(f"a connection is listed twice: {', '.join(connections)}")
    root = Path(base.out)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in specs}
    curves: dict[str, list[list[dict[str, Any]]]] = {s: [] for s in specs}
    jobs = [(s, k) for s in specs for k in range(1, seeds + 1)]
    for spec, seed in tqdm(jobs, desc="compare", unit="run", disable=not progress):
        out = root / run_name(spec) / f"seed{seed}"
        cfg = dataclasses.replace(base, connection=spec, seed=seed, out=str(out))
        summary = _existing(out, cfg)
        if summary is None:
            resume = (out / "last.pt").is_file()
            summary = train(cfg, resume=resume, overwrite=not resume and out.exists(), progress=progress)
        results[spec].append(summary)
        if summary["status"] == "finished":
            curves[spec].append(run_dir.read_metrics(out))

    rows = comparison.summarise(results, metric)
    table = comparison.markdown(rows, label)
    (root / "table.md").write_text(table + "\n")
    (root / "table.csv").write_text(comparison.to_csv(rows))
    data = getattr(base, "dataset", None) or f"{getattr(base, 'corpus', '') or 'files'} {base.src}-{base.tgt}"
    length = f"{base.epochs} epochs" if base.epochs else f"{base.max_steps} steps"
    title = f"{base.model} on {data}, {seeds} seed(s), {length}"
    comparison.plot_curves(curves, keys, root / "curves.png", title, x="epoch" if task == "image" else "step")
    run_dir.write_json(root / "compare.json", {
        "config": dataclasses.asdict(base), "connections": list(specs), "seeds": seeds,
        "rows": rows, "runs": results, "wall_time_s": time.time() - t0, "environment": run_dir.environment(),
    })
    print(f"{title}; {label} over seeds ({'higher' if higher else 'lower'} is better)")
    print(table)
    print(f"wrote {root / 'table.md'}, {root / 'table.csv'}, {root / 'curves.png'}")
    return rows


def _existing(out: Path, cfg) -> dict[str, Any] | None:
    """The summary of a run already done as ``cfg`` asks; an error if ``out`` holds a different run."""
    if (out / "config.json").is_file():
        stored = run_dir.read_json(out / "config.json").get("config") or {}
        diff = run_dir.changed_settings(stored, dataclasses.asdict(cfg))
        if diff:
            raise run_dir.RunDirError(f"{out} holds a run with other settings ({', '.join(diff)}); use another --out")
    if (out / "summary.json").is_file():
        return run_dir.read_json(out / "summary.json")
    return None
