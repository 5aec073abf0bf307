"""Compare variants across seeds in blocks: every variant x seed is one run, then one table that holds as evidence.

A variant is what changes from the base config (skiplab.tasks.variants): a connection, a model spec, or
both. Runs are labelled by what varied. What the table reports is the task's (skiplab.tasks.base.Task).

    OUT/<label>/seed<k>/        a full run directory each (config, metrics, checkpoints, summary)
    OUT/table.md, table.csv     the table (skiplab.analysis.blocks): mean ± std, the paired difference to the
                                baseline (the first variant) with its 95% CI, paired, Welch and Holm-corrected p,
                                trained / stalled / diverged, parameters, FLOPs per token, time per update
    OUT/curves.png              learning curves, mean ± std over seeds
    OUT/compare.json            the comparison's config, the budget, every run's summary, blocks and rows
    OUT/budget.json             --budget flops or time: every variant's updates (skiplab.tasks.budget)

**Blocks.** Seed k of every variant is block k (``--seeds N``: 1..N; ``A-B``: A..B); the runs are queued block by
block (the baseline first in each) and ``--jobs N`` trains N side by side, the next block's first runs beginning as
the last of a block end (no worker waits for a block to finish), so a comparison cut short leaves whole blocks behind
it and at most N runs begun after them. Each run is scored as it finishes, in its own process, so that a block's
small files are whole without its checkpoints. Before anything trains here, the runs already there are checked: a
block begun on another machine is refused (one line naming the block, the machines and what to do), so that every
design keeps a baseline trained on its own machine; ``--mixed-blocks`` allows it, and the table's header then names
the runs left without a pair.

**One kind of machine.** A block's kind of machine (:func:`skiplab.host.machine_kind`: a CPU model with its
kernel set in fp32, a GPU model with its precision) is its baseline run's: where that run is there, the kind its
config.json records, else this machine's, where it will train. Blocks of two kinds are refused before anything
is written or trained (one line naming each kind's seeds), and the table's header names the one kind.

Runs already finished (or diverged) are skipped, finished runs not yet scored are scored, and runs cut
short are resumed, so an interrupted comparison continues where it stopped when the same command is
given again; runs trained with ``train`` into the same layout (in parallel, say) are picked up alike.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from pathlib import Path
from typing import Any

from .. import host, run_dir
from ..analysis import blocks, comparison, effective
from ..device import pick_device
from ..models import format_model_spec, parse_model_spec
from . import budget as budgets
from . import check_same_run, get
from .parallel import score_run, scored, state, train_missing
from .variants import Variant, baseline_lengths, run_name


def compare(task: str, base, variants: list[Variant], seeds: int | tuple[int, ...], progress: bool = True,
            jobs: int = 1, budget: str = "updates", mixed_blocks: bool = False,
            baseline_updates: tuple[float, ...] = (), overwrite: bool = False) -> list[dict[str, Any]]:
    """Train ``base`` once per variant and seed (``seeds``: 1..N, or the seeds listed) under ``base.out``, block by
    block (``jobs`` runs side by side), each variant given ``budget`` (:mod:`skiplab.tasks.budget`); print and write
    the table. ``baseline_updates``: the baseline also trained at these multiples of its updates in every block,
    and each design's effective compute read off them (``effective.md``, :mod:`skiplab.analysis.effective`).
    ``base.out`` is refused where it is a training run's folder, or (without ``overwrite``) holds the table of a
    comparison with a design or seed this one lacks (:func:`skiplab.run_dir.check_table_kept`)."""
    if baseline_updates and budget != "updates":
        raise ValueError("--baseline-updates lengthens the baseline itself; give it with --budget updates")
    variants = baseline_lengths(variants, base, tuple(baseline_updates))
    spec = get(task)
    seed_list = tuple(range(1, seeds + 1)) if isinstance(seeds, int) else tuple(seeds)
    if not variants or not seed_list or min(seed_list) < 1 or jobs < 1:
        raise ValueError("give at least one variant, seeds >= 1 and jobs >= 1")
    for v in variants:  # a bad combination fails before any run
        dataclasses.replace(base, **v.changes)
    budgets.check(spec, base, budget)
    spec.check_scorable(base)  # e.g. a metric whose package is not installed: said before any run trains
    root = Path(base.out)
    _check_root(root, [v.label for v in variants], seed_list, overwrite, budget)
    block_kinds(base, variants, seed_list)  # blocks of two kinds of machine: refused before anything is written
    run_dir.note_made(root)  # removed where nothing is written in it (run_dir.let_go): a run refused its data
    root.mkdir(parents=True, exist_ok=True)
    base = spec.shared_data(base, root, progress)  # e.g. the LM corpus tokenised once for every run
    t0 = time.time()
    plan = budgets.plan(spec, base, variants, budget, root)
    here: tuple[str, str] | None = None  # this machine's name and kind, once a block has runs to train

    def config(v: Variant, seed: int) -> Any:
        steps = {"max_steps": plan[v.label]["max_steps"]} if budget != "updates" else {}
        return dataclasses.replace(base, **v.changes, **steps, seed=seed, out=str(root / run_name(v.label) / f"seed{seed}"))

    every, queue = [], []
    for seed in seed_list:
        block = [config(v, seed) for v in variants]
        for cfg in block:
            check_same_run(cfg)
        todo = [c for c in block if state(c) in ("partial", "missing")]
        if todo and not mixed_blocks:
            here = here or _here(base)
            _check_block(seed, block, here)
        every += block
        queue += [(task, c) for c in todo]
    train_missing(queue, workers=jobs, progress=progress, then=score_run)
    for c in every:  # runs restored or trained before, not scored yet
        if state(c) == "finished":
            scored(spec, c, progress=False)

    results: dict[str, list[dict[str, Any]]] = {v.label: [] for v in variants}
    curves: dict[str, list[list[dict[str, Any]]]] = {v.label: [] for v in variants}
    records: list[blocks.RunRecord] = []
    measured: list[tuple[str, int, dict[str, Any]]] = []
    stored: dict[str, dict[str, Any]] = {}
    reference = None
    for v in variants:
        for seed in seed_list:
            cfg = config(v, seed)
            out = Path(cfg.out)
            summary = scored(spec, cfg, progress)
            if summary["status"] == "finished":
                curves[v.label].append(run_dir.read_metrics(out))
                if reference is None:
                    reference = spec.reference(cfg)
            results[v.label].append(summary)
            measured.append((v.label, seed, summary))
            conf = run_dir.read_json(out / "config.json") if (out / "config.json").is_file() else {}
            stored.setdefault(v.label, conf)
            steps = summary.get("steps")
            value = summary.get(spec.metric)
            if isinstance(value, str):  # a metric that could not be computed says why in its place
                warnings.warn(f"{v.label} seed {seed}: no {spec.metric_label}: {value}", stacklevel=2)
                value = None
            records.append(blocks.RunRecord(
                v.label, seed, summary["status"], value, tuple(run_dir.machines(conf)),
                " + ".join(run_dir.codes(conf)) if conf else None,  # a run resumed on other code names both
                summary["train_time_s"] / steps if summary["status"] == "finished" and steps else None,
                {"loss_spikes": summary.get("loss_spikes"), "max_grad_norm": summary.get("max_grad_norm")},
                tuple(run_dir.kinds(conf)) if conf else ()))

    labels = [v.label for v in variants]
    rows, header = blocks.summarise(records, labels, labels[0], spec.higher_is_better,
                                    reference["value"] if reference else None, spec.stall_margin)
    columns = _columns(spec, variants, plan, stored, records, budget)
    header["reference_label"] = reference["label"] if reference else None
    header["budget"] = budgets.describe(budget, base, plan, labels[0], root)
    table = blocks.markdown(rows, header, columns, spec.metric_label, spec.decimals, spec.higher_is_better)
    data = spec.describe_data(base)
    length = f"{base.epochs} epochs" if getattr(base, "epochs", 0) else f"{base.max_steps} steps"
    specs = (parse_model_spec(dataclasses.replace(base, **v.changes).model) for v in variants)
    models = sorted({format_model_spec(name, {k: o for k, o in options.items() if k != "connection"})
                     for name, options in specs})  # the models compared, whatever connections they hold
    title = f"{models[0] if len(models) == 1 else 'models'} on {data}, {_seeds_text(seed_list)}, {length}"
    said = f"{title}; {spec.metric_label} over seeds ({'higher' if spec.higher_is_better else 'lower'} is better)"
    header["metric_note"] = spec.metric_note(measured)
    said += f"; {header['metric_note']}" if header["metric_note"] else ""
    (root / "table.md").write_text(f"{said}\n\n{table}\n")  # what was compared, as printed
    (root / "table.csv").write_text(blocks.to_csv(rows, columns))
    comparison.plot_curves(curves, spec.curves, root / "curves.png", title, x=spec.x)
    effective_result = None
    if baseline_updates:
        effective_result = effective.effective_compute(records, labels[0], tuple(sorted(baseline_updates)), labels,
                                                       spec.higher_is_better)
        (root / "effective.md").write_text(f"{title}\n\n{effective.table(effective_result)}\n")
    run_dir.write_json(root / "compare.json", {
        "config": dataclasses.asdict(base), "variants": [dataclasses.asdict(v) for v in variants],
        "seeds": len(seed_list), "seed_list": list(seed_list),
        "budget": budget, "plan": plan, "header": header, "columns": columns, "rows": rows, "runs": results,
        **({"effective": effective_result} if effective_result else {}),
        "wall_time_s": time.time() - t0, "environment": host.environment(),
    })
    print(said)
    print(table)
    print(f"wrote {root / 'table.md'}, {root / 'table.csv'}, {root / 'curves.png'}")
    return rows


def _check_root(root: Path, labels: list[str], seeds: tuple[int, ...], overwrite: bool, budget: str) -> None:
    """``root`` may hold this comparison: not a training run's folder; not one of another budget (its runs trained
    to that budget's lengths); its table kept unless ``overwrite``."""
    run_dir.check_not_a_run(root, "a comparison")
    if (root / "compare.json").is_file():
        stored = run_dir.read_json(root / "compare.json")
        if stored.get("budget", "updates") != budget:
            raise run_dir.RunDirError(f"{root} holds a comparison under --budget {stored.get('budget', 'updates')}, "
                                      f"its runs trained to that budget's lengths; this one asks --budget {budget}: "
                                      "give another --out")
        before = {"designs": [v["label"] for v in stored.get("variants", [])],
                  "seeds": stored.get("seed_list") or list(range(1, stored.get("seeds", 0) + 1))}
        run_dir.check_table_kept(root / "compare.json", before, {"designs": labels, "seeds": list(seeds)}, overwrite)


