"""``skiplab bench``: what the designs and the engine cost on this machine, as ratios measured side by side.

Groups (each a function of the sizes, returning table rows):

- machine:   float32 matmul rate (FLOP/s) and element-wise add bandwidth (bytes/s): the two ceilings
- image:     PreAct-ResNet training step of each design / the plain residual 1xSkip; what a design adds,
             counted in element-wise add passes over every block's output (its memory-traffic floor)
- mt:        Transformer training step of each design / PostLN, beside its FLOP ratio (SAS's gates are
             matmuls); the depth-wise LSTM model too
- engine:    skiplab's Transformer / ``torch.nn.Transformer`` of the same shape; cached beam search /
             recomputing the prefix; achieved training FLOP/s / the matmul rate; padding share of token
             batches; LayerNorm / RMSNorm forward + backward on the same input
- lm:        decoder-only training step of each design / PreLN; skiplab's PreLN decoder / one of ``torch.nn``
             layers of the same shape; achieved FLOP/s / the matmul rate; cached generation / recomputing
             the prefix; tokens per second of training and of generation
- compile:   ``torch.compile``d / eager training step, both families, with compile times
- processes: 2 processes (DDP, gloo, half the threads each) / 1 process, same global batch
- caption:   Transformer captioner's training step of each design / PostLN (pixels through its trunk); cached
             beam search / recomputing the prefix over images
- hyper:     hyper-connections' training step, ``HC(n=4)`` and ``mHC(n=4)`` / PreLN, at two widths (d = 256 and 768),
             eager and ``torch.compile``d (docs/performance.md, "hyper-connections at their cost")
- depth:     the designs that mix or scale across depth (DenseFormer, MUDD, Attention Residuals, the speedrun's
             scalars, LAuReL, Keel, nGPT): training step / PreLN at d = 768, eager and compiled, with their goals
- gpu:       GPT-2 124M on one card: tokens/s, MFU and memory of compiled PreLN, transformers' GPT-2 on the same
             batch, every design's step / PreLN's (:mod:`skiplab.bench.gpu`; smoke size on a CPU). Run by default
             only where CUDA is; ``--out auto`` writes ``docs/results/bench/<card>-<date>/``

``--quick`` runs every group on tiny shapes (about 90 s on 2 cores; CI checks every row is produced, not the values). The groups
live in :mod:`.designs` (each design's cost) and :mod:`.engine` (the engine and the machine), their sizes and designs
in :mod:`.shapes`, the GPU group in :mod:`.gpu`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from .. import host
from ..config import count, parse_list
from .designs import caption, depth, hyper, image, lm, mt
from .engine import compiled, engine, machine, processes
from .gpu import gpu
from .shapes import QUICK, Sizes
from .timing import Row, markdown

GROUPS: dict[str, Callable[[Sizes, dict], list[Row]]] = {
    "machine": machine, "image": image, "mt": mt, "lm": lm, "engine": engine, "compile": compiled,
    "processes": processes, "hyper": hyper, "depth": depth, "caption": caption, "gpu": gpu}


def default_groups() -> tuple[str, ...]:
    """Every group, but ``gpu`` only where there is a card to measure."""
    return tuple(g for g in GROUPS if g != "gpu" or torch.cuda.is_available())


def auto_out(root: str = "docs/results/bench") -> str:
    """``root/<card or cpu>-<date>``: the card's (or CPU's) name in lower case, runs of other characters as '-'."""
    import re

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else host.processor()
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-")
    return f"{root}/{slug}-{time.strftime('%Y-%m-%d')}"


def machine_name() -> str:
    """The CPU model and its kernels' instruction set (and GPU, where there is one) the numbers were measured on."""
    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return (f"{host.processor()} ({torch.backends.cpu.get_cpu_capability()}), {os.cpu_count()} cores, "
            f"{torch.get_num_threads()} threads{gpu}; torch {torch.__version__}")


