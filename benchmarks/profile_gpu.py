"""Where a design's compiled step spends the time its goal does not allow: torch.profiler traces of the GPU bench's
training step (GPT-2 124M, bf16 autocast, compiled per layer, fused AdamW: ``skiplab/bench/gpu.py``) for PreLN and
each design named with ``--designs`` or found above its goal in a ``bench.json`` the bench wrote (``--from-bench``).

Written to ``--out``: per design a Chrome trace, ``trace-<design>.json.gz`` (Perfetto or chrome://tracing open it),
and in ``profile.md`` / ``profile.json`` its step's wall-clock, device and host time, and the kernels that take the
most device time, each beside PreLN's kernel of the same name (inductor names a fused kernel after what it fuses,
so a design's own work shows as kernels PreLN has not). With these a design that misses because the compiler
cannot fuse its work (a Sinkhorn loop, a softmax over depth) is read against numbers before any kernel is written.

On a CPU (the test suite) the same runs at the bench's smoke size, with the host's operators in place of kernels.

Usage: python benchmarks/profile_gpu.py (--designs mHC,PreLN+AttnRes | --from-bench BENCH_JSON) [--steps 2]
                                        [--top 15] [--budget 240] --out DIR
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import shutil
import tempfile
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from skiplab.bench.gpu import GOALS, GPU_DESIGNS, SMOKE, GpuSizes, bench_batch, first_steps, skiplab_trainer, sync
from skiplab.bench.steps import build
from skiplab.bench.suite import environment, machine_name


def missed(bench: dict) -> list[str]:
    """The designs whose step row in a GPU bench's ``bench.json`` is above its goal (``GOALS``, else 1.10x), in the
    bench's order; a row that is not a number (out of memory, not reached) is not one of them."""
    out = []
    for row in bench.get("rows", []):
        name, value = row.get("name", ""), row.get("value")
        design = name[: -len(" step")] if name.endswith(" step") else ""
        if design in GPU_DESIGNS and isinstance(value, (int, float)) and math.isfinite(value) \
                and value > GOALS.get(design, 1.10):
            out.append(design)
    return out


