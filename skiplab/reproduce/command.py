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
detokenised BLEU beside it), the BLEU after one layer is made linear (probe tables), or the final model's
test bits per byte (LM tables at smoke and cpu scale, whose settings say so: not the papers' perplexity per
T5 token; the report names both), or at paper scale its test perplexity per token of the paper's tokenizer (the
LM settings train from a folder of ``skiplab prepare lm`` under ``--data-root`` and, where it is absent, say
what it holds and the command that makes it). Finished runs
are reused, cut-short ones resumed, and scores are cached in the run directory, so a second
``reproduce`` of a finished table trains and translates nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .. import host, run_dir
from ..analysis import blocks
from ..analysis import comparison
from ..analysis.linearity import linearity
from ..config import absolute, count, parse_list
from ..tasks import get as get_task, load_trained
from . import report, runs, stats
from .papers import TABLES, table as get_table
from .prepared import DATA_ROOT
from .scales import GPU_BASIS, Scale, Setting, scale as get_scale
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


def _data_dir(root: str, name: str) -> str:
    """``root/<name>`` when it exists, else '' (the dataset's own default places)."""
    if not root:
        return ""
    path = Path(root) / name.partition("(")[0].strip()  # a corpus spec's options aside
    return str(path) if path.is_dir() else ""


def resolve(t: Table, cell: Cell, sc: Scale, data_root: str = "", device: str = "auto",
            assume_prepared: bool = False, dataset: str = "") -> Resolved:
    """What ``cell`` runs at scale ``sc``. A setting that trains from a prepared folder under ``data_root``
    (:class:`~skiplab.reproduce.prepared.PreparedData`) runs where the folder is there as it needs it, and says what
    is needed where not; ``assume_prepared`` resolves it as if the folder were there (``--list``'s estimates).
    ``dataset`` replaces the setting's dataset where the task allows it (:meth:`~skiplab.tasks.base.Task.
    with_dataset`; ``reproduce --dataset``)."""
    run = cell.run
    if run is None:
        return Resolved(cell, why=f"paper only: {cell.why}")
    setting = sc.settings[run.setting]
    if isinstance(setting, str):
        return Resolved(cell, why=f"not available at {sc.name} scale: {setting}")
    task = get_task(setting.task)
    cfg = task.cell_config(setting.config, run, setting)
    if isinstance(cfg, str):
        return Resolved(cell, why=f"not available at {sc.name} scale: {cfg}")
    if dataset:
        cfg = task.with_dataset(cfg, dataset)
        if isinstance(cfg, str):
            return Resolved(cell, why=f"not available at {sc.name} scale with --dataset {dataset}: {cfg}")
    if setting.prepared is not None:
        data_dir, needs = setting.prepared.find(data_root)
        if needs and not assume_prepared:
            return Resolved(cell, why=f"not available at {sc.name} scale: {needs}")
        data_dir = data_dir or str(Path(data_root or DATA_ROOT) / setting.prepared.folder)
    else:
        data_dir = _data_dir(data_root, task.data_name(cfg))
    cfg = dataclasses.replace(cfg, data_dir=data_dir, device=device)
    missing = "" if assume_prepared else task.missing_data(cfg)
    if missing:
        return Resolved(cell, why=f"not available at {sc.name} scale: {missing}")
    return Resolved(cell, setting.task, cfg, setting)


def _seeded(r: Resolved, seed: int, root: Path) -> Any:
    return runs.placed(root, r.task, dataclasses.replace(r.config, seed=seed))


# ---- measuring a cell ------------------------------------------------------------------------------------
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
    average = run_dir.averaged_over(out, average, lambda n: out / f"probe.{layer}.beam{beam}.avg{n}.steps{steps}.json")

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
    run_dir.require(summary, ("train_time_s",), out / "summary.json")
    average = t.averaged(r.cell.run.setting)
    if t.probes:
        batch = tuple(_layer(c.run.probe) for c in t.cells if c.run and c.run.probe)
        probe = _probe(cfg, average, t.beam, _layer(r.cell.run.probe or ("encoder", 1)), PROBE_STEPS[sc.name],
                       progress, batch)
        if r.cell.run.probe is None:  # the untouched model's BLEU, which every probe of the run records
            return {"value": probe["untouched_bleu_tok"], "train_time_s": summary["train_time_s"]}
        row = probe["layers"][0]
        return {"value": row["bleu_tok"], "train_time_s": summary["train_time_s"], "probe_time_s": row.get("time_s")}
    metric = r.cell.run.metric or r.setting.metric or t.metric
    return get_task(r.task).measure(cfg, summary, metric, average, t.beam, progress)


