"""``skiplab sweep``: designs x depths x learning rates x seeds, each one ordinary training run, then one table.

Every point (design d, depth L, learning rate η, seed k) is the base config with the model spec's
``connection=d`` and depth options (``layers=L`` for LM: :attr:`~skiplab.tasks.base.Task.depth_options`)
set, ``lr=η`` (the config's own lr alone where no lrs are given) and ``seed=k``. Its run lives where
:mod:`skiplab.reproduce.runs` keys it, so a second sweep (or a ``reproduce``) needing the same run finds it, a
finished or diverged run is reused as it is, one cut short is resumed, and ``--jobs`` runs train side by side:

    OUT/runs/<what>-<key>/seed<k>/   one run directory per point (config, metrics, checkpoints, summary);
                                     ``--runs DIR`` puts them in DIR instead, shared with another sweep
    OUT/sweep.json                   the config, the axes, every run (dir, status, numbers), the rows, the
                                     stability per design x depth, the environment
    OUT/sweep.md, sweep.csv          one row per design x depth x lr
    OUT/depth.png, lr.png, curves.png   the figures (skiplab.reproduce.sweep_report)

A run that diverges (a non-finite loss; its summary's status ``diverged``) is a result, counted and never
retried; one that finishes near the task's context-free reference (LM: the unigram model of the training
split, :meth:`~skiplab.tasks.base.Task.reference`, shown in the figures) trained without learning much. A
finished run is scored on the test split as ``compare`` does (the task's ``score``, cached in its summary). Over the S
seeds of a cell c = (d, L, η), with m_k the test metric of seed k:

    finished(c) = #{k : run k finished},  diverged(c) = #{k : run k diverged}
    mean(c) = (1/n) Σ_k m_k,  std(c) = sqrt(Σ_k (m_k − mean)² / (n − 1))    over the n finished seeds (std 0 at n = 1)
    valid(c) = (1/n) Σ_k v_k        v_k the run's final validation number (LM: final valid bits per byte)
    s/update(c) = (1/n) Σ_k train_time_s_k / steps_k
    spikes(c) = Σ_k loss_spikes_k,  max ‖g‖(c) = max_k max_grad_norm_k      over the runs with per-step telemetry
                (finished or diverged; skiplab.train.telemetry's rule)

and per design and depth, over the lrs η swept:

    stable(d, L, η)       ⇔ finished(d, L, η) = S (no seed diverged, none missing)
    best lr(d, L)         = argmin_η {mean(d, L, η) : stable(d, L, η)}   (argmax where higher is better; a tie
                            goes to the smaller η; none where no η is stable)
    highest stable lr(d, L) = max {η : stable(d, L, η)}                  (none where no η is stable)

The best lr is thus chosen among the lrs at which every seed trained: a lower mean of fewer seeds, the
others having diverged, does not win.

A sweep's runs are all of one kind of machine (:func:`skiplab.host.machine_kind`: a CPU model with its kernel
set in fp32, a GPU model with its precision): runs already there of another kind than the rest, or than this
machine's where runs are left to train here, are refused before anything is trained or written (one line naming
the kinds), and the table's header names the kind. The paired differences (:mod:`skiplab.analysis.blocks`) carry
the exact Wilcoxon p beside the t-test's, and a cell with a stalled or diverged run leaves Holm's family.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .. import host, run_dir
from ..analysis import blocks
from ..device import pick_device
from ..models import parse_model_spec, with_options
from ..tasks import connection_variants, get as get_task
from . import report, runs, stats, sweep_report

STATUSES = ("finished", "diverged")


# ---- the axes ---------------------------------------------------------------------------------------------
def depths_of(values: tuple[Any, ...]) -> tuple[int, ...]:
    """The depths (integers >= 1, none twice), ascending; a one-line error naming the first bad one."""
    out: list[int] = []
    for v in values:
        try:
            depth = int(str(v).strip())  # "4" and 4; "4.5", "x" and "" are not depths
        except ValueError:
            raise ValueError(f"--depths: {v!r} is not an integer") from None
        if depth < 1:
            raise ValueError(f"--depths: a depth must be >= 1, got {depth}")
        if depth in out:
            raise ValueError(f"--depths: {depth} is listed twice")
        out.append(depth)
    if not out:
        raise ValueError("--depths: give at least one depth")
    return tuple(sorted(out))


def lrs_of(values: tuple[Any, ...]) -> tuple[float, ...]:
    """The learning rates (finite, > 0, none twice), ascending; a one-line error naming the first bad one."""
    out: list[float] = []
    for v in values:
        try:
            lr = float(str(v).strip())
        except ValueError:
            raise ValueError(f"--lrs: {v!r} is not a number") from None
        if not math.isfinite(lr) or lr <= 0:
            raise ValueError(f"--lrs: a learning rate must be > 0, got {v}")
        if lr in out:
            raise ValueError(f"--lrs: {lr:g} is listed twice")
        out.append(lr)
    return tuple(sorted(out))


@dataclasses.dataclass(frozen=True)
class Point:
    """One cell of the sweep, its config for seed 1 (checked: a design that cannot take the model failed here)."""

    connection: str
    depth: int
    lr: float
    config: Any


def plan(task: str, base: Any, connections: tuple[str, ...], depths: tuple[Any, ...],
         lrs: tuple[Any, ...] = ()) -> tuple[list[Point], dict[str, Any]]:
    """Every design x depth x lr of the sweep (lrs: ``base.lr`` alone where none given) and the axes, each
    value checked before anything is trained."""
    spec = get_task(task)
    if not spec.depth_options:
        raise ValueError(f"the {task} task has no depth to sweep")
    if not connections:
        raise ValueError("--connections: give at least one connection")
    depths = depths_of(depths)
    lrs = lrs_of(lrs) if lrs else (base.lr,)
    _, options = parse_model_spec(base.model)
    for name in ("connection", *spec.depth_options):
        if name in options:
            raise ValueError(f"the sweep sets {name}; leave it out of --model ({base.model})")
    variants = connection_variants(base.model, tuple(connections))  # bad or repeated specs fail here
    points = []
    for v in variants:
        for depth in depths:
            model = with_options(v.changes["model"], **{name: depth for name in spec.depth_options})
            for lr in lrs:
                try:
                    cfg = dataclasses.replace(base, model=model, lr=lr, seed=1)
                except ValueError as err:  # the config's own check, which speaks of --lr: the sweep's is --lrs
                    raise ValueError(f"--lrs {lr:g}: {err}") from None
                points.append(Point(v.label, depth, lr, cfg))
    spec.check_scorable(base)
    axes = {"connections": [v.label for v in variants], "depths": list(depths), "lrs": list(lrs)}
    return points, axes


# ---- the runs and their numbers -----------------------------------------------------------------------------
def _seeded(task: str, p: Point, seed: int, root: Path) -> Any:
    return runs.placed(root, task, dataclasses.replace(p.config, seed=seed))


def record(task: str, p: Point, seed: int, cfg: Any) -> dict[str, Any]:
    """One run as the sweep reports it: where, its status (``finished``, ``diverged``, ``partial``, ``missing``)
    and its numbers (None where it has none)."""
    spec = get_task(task)
    out = Path(cfg.out)
    summary = run_dir.read_json(out / "summary.json") if (out / "summary.json").is_file() else {}
    finished = summary.get("status") == "finished"
    steps = summary.get("steps")
    conf = run_dir.read_json(out / "config.json") if (out / "config.json").is_file() else {}
    return {"connection": p.connection, "depth": p.depth, "lr": p.lr, "seed": seed, "dir": str(out),
            "machines": run_dir.machines(conf) if conf else [], "kinds": run_dir.kinds(conf) if conf else [],
            "code": run_dir.codes(conf) if conf else [],
            "status": runs.state(cfg), spec.metric: summary.get(spec.metric),
            spec.final_valid[0]: summary.get(spec.final_valid[0]), "steps": steps,
            "train_time_s": summary.get("train_time_s"),
            "s_per_update": summary["train_time_s"] / steps if finished and steps else None,
            "loss_spikes": summary.get("loss_spikes"), "max_grad_norm": summary.get("max_grad_norm"),
            **({"message": summary["message"]} if summary.get("status") == "diverged" else {}),
            "command": _command(task, cfg)}


def _command(task: str, cfg: Any) -> str:
    """The run's own ``skiplab train`` command (:func:`report.train_command` with its seed filled in)."""
    command = report.train_command(task, cfg).replace(" --seed K ", f" --seed {cfg.seed} ", 1)
    return command.removesuffix("K") + str(cfg.seed)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def aggregate(records: list[dict[str, Any]], metric: str, valid: str) -> list[dict[str, Any]]:
    """One row per design x depth x lr, in the records' order (the module's formulas)."""
    cells: dict[tuple[str, int, float], list[dict[str, Any]]] = {}
    for r in records:
        cells.setdefault((r["connection"], r["depth"], r["lr"]), []).append(r)
    rows = []
    for (conn, depth, lr), rs in cells.items():
        done = [r for r in rs if r["status"] == "finished" and r.get(metric) is not None]
        summary = stats.summary([r[metric] for r in done])
        rows.append({"connection": conn, "depth": depth, "lr": lr, "runs": len(rs),
                     "finished": sum(r["status"] == "finished" for r in rs),
                     "diverged": sum(r["status"] == "diverged" for r in rs),
                     "n": summary["n"], "mean": summary["mean"], "std": summary["std"],
                     "valid_mean": _mean([r[valid] for r in done if r.get(valid) is not None]),
                     "s_per_update": _mean([r["s_per_update"] for r in done if r.get("s_per_update") is not None]),
                     **_watched(rs)})
    return rows