def run(quick: bool = False, groups: tuple[str, ...] | None = None, out: str | None = None,
        data_dir: str | None = None, threads: int = 0, progress: bool = True, gpu_budget_s: float = 0.0,
        overwrite: bool = False) -> list[Row]:
    """Run ``groups`` (machine first: the others read its rates; default :func:`default_groups`) with ``threads``
    torch threads (0: torch's choice), print the table; with ``out`` (``auto``: :func:`auto_out`), write
    ``bench.md`` and ``bench.json`` there, again after every group and every row of the gpu group. A record
    already in ``out`` is replaced only with ``overwrite``."""
    groups = default_groups() if groups is None else groups
    if not groups:
        raise ValueError(f"--groups names no group; known: {', '.join(GROUPS)} (leave it out for all)")
    if not (math.isfinite(gpu_budget_s) and gpu_budget_s >= 0):
        raise ValueError(f"--gpu-budget must be a finite number of seconds >= 0 (0: the default), got {gpu_budget_s:g}")
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ValueError(f"unknown benchmark group(s) {', '.join(unknown)}; known: {', '.join(GROUPS)}")
    out = auto_out() if out == "auto" else out
    if out and (taken := next((p for p in (Path(out), *Path(out).parents) if p.exists() and not p.is_dir()), None)):
        raise ValueError(f"--out {out}: {taken} is a file, not a folder")  # said before the minutes of measuring
    if out and not overwrite and any(Path(out, f).exists() for f in ("bench.md", "bench.json")):
        raise ValueError(f"{out} holds a benchmark record (bench.md, bench.json) already: give another --out, or "
                         "--overwrite to replace it")
    if threads:
        torch.set_num_threads(threads)
    host.keep_freed_memory()  # as a skiplab run does: a step's freed memory kept for the next (glibc)
    sz = QUICK if quick else Sizes()
    smoke_gpu = "gpu" in groups and not quick and not torch.cuda.is_available()
    sizes = "quick" if quick else "full" + ("; the gpu group at smoke size (no CUDA card)" if smoke_gpu else "")
    env = environment()  # once: the code and machine the run began with, in both files however long it runs
    header = f"Measured on {machine_name()}; sizes: {sizes}; code {host.code_name(env)}."
    rows: list[Row] = []
    # the record so far, after every group (a run cut short keeps what it measured, marked incomplete); where it
    # replaces a record, beside it (bench.partial.*) until the run completes, so an interrupted run loses nothing
    stem = "bench.partial" if out and any(Path(out, f).exists() for f in ("bench.md", "bench.json")) else "bench"
    done: list[str] = []
    so_far = lambda partial: write(out, header, quick, sz, rows + partial, stem, groups, done, env)  # noqa: E731
    ctx: dict = {"data_dir": data_dir, "quick": quick, "gpu_budget_s": gpu_budget_s,
                 "emit": lambda partial: so_far(partial) if out else None}
    needed = {"machine", *groups} | ({"mt"} if "engine" in groups else set())
    for name in [g for g in GROUPS if g in needed]:
        if progress:
            print(f"[bench] {name} ...", flush=True)
        start = time.perf_counter()
        got = GROUPS[name](sz, ctx)
        if progress:
            print(f"[bench] {name}: {time.perf_counter() - start:.0f} s", flush=True)
        if name in groups:
            rows += got
            done.append(name)
            if out and len(done) < len(groups):
                so_far([])
    if out:
        write(out, header, quick, sz, rows, "bench", groups, done, env)
        for f in ("bench.partial.md", "bench.partial.json"):
            Path(out, f).unlink(missing_ok=True)
    print(markdown(rows, header + "\n"))
    return rows


def write(out: str, header: str, quick: bool, sz: Sizes, rows: list[Row], stem: str = "bench",
          groups: tuple[str, ...] = (), done: list[str] | None = None, env: dict | None = None) -> None:
    """``out``/<stem>.md and <stem>.json: the rows so far, the machine, the sizes, the environment (``env``: the one
    the run began in; else now's); a record of fewer groups than asked (``done`` of ``groups``) says it is
    incomplete, in both files. A value not measured (NaN, shown "-" in the table) is null in the JSON, which has no
    NaN."""
    done = list(groups) if done is None else done
    complete = all(g in done for g in groups)
    if not complete:
        header += (f"\n\n**Incomplete**: groups {', '.join(done) or 'none'} of {', '.join(groups)} measured so far "
                   "(the run was stopped, or is still running).")
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, f"{stem}.md").write_text(markdown(rows, header + "\n"))
    Path(out, f"{stem}.json").write_text(json.dumps({"machine": machine_name(), "quick": quick, "sizes": asdict(sz),
                                                     "complete": complete, "groups": list(groups), "measured": done,
                                                     "environment": env or environment(),
                                                     "rows": [_strict(asdict(r)) for r in rows]}, indent=2,
                                                    allow_nan=False) + "\n")


def _strict(row: dict) -> dict:
    """``row`` with a float that is not finite (a value not measured) as None: JSON has no NaN."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def environment() -> dict:
    """skiplab's run environment (versions, CPU, card, commit) and, where there is a card, its driver and CUDA."""
    env = host.environment()
    if torch.cuda.is_available():
        env["cuda_version"] = torch.version.cuda
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            env["driver"] = None
    return env


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``skiplab bench``; the parser runs :func:`command`."""
    p.add_argument("--quick", action="store_true", help="tiny shapes: every row, about 90 s on 2 cores (what CI runs)")
    p.add_argument("--groups", type=parse_list, default=None,
                   help=f"comma-separated groups to run (default: all; gpu only where CUDA is): {', '.join(GROUPS)}")
    p.add_argument("--out", default="", help="also write bench.md and bench.json into this directory "
                                             "('auto': docs/results/bench/<card or cpu>-<date>)")
    p.add_argument("--data-dir", default="../shared/data/multi30k",
                   help="Multi30k files for the padding-share row (synthetic lengths where absent)")
    p.add_argument("--threads", type=count(0), default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--gpu-budget", type=float, default=0.0, metavar="SECONDS",
                   help="the gpu group starts no new design after this many seconds (default 0: 270 on a card, "
                        "none at the CPU's smoke size)")
    p.add_argument("--overwrite", action="store_true", help="replace a bench.md and bench.json already in --out")
    p.set_defaults(func=command)


def command(args: argparse.Namespace) -> None:
    """``skiplab bench``."""
    run(quick=args.quick, groups=None if args.groups is None else tuple(args.groups), out=args.out or None,
        data_dir=args.data_dir, threads=args.threads, gpu_budget_s=args.gpu_budget, overwrite=args.overwrite)