# ---- the command -----------------------------------------------------------------------------------------
def plan(t: Table, sc: Scale, seeds: int, root: Path, data_root: str = "", device: str = "auto",
         rows: tuple[str, ...] = (), dataset: str = "") -> tuple[list[Resolved], list[tuple[str, Any]]]:
    """Every cell resolved, and the distinct (task, config) runs they need over seeds 1..``seeds`` (only those of
    ``rows`` when given)."""
    resolved = [resolve(t, c, sc, data_root, device, dataset=dataset) for c in t.cells]
    jobs: dict[str, tuple[str, Any]] = {}
    for r in resolved:
        if r.config is not None and (not rows or r.cell.row in rows):
            for k in range(1, seeds + 1):
                cfg = _seeded(r, k, root)
                jobs.setdefault(cfg.out, (r.task, cfg))
    return resolved, list(jobs.values())


def rejoined(pieces: tuple[str, ...], names: list[str]) -> tuple[str, ...]:
    """``--rows`` split at its commas, put back together where a row's own name holds a comma ("2rSkip+LN, 2
    blocks" of 000-table5): from each piece, the longest run of pieces that, joined by ", ", names a row."""
    out, i = [], 0
    while i < len(pieces):
        j = next((j for j in range(len(pieces), i, -1) if ", ".join(pieces[i:j]) in names), i + 1)
        out.append(", ".join(pieces[i:j]))
        i = j
    return tuple(out)


def _table_dir(out: str, scale: str, table_id: str, dataset: str = "") -> Path:
    """``OUT/<scale>/<table>[-<dataset>]``, where a table's files go."""
    return Path(out) / scale / (f"{table_id}-{dataset}" if dataset else table_id)