def paired(rows: list[dict[str, Any]], records: list[dict[str, Any]], spec: Any,
           reference: dict[str, Any] | None) -> dict[str, Any]:
    """Each row's paired difference to the first design at its depth and lr, block by block (block k: seed k;
    skiplab.analysis.blocks), written into the rows (``delta``, ``ci_low``, ``ci_high``, ``pairs``, ``p_paired``,
    ``p_holm`` with Holm's correction over every row of the sweep that has a paired p, ``stalled``); returns what
    the table's header says: the baseline, the runs left without a same-machine pair, the blocks' machines."""
    first = rows[0]["connection"] if rows else ""
    value = lambda r: r.get(spec.metric)  # noqa: E731
    level = reference["value"] if reference else None
    unpaired, machines = [], set()
    for depth, lr in dict.fromkeys((r["depth"], r["lr"]) for r in rows):
        mine = [r for r in records if r["depth"] == depth and r["lr"] == lr]
        recs = [blocks.RunRecord(r["connection"], r["seed"], r["status"], value(r), tuple(r["machines"]),
                                 kinds=tuple(r.get("kinds", ()))) for r in mine]
        machines |= {m for r in mine for m in r["machines"]}
        order = list(dict.fromkeys(r["connection"] for r in mine))
        stats_, header = blocks.summarise(recs, order, first, spec.higher_is_better, level, spec.stall_margin)
        unpaired += [f"{u} at depth {depth}, lr {lr:g}" for u in header["unpaired"]]
        for s in stats_:
            row = next(r for r in rows if (r["connection"], r["depth"], r["lr"]) == (s["label"], depth, lr))
            row.update({k: s[k] for k in ("delta", "ci_low", "ci_high", "pairs", "p_paired", "p_wilcoxon", "stalled",
                                          "failed")})
            if math.isnan(row["delta"]):
                row["delta"] = None
    family = [None if r.get("failed") else r.get("p_paired") for r in rows]  # failures are not findings
    for row, p in zip(rows, blocks.holm(family)):
        row["p_holm"] = p
    kind = one_kind([r for r in records if r.get("kinds")])
    codes = Counter(" + ".join(r["code"]) for r in records if r.get("code"))  # a run resumed on other code: "a + b"
    return {"baseline": first, "unpaired": unpaired, "machines": sorted(machines), "kind": kind, "codes": dict(codes),
            "holm_m": sum(p is not None for p in family), "blocks": len({r["seed"] for r in records}),
            "failed": [f"{r['connection']} at depth {r['depth']}, lr {r['lr']:g}" for r in rows if r.get("failed")]}


