"""Compute-matched comparisons: every design given the same training budget, in updates, FLOPs or seconds.

A design that costs more per update (SAS's gates, hyper-connections' streams) gets as much as the baseline in the
quantity held fixed, and so fewer updates where it costs more (``compare --budget``):

    updates:  S_v = S                                    every design the config's --max-steps (the default)
    flops:    S_v = round(S · F_0 / F_v)                 F: training FLOPs per token, counted
    time:     S_v = round(S · t_0 / t_v)                 t: seconds per update, measured on this machine

where S is ``--max-steps`` and 0 the baseline (the first variant). F is what ``torch.utils.flop_counter`` counts
in one training step of the design (forward and backward matrix products, :mod:`skiplab.models.flops`) divided by
the step's tokens. t_v / t_0 is the median ratio of ``rounds`` pairs of training steps of the design and the
baseline on one random batch of the config's shape, taken in turns (so a change in the machine's load touches
both), after one step each to warm up. The warm-up and every other setting stay the baseline's; the learning-rate
schedule ends at each design's own S_v. The plan is written once to ``OUT/budget.json`` and read back by every
later call (the time ratios are this machine's; a comparison resumed elsewhere keeps them).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

from .. import host, run_dir
from ..models.flops import counted_flops
from .variants import Variant

BUDGETS = ("updates", "flops", "time")


def check(task: Any, base: Any, budget: str) -> None:
    """An error where ``budget`` is unknown, or the task's runs are not counted in updates or cannot be probed."""
    if budget not in BUDGETS:
        raise ValueError(f"--budget {budget!r}: choose one of {', '.join(BUDGETS)}")
    if budget != "updates" and (not hasattr(base, "max_steps") or getattr(base, "epochs", 0)
                                or not task.probes):
        raise ValueError(f"--budget {budget}: the {task.name} task's runs are not counted in updates (--max-steps) "
                         "with a step skiplab can measure; only --budget updates applies")


def flops_per_token(task: Any, cfg: Any) -> float:
    """Training FLOPs per token of ``cfg``'s model, counted over one step (forward and backward products) of one
    example: the count per token does not depend on the batch, so a large model is not run on a whole batch."""
    step, tokens = task.probe_step(dataclasses.replace(cfg, batch_size=1) if hasattr(cfg, "batch_size") else cfg)
    return counted_flops(step) / tokens


def time_ratio(task: Any, base: Any, cfg: Any, rounds: int = 5) -> float:
    """Median over ``rounds`` of (seconds of a step of ``cfg``) / (seconds of a step of ``base``), in turns."""
    a, _ = task.probe_step(base)
    b, _ = task.probe_step(cfg)
    a(), b()  # warm up: first-call allocations
    ratios = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        a()
        t1 = time.perf_counter()
        b()
        ratios.append((time.perf_counter() - t1) / (t1 - t0))
    return statistics.median(ratios)


def plan(task: Any, base: Any, variants: list[Variant], budget: str, root: Path) -> dict[str, dict[str, Any]]:
    """label -> {"flops_per_token": F_v (None where the task has no probe step), "max_steps": S_v and
    "time_ratio": t_v / t_0 (budget time)}: the module's formulas. A flops or time plan is written to
    ``root/budget.json`` and read from it when it holds this budget, --max-steps and these variants."""
    check(task, base, budget)
    path = root / "budget.json"
    labels = [v.label for v in variants]
    if budget != "updates" and path.is_file():
        stored = run_dir.read_json(path)
        if stored.get("budget") == budget and stored.get("max_steps") == base.max_steps \
                and set(labels) <= set(stored["variants"]):
            return {k: stored["variants"][k] for k in labels}
    cfgs = {v.label: dataclasses.replace(base, **v.changes) for v in variants}
    first = cfgs[labels[0]]
    out: dict[str, dict[str, Any]] = {}
    for label, cfg in cfgs.items():
        entry: dict[str, Any] = {"flops_per_token": flops_per_token(task, cfg) if task.probes else None}
        if budget == "time":
            entry["time_ratio"] = 1.0 if label == labels[0] else time_ratio(task, first, cfg)
        out[label] = entry
    if budget == "updates":  # nothing changes: every design trains the config's own length
        return out
    for label, entry in out.items():
        factor = {"flops": (out[labels[0]]["flops_per_token"] or 0) / (entry["flops_per_token"] or 1),
                  "time": 1.0 / entry.get("time_ratio", 1.0)}[budget]
        entry["max_steps"] = max(1, round(base.max_steps * factor))
        warmup = getattr(base, "warmup", 0)
        if entry["max_steps"] <= warmup:
            raise ValueError(f"--budget {budget}: {label} would train {entry['max_steps']} updates, not past the "
                             f"{warmup} warm-up updates; give a larger --max-steps")
    root.mkdir(parents=True, exist_ok=True)
    run_dir.write_json(path, {"budget": budget, "max_steps": base.max_steps, "baseline": labels[0],
                              "variants": out, "environment": host.environment()})
    return out


def describe(budget: str, base: Any, plan_: dict[str, dict[str, Any]], baseline: str, root: Path) -> str:
    """The line a table's header gives its budget (a time budget names the machine budget.json was measured on)."""
    path = root / "budget.json"
    machine = host.machine_name(run_dir.read_json(path).get("environment", {})) if path.is_file() else ""
    if budget == "updates":
        epochs = getattr(base, "epochs", 0)
        return f"budget: equal length ({epochs:,} epochs each)" if epochs else \
            f"budget: equal updates ({base.max_steps:,} each)"
    if budget == "flops":
        return (f"budget: equal training FLOPs, {baseline}'s {base.max_steps:,} updates × its "
                f"{plan_[baseline]['flops_per_token'] / 1e6:.2f} MFLOP per token (counted); updates per design below")
    return (f"budget: equal wall-clock on {machine or 'the machine that planned it'}, {baseline}'s {base.max_steps:,} "
            "updates × its seconds per update (step-time ratios measured in turns, budget.json); updates per design below")