def reproduce(table_ids: list[str], scale_name: str, out: str = "runs/repro", seeds: int = 2, jobs: int = 1,
              data_root: str = "", device: str = "auto", progress: bool = True, argv: list[str] | None = None,
              rows: tuple[str, ...] = (), dataset: str = "", overwrite: bool = False) -> list[dict[str, Any]]:
    """Run what ``table_ids`` need at ``scale_name`` (missing runs only; with ``rows``, only those rows' runs)
    and write each table, every cell whose runs exist measured; return the tables. With ``dataset``, the cells
    read that dataset instead of their setting's (their task must allow it) and each table is written to
    ``OUT/<scale>/<table>-<dataset>/``, beside the setting's own. A table of more seeds already there is
    replaced by one of fewer only with ``overwrite`` (:func:`skiplab.run_dir.check_table_kept`; its runs stay)."""
    tables = [get_table(i) for i in table_ids]
    sc = get_scale(scale_name)
    if seeds < 1 or jobs < 1:
        raise ValueError(f"--seeds and --jobs must be >= 1, got {seeds} and {jobs}")
    if data_root and not Path(data_root).is_dir():  # a missing data/ under it falls back; a missing root is a slip
        raise ValueError(f"--data-root {data_root} is not a folder")
    known = sorted({r for t in tables for r in t.rows})
    rows = rejoined(rows, known)
    unknown = [r for r in rows if r not in known]
    if unknown:
        raise ValueError(f"no row {', '.join(map(repr, unknown))} in {', '.join(table_ids)}; its rows: "
                         f"{'; '.join(map(repr, known))}")
    root = Path(out) / sc.name / "runs"
    for t in tables:  # a --dataset that no cell of a table takes is refused before anything runs
        resolved = plan(t, sc, seeds, root, data_root, device, dataset=dataset)[0]
        if dataset and all(r.config is None for r in resolved):
            why = next((r.why for r in resolved if r.cell.run is not None), "it has no runs")
            raise ValueError(f"--dataset {dataset}: no cell of {t.id} at {sc.name} scale reads it ({why})")
    for t in tables:  # a table of more seeds is not replaced by one of fewer unless asked, checked before any run
        kept = _table_dir(out, sc.name, t.id, dataset) / "table.json"
        if kept.is_file():
            before = run_dir.read_json(kept).get("seeds")
            if isinstance(before, int):
                run_dir.check_table_kept(kept, {"seeds": list(range(1, before + 1))},
                                         {"seeds": list(range(1, seeds + 1))}, overwrite)
    written = []
    for t in tables:
        t0 = time.time()
        resolved, needed = plan(t, sc, seeds, root, data_root, device, dataset=dataset)
        train = plan(t, sc, seeds, root, data_root, device, rows, dataset)[1] if rows else needed
        if needed:
            print(f"{t.id} at {sc.name} scale: {len(needed)} runs "
                  f"({sum(runs.state(c) == 'finished' for _, c in needed)} finished"
                  f"{f', {len(train)} of them for --rows' if rows else ''})")
        runs.train_missing(train, workers=jobs, progress=progress)
        cells = []
        for r in tqdm(resolved, desc=f"{t.id} cells", unit="cell", disable=not progress or not needed):
            cells.append(_cell_result(t, r, sc, seeds, root, resolved, progress))
        holm_m = holm_cells(cells)
        moved = _read_elsewhere(needed)
        if moved:
            print(f"{t.id}: {moved}")
        result = {
            "table": t.id, "source": t.source, "title": t.title, "metric": t.metric,
            "higher_is_better": t.higher_is_better, "ours_metric": _ours_metric(t, resolved), "scale": sc.name,
            "scale_about": sc.about, "seeds": seeds, **({"dataset": dataset} if dataset else {}),
            "settings": {r.cell.run.setting: r.setting.about + (f"; read here on --dataset {dataset}, in place of "
                                                                f"the setting's own" if dataset else "")
                         for r in resolved if r.setting is not None},
            "reading": t.reading, "notes": list(t.notes) + ([moved] if moved else []), "cells": cells,
            "command": "skiplab reproduce " + " ".join(shlex.quote(a) for a in (argv or [t.id, "--scale", sc.name,
                                                                                         "--out", out])),
            "train_commands": sorted({report.train_command(task, cfg) for task, cfg in needed}),
            "train_time_s": sum(runs.train_time(c) for _, c in needed),
            "wall_time_s": time.time() - t0, "environment": host.environment(),
            "run_machines": run_machines([Path(c.out) for _, c in needed]),
            "run_kinds": run_kinds([Path(c.out) for _, c in needed]),
            "holm_m": holm_m,
        }
        table_dir = _table_dir(out, sc.name, t.id, dataset)
        table_dir.mkdir(parents=True, exist_ok=True)
        run_dir.write_json(table_dir / "table.json", result)
        (table_dir / "table.md").write_text(report.markdown(result))
        (table_dir / "table.csv").write_text(report.csv(result))
        figures = [table_dir / "deltas.png"] if report.deltas_figure(result, table_dir / "deltas.png") else []
        curves = _curves(t, resolved, seeds, root)
        if curves:
            task = get_task(next(r.task for r in resolved if r.config is not None))
            comparison.plot_curves(curves, task.curves, table_dir / "curves.png",
                                   f"{t.id} at {sc.name} scale, {report.seeds_text(seeds)}", x=task.x)
            figures.append(table_dir / "curves.png")
        print(report.markdown(result, brief=True))
        print(f"wrote {', '.join(str(p) for p in [table_dir / 'table.md', table_dir / 'table.csv', table_dir / 'table.json', *figures])}")
        written.append(result)
    return written


def _read_elsewhere(needed: list[tuple[str, Any]]) -> str:
    """'' where every run read its data where this call would give it; else a line saying which runs read them where
    (a run's key sets the data's place aside, so that a run whose data folder moved is found again: data that differ
    at another place are found the same way, and the table must not claim the runs read what they did not)."""
    other: dict[str, int] = {}
    for _, cfg in needed:
        path = Path(cfg.out) / "config.json"
        if not path.is_file():
            continue
        stored = run_dir.read_json(path).get("config", {}).get("data_dir")
        if stored and absolute({"data_dir": stored}) != absolute({"data_dir": cfg.data_dir}):
            other[stored] = other.get(stored, 0) + 1
    if not other:
        return ""
    where = "; ".join(f"{n} at {d}" for d, n in sorted(other.items()))
    return (f"{sum(other.values())} of the table's {len(needed)} runs read their data elsewhere than given here "
            f"({where}): found by their settings, the data's place set aside (a moved data folder); where the "
            "data there differ from these, give another --out")


def holm_cells(cells: list[dict[str, Any]]) -> int:
    """Each cell's ``p_holm``: Holm's correction of the paired p over the table's experiments, an experiment being
    one pair of runs (the cell's and its baseline's) measured one way, counted once however many cells it stands
    for (:func:`skiplab.analysis.blocks.holm_once`); return the family's size."""
    experiments = [(tuple(c.get("runs", ())), tuple(c.get("baseline_runs", ())), c.get("measured", ""))
                   for c in cells]
    for c, p in zip(cells, blocks.holm_once([c.get("p_paired") for c in cells], experiments)):
        if p is not None:
            c["p_holm"] = p
    return len({e for c, e in zip(cells, experiments) if c.get("p_paired") is not None})


