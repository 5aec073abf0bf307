"""``skiplab reproduce``: run what a table needs at a scale, then write it with the paper's numbers beside ours.

    OUT/<scale>/runs/<what>-<key>/seed<k>/   one run directory per config and seed, shared by every table
    OUT/<scale>/<table>/table.md, table.csv  per cell: the paper's number, ours (mean ± std over seeds), the
                                             difference to the row's baseline (the paper's and ours), and
                                             the significance of ours; the scale, settings and commands
    OUT/<scale>/<table>/table.json           all of it, with every run's config and per-seed values
    OUT/<scale>/<table>/deltas.png           per column, each row's difference to its baseline: paper's and ours
    OUT/<scale>/<table>/curves.png           the learning curves of the table's runs (mean ± std over seeds)

A cell is one row x column of the table. It is measured on the runs of its config over seeds 1..N: the
final test error (image tables; accuracy = 100 - error), the test BLEU of the average of the paper's
number of last checkpoints with beam 4 (MT tables; tokenised BLEU, the papers' form, with sacrebleu's
detokenised BLEU beside it), or the BLEU after one layer is made linear (probe tables). Finished runs
are reused, cut-short ones resumed, and scores are cached in the run directory, so a second
``reproduce`` of a finished table trains and translates nothing.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .. import run_dir
from ..analysis import comparison
from ..analysis.linearity import linearity
from ..analysis.trained import load_trained
from ..config import parse_list
from ..connections import connection
from ..models import format_model_spec, model_config, parse_model_spec, with_options
from ..translate.metrics import paired_bootstrap
from ..translate.translator import evaluate_split, split_forms
from . import report, runs, stats
from .papers import TABLES, table as get_table
from .scales import Scale, Setting, scale as get_scale
from .tables import Cell, Table

PROBE_STEPS = {"smoke": 1, "cpu": 50, "paper": 100}
PROBE_TEST = "none (a probe cell is the row's run with one layer made linear; its translations are not kept to test)"


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A cell at a scale: the runs' config (seed 1) and setting, or why there are none."""

    cell: Cell
    task: str = ""
    config: Any = None
    setting: Setting | None = None
    why: str = ""


def _canonical(spec: str) -> str:
    return connection(spec, 4).spec


def _data_dir(root: str, name: str) -> str:
    """``root/<name>`` when it exists, else '' (the dataset's own default places)."""
    if not root:
        return ""
    path = Path(root) / name.partition("(")[0].strip()  # a corpus spec's options aside
    return str(path) if path.is_dir() else ""


def resolve(t: Table, cell: Cell, sc: Scale, data_root: str = "", device: str = "auto") -> Resolved:
    """What ``cell`` runs at scale ``sc``."""
    run = cell.run
    if run is None:
        return Resolved(cell, why=f"paper only: {cell.why}")
    setting = sc.settings[run.setting]
    if isinstance(setting, str):
        return Resolved(cell, why=f"not available at {sc.name} scale: {setting}")
    base = setting.config
    if setting.task == "image":
        cfg = dataclasses.replace(base, model=with_options(base.model, connection=_canonical(run.connection)),
                                  data_dir=_data_dir(data_root, base.dataset), device=device)
        return Resolved(cell, "image", cfg, setting)
    name, options = parse_model_spec(f"{run.family}-{setting.size}")
    options = {**options, **dict(run.options)}
    if run.family == "transformer" and run.connection:
        options["connection"] = _canonical(run.connection)
    preset = model_config(format_model_spec(name, options), vocab_size=100)
    layers = preset.encoder_layers
    if run.layers:
        if run.layers not in setting.layers:
            return Resolved(cell, why=f"not available at {sc.name} scale: no {run.layers}-layer model there")
        layers = setting.layers[run.layers]
        if layers != preset.encoder_layers or layers != preset.decoder_layers:
            options.update(encoder_layers=layers, decoder_layers=layers)
    if run.probe and run.probe[1] > layers:
        return Resolved(cell, why=f"not available at {sc.name} scale: the model there has {layers} layers")
    cfg = dataclasses.replace(base, model=format_model_spec(name, options),
                              data_dir=_data_dir(data_root, base.corpus), device=device)
    return Resolved(cell, "mt", cfg, setting)


def _seeded(r: Resolved, seed: int, root: Path) -> Any:
    return runs.placed(root, r.task, dataclasses.replace(r.config, seed=seed))