def one_kind(records: list[dict[str, Any]], here: str | None = None,
             advice: str = "give each kind its own --out and --runs") -> str | None:
    """The one kind of machine of the runs (``kinds`` of each record; ``here``: the kind of runs left to train),
    or a one-line error naming each kind's number of runs and ``advice``."""
    counts: dict[str, int] = {}
    for r in records:
        kind = " + ".join(r["kinds"])
        counts[kind] = counts.get(kind, 0) + 1
    if here is not None:
        counts.setdefault(here, 0)
    if len(counts) > 1:
        listed = "; ".join(f"{n} run{'s' if n != 1 else ''} on {k}" if n else f"runs to train here on {k}"
                           for k, n in counts.items())
        raise ValueError(f"a sweep's runs are of different kinds of machine ({listed}): one paired analysis pools "
                         f"one kind; {advice}")
    return next(iter(counts), None)


def check_kinds(task: str, base: Any, points: list[Point], seeds: int, root: Path) -> None:
    """Refuse (:func:`one_kind`) a sweep whose runs already there, and this machine where runs are left to train,
    are of more than one kind of machine."""
    there, left = [], False
    for p in points:
        for k in range(1, seeds + 1):
            cfg = _seeded(task, p, k, root)
            path = Path(cfg.out) / "config.json"
            if path.is_file():
                there.append({"kinds": run_dir.kinds(run_dir.read_json(path))})
            if runs.state(cfg) in ("partial", "missing"):
                left = True
    here = None
    if left:
        env, device = host.environment(), str(pick_device(getattr(base, "device", "cpu")))
        here = host.machine_kind(env, device, bool(getattr(base, "amp", False)) and device.startswith("cuda"))
    one_kind(there, here)


