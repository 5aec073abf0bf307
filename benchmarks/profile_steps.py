"""Where a design's extra step time goes, operator by operator, and how much of it moves from round to round: the
training step of each design profiled (torch.profiler, CPU) beside its baseline's, the models interleaved round by
round, per operator the median self CPU time a step over the rounds and its spread (max − min over the rounds).

Two cases, as the CPU goals of docs/performance.md take them:
  r56  PreAct-ResNet-56, SGD, a batch of 128 32×32 images: 2xSkip+LN, 2rSkip+LN and SAS against 1xSkip
  hc   a 4-layer gpt-small decoder at d = 768 (heads of 64, FFN 4d), AdamW, 8×256 tokens: HC(n=4) and mHC(n=4)
       against PreLN (eager)

For each design: its median step time over the rounds (the profiled steps' wall-clock) and its ratio to the
baseline's, then the operators whose median self time differs most from the baseline's (Δ, ms a step), each with its
spread over the rounds for both. A spread as large as a Δ says that the operator's time moves from round to round by
as much as the design adds: the ratio then settles no goal in one run. ``--out DIR`` writes ``profile.md`` and
``profile.json`` (the machine, load, torch version and threads in both). glibc's malloc keeps what a step frees for the
next step, as in a skiplab run (``skiplab.host.keep_freed_memory``; ``--system-malloc``: glibc's defaults); recorded.

Usage: python benchmarks/profile_steps.py [--cases r56,hc] [--rounds 5] [--steps 2] [--threads 2] [--top 12]
                                           [--system-malloc] [--out DIR] [--small]
       (--small: tiny shapes, seconds; for the tests)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from skiplab import host
from skiplab.bench.steps import build, image_step, lm_step
from skiplab.bench.suite import machine_name

CASES = {
    "r56": ("1xSkip", ("2xSkip+LN", "2rSkip+LN", "SAS")),
    "hc": ("PreLN", ("HC", "mHC")),
}


def steps_of(case: str, small: bool) -> dict[str, callable]:
    """One training step per design of ``case`` (the baseline first), each with its own model and optimiser."""
    base, designs = CASES[case]
    g = torch.Generator().manual_seed(0)
    out = {}
    if case == "r56":
        rows, size = (4, 8) if small else (128, 32)
        batch = torch.randn(rows, 3, size, size, generator=g), torch.randint(0, 10, (rows,), generator=g)
        for d in (base, *designs):
            out[d] = image_step(build("preact-resnet20" if small else "preact-resnet56", connection=d), batch)
    else:
        width, rows, context = (64, 2, 16) if small else (768, 8, 256)
        tokens = torch.randint(0, 257, (rows, context + 1), generator=g)
        batch = tokens[:, :-1], tokens[:, 1:]
        shape = dict(vocab_size=257, d_model=width, heads=max(1, width // 64), ffn_dim=4 * width, layers=4,
                     context=context)
        for d in (base, *designs):
            out[d] = lm_step(build(f"gpt-small(connection={d})", **shape), batch)
    return out


def profiled(step, steps: int) -> tuple[float, dict[str, float]]:
    """(wall-clock seconds a step, operator -> self CPU seconds a step) over ``steps`` profiled steps."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        wall = (time.perf_counter() - start) / steps
    ops: dict[str, float] = {}
    for e in prof.key_averages():
        ops[e.key] = ops.get(e.key, 0.0) + e.self_cpu_time_total / 1e6 / steps
    return wall, ops