def slug(design: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", design).strip("-")


def profiled(g: GpuSizes, design: str, batch, steps: int, device: torch.device, out: Path) -> dict:
    """``steps`` profiled steps of ``design``'s compiled trainer after its compile and warm-up; its trace written
    to ``out``, its summary returned (per step: wall-clock, device and host time, and every event's times)."""
    trainer = skiplab_trainer(g, design, batch, compiled=True)
    first = first_steps(trainer, device, g.warmup)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            trainer()
        sync(device)
        wall = (time.perf_counter() - start) / steps
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(out / f"trace-{slug(design)}.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    events = {}
    for e in prof.key_averages():
        kernel = e.device_type != DeviceType.CPU  # a kernel on the card; the host's operators launch them
        events[e.key] = {"kernel": kernel, "calls": e.count / steps,
                         "device_ms": (e.self_device_time_total if kernel else 0.0) / 1e3 / steps,
                         "host_ms": (0.0 if kernel else e.self_cpu_time_total) / 1e3 / steps}
    del trainer
    return {"design": design, "wall_ms": wall * 1e3, "graph_breaks": first["graph_breaks"],
            "device_ms": sum(v["device_ms"] for v in events.values()),
            "host_ms": sum(v["host_ms"] for v in events.values()), "events": events,
            "trace": f"trace-{slug(design)}.json.gz"}


def markdown(result: dict, top: int) -> str:
    cuda = result["device"] == "cuda"
    what = "device" if cuda else "host"
    base = result["profiles"][0]
    lines = [f"# Compiled step profiles: {result['machine']}", "",
             f"{result['shape']}; {result['steps']} profiled steps after the compile and warm-up; code "
             f"{result['environment'].get('git_commit')}; times a step. Kernels by {what} time"
             + ("" if cuda else " (no card: the host's operators)") + ".", ""]
    for p in result["profiles"]:
        ratio = p["wall_ms"] / base["wall_ms"]
        lines += [f"## {p['design']}: {p['wall_ms']:.1f} ms a step ({ratio:.3f}x PreLN), device {p['device_ms']:.1f} ms, "
                  f"host {p['host_ms']:.1f} ms; {p['graph_breaks']} graph breaks; [{p['trace']}]({p['trace']})", "",
                  f"| kernel | {what} ms a step | calls | PreLN's ({what} ms) |", "|---|---|---|---|"]
        key = "device_ms" if cuda else "host_ms"
        ranked = sorted(((k, v) for k, v in p["events"].items() if v["kernel"] == cuda), key=lambda kv: -kv[1][key])
        for name, v in ranked[:top]:
            theirs = base["events"].get(name)
            lines.append(f"| `{name[:90]}` | {v[key]:.2f} | {v['calls']:g} | "
                         f"{'' if theirs is None else f'{theirs[key]:.2f}'} |")
        lines.append("")
    if result["not_reached"]:
        lines.append(f"Not reached within {result['budget_s']:.0f} s: {', '.join(result['not_reached'])}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--designs", default="", help="designs to profile beside PreLN, comma-separated")
    p.add_argument("--from-bench", default="", help="a GPU bench's bench.json: its designs above their goals")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--budget", type=float, default=240.0, help="seconds after which no design is started")
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true", help="replace a profile in --out (its traces removed first)")
    args = p.parse_args(argv)
    designs = [d.strip() for d in args.designs.split(",") if d.strip()]
    if args.from_bench:
        try:
            bench = json.loads(Path(args.from_bench).read_text())
        except (OSError, ValueError) as e:
            p.error(f"--from-bench: cannot read {args.from_bench}: {e}")
        designs += [d for d in missed(bench) if d not in designs]
    unknown = [d for d in designs if d not in GPU_DESIGNS and d != "PreLN"]
    if unknown:
        p.error(f"not a design of the GPU bench: {', '.join(unknown)}")
    if args.steps < 1 or args.top < 1:
        p.error("--steps and --top must be at least 1")
    out = Path(args.out)
    old = [f for pattern in ("profile.json", "profile.md", "trace-*.json.gz") for f in out.glob(pattern)]
    if old and not args.overwrite:
        p.error(f"{out} holds a profile ({', '.join(sorted(f.name for f in old)[:3])}, ...); give another --out, or "
                "--overwrite to replace it")
    for f in old:  # a replaced profile leaves none of its traces beside the new report
        f.unlink()
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = GpuSizes() if device.type == "cuda" else SMOKE
    base = build(f"{g.model}(connection=PreLN)", **g.config()).cfg
    batch = bench_batch(g.rows, base.context, base.vocab_size, device)
    started, profiles, skipped = time.perf_counter(), [], []
    result = {"machine": machine_name(), "environment": environment(), "device": device.type, "steps": args.steps,
              "shape": f"{g.model} ({'the bench' if device.type == 'cuda' else 'smoke'} size), {g.rows}x{base.context} "
                       f"tokens", "budget_s": args.budget, "profiles": profiles, "not_reached": skipped}
    for design in ["PreLN"] + [d for d in designs if d != "PreLN"]:
        if profiles and time.perf_counter() - started > args.budget:
            skipped.append(design)
            continue
        profiles.append(profiled(g, design, batch, args.steps, device, out))
        print(f"[profile] {design}: {profiles[-1]['wall_ms']:.1f} ms a step", flush=True)
        write(result, out, args.top)  # each design's as it is measured: a run cut short keeps what it had
    write(result, out, args.top)
    return result


def write(result: dict, out: Path, top: int) -> None:
    (out / "profile.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "profile.md").write_text(markdown(result, top))


if __name__ == "__main__":
    main()
