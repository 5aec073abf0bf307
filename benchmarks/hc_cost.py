"""Hyper-connections at their cost: the training step (forward, backward, AdamW) of a decoder with ``HC(n=4)`` and
``mHC(n=4)`` against the same decoder with ``PreLN``, eager and ``torch.compile``d, at two widths, the cases
interleaved (:func:`skiplab.bench.timing.interleaved`), each ratio the median step time over PreLN's in the same run:
wall-clock time, and the thread's CPU time beside it (on a loaded machine the process is also descheduled, which the
second leaves out; memory contention with other processes stays in both).

With ``--before FILE`` (an older ``skiplab/connections/hyper.py``, e.g. written out by
``git show COMMIT:skiplab/connections/hyper.py > /tmp/hyper_before.py``) the HC and mHC models are timed a second
time with that file's classes in place of the current ones, on the same parameters (the classes keep the same
parameters and state dict), so the rows before and after the change come from one interleaved run. The figures in
docs/performance.md ("hyper-connections at their cost") take FILE from ``git show 3e8aee3~1:skiplab/connections/hyper.py``.

With ``--before-mix FILE`` (an older ``skiplab/connections/hyper_mix.py``) the same models run a second time with
that file's read, write and projection in place of the current ones (the rows ``HC mix before``, ``mHC mix before``),
interleaved likewise: ``git show efb6f33~1:skiplab/connections/hyper_mix.py > /tmp/hyper_mix_before.py`` gives the
read whose h₀ was a strided view of the product. Eager only (``--modes eager``): compiled, both files trace to the
same plain expressions and the second model reuses the first one's graph.

With ``--kernel-off`` the HC and mHC models run a second time with their CPU kernels turned off (``kernel = None``:
the read and write of ``hyper_mix``'s batched products; rows ``HC no kernel``, ``mHC no kernel``), interleaved
likewise; the ``mix before`` rows run without the kernels too, as their file's read and write are what they time.

With ``--sinkhorn-off`` mHC runs a second time with its Sinkhorn–Knopp as operators and its other kernels on (row
``mHC eager sinkhorn``; ``sinkhorn_kernel = False``), interleaved likewise.

glibc's malloc keeps what a step frees for the next step, as in a skiplab run (``skiplab.host.keep_freed_memory``);
``--system-malloc`` leaves glibc's defaults (freed memory handed back to the system and paged in again).

Usage: python benchmarks/hc_cost.py [--before FILE] [--before-mix FILE] [--kernel-off] [--widths 256,768] [--rows 8]
                                    [--layers 4] [--repeats 5] [--modes eager,compiled] [--threads 1] [--sinkhorn-off]
                                    [--system-malloc]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import statistics
import sys
import time

import torch
import torch._dynamo

from skiplab import host
from skiplab.bench.steps import build, lm_step
from skiplab.bench.suite import machine_name
from skiplab.bench.timing import interleaved
from skiplab.connections import base, hyper, iter_connections

DESIGNS = ("PreLN", "HC", "mHC")


def load_before(path: str):
    """The module in ``path`` loaded as a sibling of skiplab.connections.hyper (its relative imports resolve), its
    classes kept out of the registry that builds connections by name."""
    saved = dict(base.REGISTRY)
    spec = importlib.util.spec_from_file_location("skiplab.connections._hyper_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        base.REGISTRY.clear()
        base.REGISTRY.update(saved)
    return module


def load_before_mix(path: str):
    """The module in ``path`` (an older hyper_mix.py) loaded beside skiplab.connections.hyper_mix."""
    spec = importlib.util.spec_from_file_location("skiplab.connections._hyper_mix_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def with_mix(step, module):
    """``step`` run with ``module`` as the hyper-connections' stream functions (hyper.py calls them through its
    module attribute ``hyper_mix``); the current ones are back after each call."""
    def run() -> None:
        current = hyper.hyper_mix
        hyper.hyper_mix = module
        try:
            step()
        finally:
            hyper.hyper_mix = current
    return run


def swapped(model: torch.nn.Module, module) -> torch.nn.Module:
    """A copy of ``model`` whose hyper-connections run ``module``'s classes of the same name."""
    model = copy.deepcopy(model)
    for _, conn in iter_connections(model):
        conn.__class__ = getattr(module, type(conn).__name__)
    return model