# ---- measuring a cell ------------------------------------------------------------------------------------
def _mt_score(cfg: Any, average: int, beam: int, progress: bool) -> dict[str, Any]:
    """The test scores of a finished MT run, averaged over its last ``average`` checkpoints (cached)."""
    out = Path(cfg.out)
    average = max(1, min(average, len(run_dir.step_checkpoints(out))))
    cache = out / f"score.test.beam{beam}.avg{average}.json"
    if cache.is_file():
        return run_dir.read_json(cache)
    result = evaluate_split(out, "test", average=average, beam=beam, data_dir=cfg.data_dir, device=cfg.device,
                            progress=progress)
    result = {k: v for k, v in result.items() if k != "model_config"}
    run_dir.write_json(cache, result)
    return result


def _layer(probe: tuple[str, int]) -> str:
    """A probe cell's ("decoder", k), k 1-based as the papers count, as the model's block name: decoder.<k-1>."""
    side, k = probe
    return f"{side}.{k - 1}"


def _probe(cfg: Any, average: int, beam: int, layer: str, steps: int, progress: bool,
           batch: tuple[str, ...] = ()) -> dict[str, Any]:
    """The linearity probe of one layer of a finished MT run's averaged model, cached per layer. On a miss,
    every uncached layer of ``batch`` that the model has is probed in the same call, so the untouched model
    is translated once for all of them rather than once per layer."""
    out = Path(cfg.out)
    average = max(1, min(average, len(run_dir.step_checkpoints(out))))

    def cache(name: str) -> Path:
        return out / f"probe.{name}.beam{beam}.avg{average}.steps{steps}.json"

    if cache(layer).is_file():
        return run_dir.read_json(cache(layer))
    averaged = out / f"avg{average}.pt"
    if not averaged.is_file():
        state, _ = run_dir.average_checkpoints(out, average)
        run_dir.save_checkpoint(averaged, state)
    tr = load_trained(averaged)
    blocks = tr.blocks()
    wanted = [layer] + [b for b in batch if b != layer and b in blocks and not cache(b).is_file()]
    result = linearity(tr, wanted, steps=steps, beam=beam, progress=progress)
    for row in result["layers"]:  # each file as if its layer had been probed alone (with the call's total time)
        run_dir.write_json(cache(row["layer"]), {**result, "layers": [row], "layers_in_call": wanted})
    return run_dir.read_json(cache(layer))


def _measure(t: Table, r: Resolved, cfg: Any, sc: Scale, progress: bool) -> dict[str, Any] | None:
    """One seed's value of a cell (None where its run did not finish), with what the significance needs."""
    out = Path(cfg.out)
    summary = run_dir.read_json(out / "summary.json") if (out / "summary.json").is_file() else {}
    if summary.get("status") != "finished":
        return None if not summary else {"value": None, "diverged": True}
    if r.task == "image":
        error = summary["final_test_error"]
        return {"value": 100.0 - error if t.metric.startswith("accuracy") else error, "train_time_s": summary["train_time_s"]}
    average = t.averaged(r.cell.run.setting)
    if t.probes:
        batch = tuple(_layer(c.run.probe) for c in t.cells if c.run and c.run.probe)
        probe = _probe(cfg, average, t.beam, _layer(r.cell.run.probe or ("encoder", 1)), PROBE_STEPS[sc.name],
                       progress, batch)
        if r.cell.run.probe is None:  # the untouched model's BLEU, which every probe of the run records
            return {"value": probe["untouched_bleu_tok"], "train_time_s": summary["train_time_s"]}
        row = probe["layers"][0]
        return {"value": row["bleu_tok"], "train_time_s": summary["train_time_s"], "probe_time_s": row.get("time_s")}
    score = _mt_score(cfg, average, t.beam, progress)
    return {"value": score["bleu_tok"], "bleu_detok": score["bleu"], "bleu_tok_signature": score["bleu_tok_signature"],
            "bleu_signature": score["bleu_signature"], "averaged": score.get("averaged") or average,
            "hypotheses": score["hypotheses"], "train_time_s": summary["train_time_s"]}


def _bootstrap(a: dict[str, Any], b: dict[str, Any], cfg_a: Any, cfg_b: Any) -> float | None:
    """p of the paired bootstrap (1,000 resamples, tokenised BLEU) between two seed-matched test outputs."""
    if not (a and b and a.get("hypotheses") and b.get("hypotheses")):
        return None
    config = dataclasses.asdict(cfg_a)
    hyps_a = Path(a["hypotheses"]).read_text().splitlines()
    hyps_b = Path(b["hypotheses"]).read_text().splitlines()
    fa = split_forms(config, "test", hyps_a, cfg_a.data_dir)
    fb = split_forms(dataclasses.asdict(cfg_b), "test", hyps_b, cfg_b.data_dir)
    return paired_bootstrap(fa.tok_refs, fa.tok_hyps, fb.tok_hyps, metric="bleu_tok")["p_value"]