def run_case(case: str, rounds: int, steps: int, top: int, small: bool) -> dict:
    base, designs = CASES[case]
    cases = steps_of(case, small)
    for step in cases.values():  # warm-up: first-call allocations, oneDNN primitive caches
        step()
    walls: dict[str, list[float]] = {d: [] for d in cases}
    ops: dict[str, list[dict[str, float]]] = {d: [] for d in cases}
    for _ in range(rounds):
        for d, step in cases.items():
            wall, table = profiled(step, steps)
            walls[d].append(wall)
            ops[d].append(table)

    def stats(d: str, op: str) -> tuple[float, float]:
        values = [r.get(op, 0.0) for r in ops[d]]
        return statistics.median(values), max(values) - min(values)

    rows = []
    for d in designs:
        names = set().union(*ops[d], *ops[base])
        diffs = []
        for op in names:
            (m, s), (mb, sb) = stats(d, op), stats(base, op)
            diffs.append({"op": op, "design_ms": m * 1e3, "design_spread_ms": s * 1e3, "baseline_ms": mb * 1e3,
                          "baseline_spread_ms": sb * 1e3, "delta_ms": (m - mb) * 1e3})
        diffs.sort(key=lambda r: -abs(r["delta_ms"]))
        step_d, step_b = statistics.median(walls[d]), statistics.median(walls[base])
        rows.append({"design": d, "step_ms": step_d * 1e3, "ratio": step_d / step_b,
                     "ratio_per_round": [a / b for a, b in zip(walls[d], walls[base])],
                     "self_total_ms": sum(statistics.median([r.get(op, 0.0) for r in ops[d]]) for op in names) * 1e3,
                     "ops": diffs[:top]})
    return {"case": case, "baseline": base, "baseline_step_ms": statistics.median(walls[base]) * 1e3,
            "baseline_rounds_ms": [w * 1e3 for w in walls[base]], "designs": rows}


def markdown(result: dict) -> str:
    lines = [f"# Step profiles: {result['machine']}", "",
             f"torch {result['torch']}, code {result.get('code', 'unknown')}"
             + (", tiny shapes (--small: a test of the script, not a measurement)" if result.get("small") else "")
             + f", {result['threads']} thread(s), {result['rounds']} interleaved rounds of "
             f"{result['steps']} profiled steps; {result['load_start']} at the start, {result['load_end']} at the end; "
             f"malloc: {'freed memory kept' if (result.get('malloc') or {}).get('kept') else 'the system defaults'}.",
             ""]
    for c in result["cases"]:
        lines += [f"## {c['case']}: against {c['baseline']} ({c['baseline_step_ms']:.0f} ms a step; rounds "
                  + ", ".join(f"{v:.0f}" for v in c["baseline_rounds_ms"]) + " ms)", ""]
        for d in c["designs"]:
            lines += [f"**{d['design']}**: {d['step_ms']:.0f} ms a step, {d['ratio']:.3f}x (per round "
                      + ", ".join(f"{r:.3f}" for r in d["ratio_per_round"]) + ")", "",
                      "| operator | Δ ms a step | design ms (spread) | baseline ms (spread) |", "|---|---|---|---|"]
            lines += [f"| `{o['op']}` | {o['delta_ms']:+.1f} | {o['design_ms']:.1f} ({o['design_spread_ms']:.1f}) | "
                      f"{o['baseline_ms']:.1f} ({o['baseline_spread_ms']:.1f}) |" for o in d["ops"]]
            lines.append("")
    return "\n".join(lines)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} CPUs)"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="r56,hc")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=2, help="profiled steps a round")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=12, help="operators listed a design")
    p.add_argument("--system-malloc", action="store_true", help="glibc's defaults, not a skiplab run's setting")
    p.add_argument("--out", default="", help="a folder for profile.md and profile.json")
    p.add_argument("--small", action="store_true", help="tiny shapes (seconds): the test's")
    args = p.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad or not cases:
        p.error(f"--cases: unknown {bad[0]!r}; known: {', '.join(CASES)}" if bad else "--cases: give at least one")
    if args.rounds < 2 or args.steps < 1:
        p.error("--rounds must be >= 2 (a spread needs two) and --steps >= 1")
    out = Path(args.out) if args.out else None
    if out is not None and (out / "profile.json").exists():
        p.error(f"{out / 'profile.json'} exists; give another --out")
    torch.set_num_threads(args.threads)
    if not args.system_malloc:
        host.keep_freed_memory()
    result = {"machine": machine_name(), "torch": torch.__version__, "code": host.code_name(host.environment()),
              "threads": args.threads, "rounds": args.rounds,
              "steps": args.steps, "small": args.small, "load_start": load(), "malloc": host.malloc_settings()}
    result["cases"] = [run_case(c, args.rounds, args.steps, args.top, args.small) for c in cases]
    result["load_end"] = load()
    text = markdown(result)
    print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "profile.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / "profile.md").write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