def _seeds_text(seeds: tuple[int, ...]) -> str:
    """"3 seed(s)" for seeds 1..3, else the seeds themselves ("seeds 4, 5")."""
    if seeds == tuple(range(1, len(seeds) + 1)):
        return f"{len(seeds)} seed(s)"
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def _here(base: Any) -> tuple[str, str]:
    """This machine's name and the kind of machine a run of ``base`` trains on here (its device and precision as
    training resolves them: :class:`skiplab.train.run.Run`)."""
    env = host.environment()
    device = str(pick_device(base.device)) if hasattr(base, "device") else "cpu"
    amp = bool(getattr(base, "amp", False)) and device.startswith("cuda")
    return host.machine_name(env), host.machine_kind(env, device, amp)


def block_kinds(base: Any, variants: list[Variant], seeds: tuple[int, ...]) -> dict[int, str]:
    """Each block's kind of machine (the module docstring): its baseline run's where config.json is there, else this
    machine's where the block has runs left to train; a ValueError where they are of two kinds."""
    root, kinds, here = Path(base.out), {}, None
    for seed in seeds:
        outs = [root / run_name(v.label) / f"seed{seed}" for v in variants]
        first = outs[0] / "config.json"
        if first.is_file():
            kinds[seed] = " + ".join(run_dir.kinds(run_dir.read_json(first)))
        elif any(not (o / "summary.json").is_file() for o in outs):
            here = here or _here(base)[1]
            kinds[seed] = here
    blocks.one_kind(kinds)
    return kinds