def run_machines(dirs: list[Path]) -> dict[str, dict[str, Any]]:
    """Where a table's runs were trained, from each finished run's config.json: machine name -> its number of runs
    and the code versions they name (a run resumed elsewhere counts for every machine it trained on)."""
    seen: dict[str, dict[str, Any]] = {}
    for d in dirs:
        if not (d / "summary.json").is_file() or not (d / "config.json").is_file():
            continue
        stored = run_dir.read_json(d / "config.json")
        envs = [stored.get("environment", {}), *(e["environment"] for e in stored.get("resumed_on", []))]
        for name in run_dir.machines(stored):
            entry = seen.setdefault(name, {"runs": 0, "commits": []})
            entry["runs"] += 1
            for e in envs:
                if host.machine_name(e) == name and e.get("git_commit") and host.code_name(e) not in entry["commits"]:
                    entry["commits"].append(host.code_name(e))
    return seen


def run_kinds(dirs: list[Path]) -> dict[str, dict[str, Any]]:
    """The kinds of machine (:func:`skiplab.host.machine_kind`) a table's finished runs trained on: kind -> its
    number of runs and whether it is a GPU."""
    seen: dict[str, dict[str, Any]] = {}
    for d in dirs:
        if not (d / "summary.json").is_file() or not (d / "config.json").is_file():
            continue
        stored = run_dir.read_json(d / "config.json")
        gpu = str(stored.get("device") or "").startswith("cuda")
        for kind in run_dir.kinds(stored):
            entry = seen.setdefault(kind, {"runs": 0, "gpu": gpu})
            entry["runs"] += 1
    return seen


def _ours_metric(t: Table, resolved: list[Resolved]) -> str:
    """What our numbers are: the table's metric, or what the scale's settings measure instead."""
    return ", ".join(sorted({r.setting.metric or t.metric for r in resolved if r.setting is not None})) or t.metric


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
    out["baseline_runs"] = [str(_seeded(base, k, root).out) for k in range(1, seeds + 1)]
    out["measured"] = f"{cell.run.metric or r.setting.metric or t.metric} {cell.run.probe or ''}".strip()
    delta = (out["mean"] - sum(base_values) / len(base_values)) if values and base_values else None
    task = get_task(r.task)
    if t.probes:
        return {**out, "delta": delta, "p": None, "test": PROBE_TEST}
    if not task.paired:  # Welch over the seeds, and the seed-matched pairs' t-test (Holm-corrected per table)
        pairs = [a["value"] - b["value"] for a, b in zip(per_seed, base_seeds)
                 if a and b and a.get("value") is not None and b.get("value") is not None]
        return {**out, "delta": delta, "p": stats.welch_p(values, base_values), "p_paired": blocks.paired_p(pairs),
                "test": task.significance}
    ps = [task.paired_p(a, b, _seeded(r, k, root), _seeded(base, k, root))
          for k, (a, b) in enumerate(zip(per_seed, base_seeds), start=1)]
    return {**out, "delta": delta, "p": ps, "test": task.significance}


def listing(table_ids: list[str] | None = None) -> str:
    """Every table (or those of ``table_ids``): rows, cells runnable per scale, runs needed and the estimated time on
    a 2-core CPU (each setting's ``seconds_per_run``, timed once on such a machine, two runs side by side: not this
    machine's), and what our numbers are where a scale measures them in another unit than the paper's."""
    lines = []
    for t in (TABLES.values() if table_ids is None else [get_table(i) for i in table_ids]):
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
                estimate = f"~{report.duration(secs)} (estimate for 2 CPU cores)" if ran else "-"
            ours = _ours_metric(t, resolved)
            unit = f"; ours in {ours}, not the paper's {t.metric}" if ours != t.metric else ""
            lines.append(f"    {name:5s}: {ran}/{len(resolved)} cells, {len(needed)} runs ({sc.seeds} seeds), "
                         f"{estimate}{unit}")
            if name in dict(t.out_of_reach):
                lines.append(f"           OUT OF REACH at {name} scale: {dict(t.out_of_reach)[name]}")
            lines += [f"           {line}" for line in _given_prepared(t, sc)]
    return "\n".join(lines)