def kernel_off(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose connections run without their CPU kernels."""
    model = copy.deepcopy(model)
    for _, conn in iter_connections(model):
        conn.kernel = None
    return model


def sinkhorn_off(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose mHC connections run Sinkhorn-Knopp as operators, their other kernels on."""
    model = copy.deepcopy(model)
    for _, conn in iter_connections(model):
        conn.sinkhorn_kernel = False
    return model


def cpu_timed(step, into: list[float]):
    """``step``, appending the calling thread's CPU seconds of each call to ``into`` (one torch thread: all of it)."""
    def run() -> None:
        start = time.thread_time()
        step()
        into.append(time.thread_time() - start)
    return run


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} CPUs)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="", help="an older skiplab/connections/hyper.py to time beside this one")
    p.add_argument("--before-mix", default="", help="an older skiplab/connections/hyper_mix.py to time beside this one")
    p.add_argument("--kernel-off", action="store_true", help="HC and mHC a second time without their CPU kernels")
    p.add_argument("--widths", default="256,768")
    p.add_argument("--rows", type=int, default=8, help="sequences a step (of --context tokens)")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (interleaved) after one untimed")
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sinkhorn-off", action="store_true", help="mHC a second time, its Sinkhorn-Knopp as operators")
    p.add_argument("--system-malloc", action="store_true", help="glibc's defaults, not a skiplab run's setting")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    kept = None if args.system_malloc else host.keep_freed_memory()
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 16)
    before = load_before(args.before) if args.before else None
    before_mix = load_before_mix(args.before_mix) if args.before_mix else None
    print(f"# {machine_name()}")
    print(f"# malloc: {'freed memory kept (' + str(kept) + ')' if kept else 'the system defaults'}")
    print(f"# gpt-small shape, {args.layers} layers, {args.rows}x{args.context} tokens, heads of 64; "
          f"{args.repeats} interleaved rounds; {load()} at the start", flush=True)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 257, (args.rows, args.context + 1), generator=g)
    batch = tokens[:, :-1], tokens[:, 1:]
    for width in (int(w) for w in args.widths.split(",")):
        shape = dict(vocab_size=257, d_model=width, heads=max(1, width // 64), ffn_dim=4 * width, layers=args.layers,
                     context=args.context)
        models = {d: build(f"gpt-small(connection={d})", **shape) for d in DESIGNS}
        if before is not None:
            models.update({f"{d} before": swapped(models[d], before) for d in DESIGNS[1:]})
        mixed = {f"{d} mix before" for d in DESIGNS[1:]} if before_mix is not None else set()
        models.update({name: kernel_off(models[name.split()[0]]) for name in mixed})  # copied per mode below
        if args.kernel_off:
            models.update({f"{d} no kernel": kernel_off(models[d]) for d in DESIGNS[1:]})
        if args.sinkhorn_off:
            models["mHC eager sinkhorn"] = sinkhorn_off(models["mHC"])
        for mode in args.modes.split(","):
            steps, compile_s = {}, {}
            if mode == "compiled":
                # every model is a new entry in dynamo's cache for GPT.forward (its connections' types are guarded):
                # a fresh cache for each width, so that none falls back to eager at the recompile limit
                torch._dynamo.reset()
            for name, model in models.items():
                model = copy.deepcopy(model)  # each mode its own parameters and optimiser state
                if mode == "compiled":
                    start = time.perf_counter()
                    step = lm_step(model, batch, forward=torch.compile(model))
                    step()  # the first call compiles forward and backward
                    compile_s[name] = time.perf_counter() - start
                else:
                    step = lm_step(model, batch)
                steps[name] = with_mix(step, before_mix) if name in mixed else step
            cpu: dict[str, list[float]] = {name: [] for name in steps}
            t = interleaved({name: cpu_timed(step, cpu[name]) for name, step in steps.items()}, args.repeats, 1)
            c = {name: statistics.median(times[1:]) for name, times in cpu.items()}  # the first: the untimed round
            print(f"d = {width}, {mode}: PreLN step {t['PreLN'] * 1e3:.0f} ms (CPU {c['PreLN'] * 1e3:.0f} ms)",
                  flush=True)
            for name in steps:
                if name != "PreLN":
                    extra = f"; compiled in {compile_s[name]:.0f} s" if name in compile_s else ""
                    print(f"  {name:12s} {t[name] / t['PreLN']:.3f}x PreLN, CPU time {c[name] / c['PreLN']:.3f}x "
                          f"({t[name] * 1e3:.0f} ms{extra})", flush=True)
    print(f"# {load()} at the end")


if __name__ == "__main__":
    main()