def _check_block(seed: int, block: list[Any], here: tuple[str, str]) -> None:
    """An error where block ``seed`` has runs begun on a machine (or kind of machine) other than ``here`` (name,
    kind) and runs left to train."""
    elsewhere = {}
    for cfg in block:
        path = Path(cfg.out) / "config.json"
        if path.is_file():
            stored = run_dir.read_json(path)
            names, kinds = run_dir.machines(stored), run_dir.kinds(stored)
            if any(n != here[0] for n in names):
                elsewhere[Path(cfg.out).parent.name] = " + ".join(names)
            elif any(k != here[1] for k in kinds):
                elsewhere[Path(cfg.out).parent.name] = " + ".join(kinds)
    if elsewhere:
        begun = ", ".join(f"{k} on {m}" for k, m in elsewhere.items())
        raise ValueError(f"block seed{seed} was begun on another machine ({begun}); this is {here[0]}: finish it there, "
                         f"or move its runs (*/seed{seed}) aside to train the whole block here, or give --mixed-blocks "
                         "(its designs then lack a same-machine baseline; the table names them)")


def _columns(spec: Any, variants: list[Variant], plan: dict[str, dict[str, Any]], stored: dict[str, dict[str, Any]],
             records: list[blocks.RunRecord], budget: str) -> dict[str, dict[str, str]]:
    """The describing columns of every variant: its own (connection, λ, G / model), then with the task's cost
    columns its parameters, training FLOPs per token (counted), updates under a matched budget, time per update
    relative to the baseline's in the same block, and per-step telemetry."""
    out = {v.label: dict(v.columns) for v in variants}
    if not spec.cost_columns:
        return out
    for v in variants:
        col = out[v.label]
        conf = stored.get(v.label, {})
        if "parameters" in conf:
            col["parameters"] = conf["parameters"]  # an int: the table shows it with thousands separators
        times = [r.s_per_update for r in records if r.label == v.label and r.s_per_update]
        if times:  # seconds on the machines that trained it (time × baseline compares across machines)
            col["s/update"] = f"{sum(times) / len(times):.2f}"
        flops = plan[v.label].get("flops_per_token")
        if flops:
            col["MFLOP/token"] = f"{flops / 1e6:.2f}"
        if budget != "updates":
            col["updates"] = f"{plan[v.label]['max_steps']:,}"
        watched = [r for r in records if r.label == v.label and r.extra.get("loss_spikes") is not None]
        if watched:
            col["loss spikes"] = " / ".join(str(r.extra["loss_spikes"]) for r in watched)
            col["max grad norm"] = f"{max(r.extra['max_grad_norm'] for r in watched):.2f}"
    return out