def _watched(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Over a cell's runs with per-step telemetry (finished or diverged): loss spikes summed, the largest gradient
    norm (None where no run has telemetry)."""
    seen = [r for r in records if r.get("loss_spikes") is not None]
    return {"loss_spikes": sum(r["loss_spikes"] for r in seen) if seen else None,
            "max_grad_norm": max(r["max_grad_norm"] for r in seen) if seen else None}


def stability(rows: list[dict[str, Any]], higher_is_better: bool = False) -> list[dict[str, Any]]:
    """Per design x depth (in the rows' order): the best lr and the highest stable lr (the module's formulas)."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["connection"], r["depth"]), []).append(r)
    out = []
    for (conn, depth), rs in groups.items():
        stable = sorted((r for r in rs if r["runs"] and r["finished"] == r["runs"] and r["mean"] is not None),
                        key=lambda r: r["lr"])
        sign = -1 if higher_is_better else 1
        best = min(stable, key=lambda r: sign * r["mean"]) if stable else None  # min keeps the first (smallest lr)
        out.append({"connection": conn, "depth": depth, "best_lr": best["lr"] if best else None,
                    "best_mean": best["mean"] if best else None, "best_std": best["std"] if best else None,
                    "highest_stable_lr": stable[-1]["lr"] if stable else None,
                    "diverged": sum(r["diverged"] for r in rs), "runs": sum(r["runs"] for r in rs)})
    return out


# ---- the command ------------------------------------------------------------------------------------------
# what a sweep's table does not depend on, or varies itself: where the data and the runs are, the device, the seed
# and what the axes set (the model spec's connection and depth, the lr)
NOT_SETTINGS = ("out", "device", "seed", "model", "lr", "data_dir", "train_file", "valid_file", "test_file",
                "train_prefix", "valid_prefix", "test_prefix")


def changed_settings(stored: dict[str, Any], now: dict[str, Any]) -> str:
    """The settings of the config ``now`` other than those of the sweep whose config ``stored`` (sweep.json's) is,
    in words (``max_steps 6, not 7``); "" where none differs (or ``stored`` is empty: a table of before)."""
    now = json.loads(json.dumps(now))  # tuples as sweep.json holds them
    return ", ".join(f"{k} {stored[k]!r}, not {now[k]!r}" for k in sorted(set(stored) & set(now))
                     if k not in NOT_SETTINGS and stored[k] != now[k])


def sweep(task: str, base: Any, connections: tuple[str, ...], depths: tuple[Any, ...], lrs: tuple[Any, ...] = (),
          seeds: int = 2, jobs: int = 1, progress: bool = True, argv: list[str] | None = None,
          runs_dir: str = "", overwrite: bool = False) -> dict[str, Any]:
    """Train what the sweep needs under ``base.out`` (missing runs only, ``jobs`` side by side), score the finished
    runs, write sweep.json, .md, .csv and the figures, print the table; return what sweep.json holds. The runs
    live in ``runs_dir`` (default ``OUT/runs``): two sweeps given one share the runs they both need. A sweep.json
    there already is replaced only by a sweep that keeps each of its designs, depths, lrs and seeds, or with
    ``overwrite`` (:func:`skiplab.run_dir.check_table_kept`)."""
    spec = get_task(task)
    if seeds < 1 or jobs < 1:
        raise ValueError(f"--seeds and --jobs must be >= 1, got {seeds} and {jobs}")
    out = Path(base.out)
    root = Path(runs_dir) if runs_dir else out / "runs"
    points, axes = plan(task, base, connections, depths, lrs)
    run_dir.check_not_a_run(out, "a sweep")
    if (out / "sweep.json").is_file():  # a sweep's table there: kept unless this one holds all it holds
        # both as sweep.json holds them (lists, JSON's numbers), the seeds as a list of seeds
        as_json = lambda a: json.loads(json.dumps({**a, "seeds": list(range(1, a.get("seeds", 0) + 1))}))  # noqa: E731
        table = run_dir.read_json(out / "sweep.json")
        run_dir.check_table_kept(out / "sweep.json", as_json(table.get("axes", {})), as_json({**axes, "seeds": seeds}),
                                 overwrite)
        changed = changed_settings(table.get("config", {}), dataclasses.asdict(base))
        if changed and not overwrite:
            raise run_dir.RunDirError(f"{out} holds the table of a sweep with other settings ({changed}); give "
                                      "another --out, or --overwrite to replace that table (its runs stay)")
    check_kinds(task, base, points, seeds, root)  # before the data are made
    run_dir.note_made(out), run_dir.note_made(root)  # removed where nothing is written in them (run_dir.let_go)
    base = spec.shared_data(base, root, progress)  # e.g. the LM corpus tokenised once for every run
    points, axes = plan(task, base, connections, depths, lrs)
    check_kinds(task, base, points, seeds, root)
    # block by block: seed k of every cell (the first design's, each cell's baseline, first) before seed k + 1
    needed = [(task, _seeded(task, p, k, root)) for k in range(1, seeds + 1) for p in points]
    t0 = time.time()
    done = {s: sum(runs.state(c) == s for _, c in needed) for s in STATUSES}
    print(f"sweep: {len(points)} cells x {seeds} seed(s) = {len(needed)} runs ({done['finished']} finished, "
          f"{done['diverged']} diverged already)")
    runs.train_missing(needed, workers=jobs, progress=progress, then=runs.score_run)  # each scored in its worker

    unscored = [c for _, c in needed if runs.state(c) == "finished"
                and spec.metric not in run_dir.read_json(Path(c.out) / "summary.json")]
    for cfg in tqdm(unscored, desc="score", unit="run", disable=not progress or not unscored):
        spec.score(cfg, run_dir.read_json(Path(cfg.out) / "summary.json"), False)
    records = [record(task, p, k, _seeded(task, p, k, root)) for p in points for k in range(1, seeds + 1)]
    rows = aggregate(records, spec.metric, spec.final_valid[0])
    reference = next((spec.reference(c) for _, c in needed if runs.state(c) == "finished"), None)
    pairing = paired(rows, records, spec, reference)
    result = {
        "task": task, "metric": spec.metric, "metric_label": spec.metric_label,
        "higher_is_better": spec.higher_is_better, "valid": list(spec.final_valid),
        "depth_options": list(spec.depth_options),
        "model": base.model, "data": spec.describe_data(base),
        "length": f"{base.epochs} epochs" if getattr(base, "epochs", 0) else f"{base.max_steps} steps",
        "config": dataclasses.asdict(base), "axes": {**axes, "seeds": seeds}, "runs": records, "rows": rows,
        "stability": stability(rows, spec.higher_is_better),
        "reference": reference, "pairing": pairing,
        "command": "skiplab sweep " + " ".join(shlex.quote(a) for a in (argv or [task, "--out", str(out)])),
        "train_time_s": sum(runs.train_time(c) for _, c in needed), "wall_time_s": time.time() - t0,
        "environment": host.environment(),
    }
    out.mkdir(parents=True, exist_ok=True)
    run_dir.write_json(out / "sweep.json", result)
    (out / "sweep.md").write_text(sweep_report.markdown(result))
    (out / "sweep.csv").write_text(sweep_report.csv(result))
    figures = [sweep_report.depth_figure(result, out / "depth.png")]
    if len(axes["lrs"]) > 1:
        figures.append(sweep_report.lr_figure(result, out / "lr.png"))
    curves = _curves(task, points, result["stability"], seeds, root)
    figures.append(sweep_report.curves_figure(result, curves, _curve_key(spec), spec.x, out / "curves.png"))
    print(sweep_report.markdown(result, brief=True))
    print(f"wrote {', '.join(str(p) for p in [out / 'sweep.md', out / 'sweep.csv', out / 'sweep.json', *figures])}")
    return result


def _curve_key(spec: Any) -> str:
    """The validation loss where the task records one, else its last curve."""
    return next((k for k in spec.curves if k.startswith("valid")), spec.curves[-1])


def _curves(task: str, points: list[Point], stable: list[dict[str, Any]], seeds: int,
            root: Path) -> dict[int, dict[str, list[list[dict[str, Any]]]]]:
    """depth -> design -> the metrics records of each finished seed at the design's best lr at that depth."""
    best = {(s["connection"], s["depth"]): s["best_lr"] for s in stable}
    out: dict[int, dict[str, list[list[dict[str, Any]]]]] = {}
    for p in points:
        if best.get((p.connection, p.depth)) != p.lr:
            continue
        cfgs = [_seeded(task, p, k, root) for k in range(1, seeds + 1)]
        out.setdefault(p.depth, {})[p.connection] = [run_dir.read_metrics(Path(c.out)) for c in cfgs
                                                     if runs.state(c) == "finished"]
    return out