# ---- the command -----------------------------------------------------------------------------------------
def plan(t: Table, sc: Scale, seeds: int, root: Path, data_root: str = "", device: str = "auto",
         rows: tuple[str, ...] = ()) -> tuple[list[Resolved], list[tuple[str, Any]]]:
    """Every cell resolved, and the distinct (task, config) runs they need over seeds 1..``seeds`` (only those of
    ``rows`` when given)."""
    resolved = [resolve(t, c, sc, data_root, device) for c in t.cells]
    jobs: dict[str, tuple[str, Any]] = {}
    for r in resolved:
        if r.config is not None and (not rows or r.cell.row in rows):
            for k in range(1, seeds + 1):
                cfg = _seeded(r, k, root)
                jobs.setdefault(cfg.out, (r.task, cfg))
    return resolved, list(jobs.values())


def reproduce(table_ids: list[str], scale_name: str, out: str = "runs/repro", seeds: int = 2, jobs: int = 1,
              data_root: str = "", device: str = "auto", progress: bool = True, argv: list[str] | None = None,
              rows: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Run what ``table_ids`` need at ``scale_name`` (missing runs only; with ``rows``, only those rows' runs)
    and write each table, every cell whose runs exist measured; return the tables."""
    tables = [get_table(i) for i in table_ids]
    sc = get_scale(scale_name)
    if seeds < 1 or jobs < 1:
        raise ValueError(f"--seeds and --jobs must be >= 1, got {seeds} and {jobs}")
    unknown = [r for r in rows if not any(r in t.rows for t in tables)]
    if unknown:
        known = sorted({r for t in tables for r in t.rows})
        raise ValueError(f"no row {', '.join(map(repr, unknown))} in {', '.join(table_ids)}; its rows: {', '.join(known)}")
    root = Path(out) / sc.name / "runs"
    written = []
    for t in tables:
        t0 = time.time()
        resolved, needed = plan(t, sc, seeds, root, data_root, device)
        train = plan(t, sc, seeds, root, data_root, device, rows)[1] if rows else needed
        if needed:
            print(f"{t.id} at {sc.name} scale: {len(needed)} runs "
                  f"({sum(runs.state(c) == 'finished' for _, c in needed)} finished"
                  f"{f', {len(train)} of them for --rows' if rows else ''})")
        runs.train_missing(train, workers=jobs, progress=progress)
        cells = []
        for r in tqdm(resolved, desc=f"{t.id} cells", unit="cell", disable=not progress or not needed):
            cells.append(_cell_result(t, r, sc, seeds, root, resolved, progress))
        result = {
            "table": t.id, "source": t.source, "title": t.title, "metric": t.metric,
            "higher_is_better": t.higher_is_better, "scale": sc.name, "scale_about": sc.about, "seeds": seeds,
            "settings": {r.cell.run.setting: r.setting.about for r in resolved if r.setting is not None},
            "reading": t.reading, "notes": list(t.notes), "cells": cells,
            "command": "skiplab reproduce " + " ".join(shlex.quote(a) for a in (argv or [t.id, "--scale", sc.name,
                                                                                         "--out", out])),
            "train_commands": sorted({report.train_command(task, cfg) for task, cfg in needed}),
            "train_time_s": sum(runs.train_time(c) for _, c in needed),
            "wall_time_s": time.time() - t0, "environment": run_dir.environment(),
        }
        table_dir = Path(out) / sc.name / t.id
        table_dir.mkdir(parents=True, exist_ok=True)
        run_dir.write_json(table_dir / "table.json", result)
        (table_dir / "table.md").write_text(report.markdown(result))
        (table_dir / "table.csv").write_text(report.csv(result))
        figures = [table_dir / "deltas.png"] if report.deltas_figure(result, table_dir / "deltas.png") else []
        curves = _curves(t, resolved, seeds, root)
        if curves:
            keys = ("train_loss", "test_error") if t.task == "image" else ("train_loss", "valid_loss")
            comparison.plot_curves(curves, keys, table_dir / "curves.png", f"{t.id} at {sc.name} scale, seeds 1-{seeds}",
                                   x="epoch" if t.task == "image" else "step")
            figures.append(table_dir / "curves.png")
        print(report.markdown(result, brief=True))
        print(f"wrote {', '.join(str(p) for p in [table_dir / 'table.md', table_dir / 'table.csv', table_dir / 'table.json', *figures])}")
        written.append(result)
    return written


def _curves(t: Table, resolved: list[Resolved], seeds: int, root: Path) -> dict[str, list[list[dict[str, Any]]]]:
    """Learning curves of the table's finished runs, one entry per distinct run config (labelled by its rows)."""
    labels: dict[str, list[str]] = {}
    configs: dict[str, Resolved] = {}
    for r in resolved:
        if r.config is not None and not (r.cell.run and r.cell.run.probe):
            k = runs.key(r.config)
            configs.setdefault(k, r)
            name = r.cell.row if len(t.columns) == 1 else f"{r.cell.row} ({r.cell.column})"
            if name not in labels.setdefault(k, []):
                labels[k].append(name)
    out = {}
    for k, r in configs.items():
        finished = [c for c in (_seeded(r, s, root) for s in range(1, seeds + 1)) if runs.state(c) == "finished"]
        if finished:
            names = labels[k]  # the rows one run stands for; past three, a count keeps the legend readable
            label = " = ".join(names) if len(names) <= 3 else " = ".join(names[:2]) + f" (+{len(names) - 2} more)"
            out[label] = [run_dir.read_metrics(Path(c.out)) for c in finished]
    return out


def _cell_result(t: Table, r: Resolved, sc: Scale, seeds: int, root: Path, resolved: list[Resolved],
                 progress: bool) -> dict[str, Any]:
    cell = r.cell
    base_row = t.baseline_of(cell.row)
    base_cell = t.cell(base_row, cell.column)
    out = {"row": cell.row, "column": cell.column, "paper": cell.paper, "baseline": base_row,
           "paper_delta": (cell.paper - base_cell.paper if base_cell and cell.paper is not None
                           and base_cell.paper is not None and base_row != cell.row else None)}
    if r.config is None:
        return {**out, "available": False, "why": r.why}
    per_seed = [_measure(t, r, _seeded(r, k, root), sc, progress) for k in range(1, seeds + 1)]
    values = [m["value"] for m in per_seed if m and m.get("value") is not None]
    out.update(available=True, config=dataclasses.asdict(r.config), runs=[str(_seeded(r, k, root).out) for k in
                                                                          range(1, seeds + 1)],
               values=[m["value"] if m else None for m in per_seed], per_seed=per_seed,
               diverged=sum(bool(m and m.get("diverged")) for m in per_seed), **stats.summary(values))
    base = next((b for b in resolved if b.cell is base_cell), None)
    if base is None or base.config is None or base_row == cell.row:
        return {**out, "delta": None, "p": None, "test": None}
    base_seeds = [_measure(t, base, _seeded(base, k, root), sc, progress) for k in range(1, seeds + 1)]
    base_values = [m["value"] for m in base_seeds if m and m.get("value") is not None]
    delta = (out["mean"] - sum(base_values) / len(base_values)) if values and base_values else None
    if r.task == "image":
        return {**out, "delta": delta, "p": stats.welch_p(values, base_values), "test": "Welch's t-test over seeds"}
    if t.probes:
        return {**out, "delta": delta, "p": None, "test": PROBE_TEST}
    ps = [_bootstrap(a, b, _seeded(r, k, root), _seeded(base, k, root))
          for k, (a, b) in enumerate(zip(per_seed, base_seeds), start=1)]
    return {**out, "delta": delta, "p": ps, "test": "paired bootstrap per seed (1,000 resamples, tokenised BLEU)"}


def listing() -> str:
    """Every table: rows, cells runnable per scale, runs needed and the estimated time on a 2-core CPU."""
    lines = []
    for t in TABLES.values():
        lines.append(f"{t.id}  {t.title}  [{t.metric}, {'higher' if t.higher_is_better else 'lower'} is better]")
        lines.append(f"    rows: {', '.join(t.rows)}")
        for name in ("smoke", "cpu", "paper"):
            sc = get_scale(name)
            resolved, needed = plan(t, sc, sc.seeds, Path("."))
            ran = sum(r.config is not None for r in resolved)
            if name == "paper":
                estimate = report.gpu_estimate(resolved, sc.seeds)
            else:
                secs = sum(r.setting.seconds_per_run for r in _distinct(resolved)) * sc.seeds / 2
                estimate = f"~{report.duration(secs)} here" if ran else "-"
            lines.append(f"    {name:5s}: {ran}/{len(resolved)} cells, {len(needed)} runs ({sc.seeds} seeds), {estimate}")
    return "\n".join(lines)


def _distinct(resolved: list[Resolved]) -> list[Resolved]:
    seen: dict[str, Resolved] = {}
    for r in resolved:
        if r.config is not None:
            seen.setdefault(runs.key(r.config) + r.task, r)
    return list(seen.values())


def parse_tables(text: str) -> list[str]:
    """``"000-table1,001-table6"`` or ``all`` -> table ids (each checked)."""
    ids = list(TABLES) if text.strip() == "all" else list(parse_list(text))
    for i in ids:
        get_table(i)
    return ids