def _given_prepared(t: Table, sc: Scale) -> list[str]:
    """Per prepared folder that cells of ``t`` train from at ``sc``: what they run once it is under the data root,
    and what it holds and the command that makes it (--list names no data root, so these cells say they need it)."""
    by_folder: dict[Any, list[Resolved]] = {}
    for c in t.cells:
        setting = sc.settings.get(c.run.setting) if c.run else None
        if isinstance(setting, Setting) and setting.prepared is not None:
            by_folder.setdefault(setting.prepared, []).append(resolve(t, c, sc, assume_prepared=True))
    lines = []
    missing: list[Resolved] = []  # cells whose task names files that are not there (captioning's COCO)
    for c in t.cells:
        setting = sc.settings.get(c.run.setting) if c.run else None
        if isinstance(setting, Setting) and setting.prepared is None and resolve(t, c, sc).config is None:
            assumed = resolve(t, c, sc, assume_prepared=True)
            if assumed.config is not None:
                missing.append(assumed)
    if missing:
        task = get_task(missing[0].task)
        folder = task.data_name(missing[0].config)
        estimate = report.gpu_estimate(missing, sc.seeds) if sc.name == "paper" else "-"
        configs = {runs.key(r.config) for r in missing}
        lines.append(f"with --data-root {DATA_ROOT} holding {folder}/: {len(missing)}/{len(t.cells)} cells, "
                     f"{len(configs) * sc.seeds} runs ({sc.seeds} seeds), {estimate}; "
                     f"{task.missing_data(missing[0].config)}")
    for prep, resolved in by_folder.items():
        ran = [r for r in resolved if r.config is not None]
        configs = {runs.key(r.config) for r in ran}
        estimate = report.gpu_estimate(ran, sc.seeds) if sc.name == "paper" else "-"
        ours = _ours_metric(t, ran)
        unit = f"; ours in {ours}, not the paper's {t.metric}" if ours != t.metric else ""
        lines.append(f"with --data-root {DATA_ROOT} holding {prep.folder}/: {len(ran)}/{len(t.cells)} cells, "
                     f"{len(configs) * sc.seeds} runs ({sc.seeds} seeds), {estimate}{unit}; {prep.folder}/ is "
                     f"{prep.needs()}" + (f"; {prep.caveat}" if prep.caveat else ""))
    return lines


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
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:  # it was built and written twice
        raise ValueError(f"{', '.join(twice)} named twice")
    return ids


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``skiplab reproduce``; the parser runs :func:`command`."""
    p.add_argument("tables", nargs="*", help="table ids (000-table1 ...), comma- or space-separated, or all")
    p.add_argument("--list", action="store_true", help="every table: rows, cells per scale, runs, estimated time")
    p.add_argument("--scale", default="cpu", help="smoke, cpu or paper (default: cpu)")
    p.add_argument("--out", default="runs/repro", help="root of the runs and tables (default: runs/repro)")
    p.add_argument("--seeds", type=count(1), default=2,
                   help="seeds 1..N per row (default: 2; the papers average 5 runs)")
    p.add_argument("--jobs", type=count(1), default=1,
                   help="runs trained side by side, each with cores/jobs threads (default: 1)")
    p.add_argument("--data-root", default="",
                   help="a folder holding datasets by name (cifar10/, multi30k/, wmt14-en-de/ ...); a dataset "
                        "absent there is looked for in its default places (default: '')")
    p.add_argument("--rows", type=parse_list, default=(),
                   help="train only these rows' runs (comma-separated, as the table names them); cells of other "
                        "rows are still filled where their runs exist (default: every row)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")
    p.add_argument("--dataset", default="",
                   help="run the cells on this dataset instead of their setting's, where their task allows it (e.g. "
                        "fashion-mnist-scenes-hard or fashion-mnist-scenes-crowded for 001-table5 at cpu scale); "
                        "the table goes to OUT/<scale>/<table>-<dataset>/ (default: the setting's)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a table of more seeds than --seeds gives (its runs stay)")
    p.set_defaults(func=command)


def command(args: argparse.Namespace) -> None:
    """``skiplab reproduce``: list the tables, or reproduce the ones named."""
    if args.list:  # the tables named, else every one
        print(listing(parse_tables(",".join(args.tables)) if args.tables else None))
        print(f"\npaper-scale GPU-hours: {GPU_BASIS}")
        return
    if not args.tables:
        raise ValueError(f"name a table (or all); known: {', '.join(TABLES)}")
    get_scale(args.scale)
    reproduce(parse_tables(",".join(args.tables)), args.scale, out=args.out, seeds=args.seeds, jobs=args.jobs,
              data_root=args.data_root, rows=tuple(args.rows), device=args.device, dataset=args.dataset,
              overwrite=args.overwrite,
              argv=sys.argv[2:] if sys.argv[1:2] == ["reproduce"] else None)
