"""SAS's own forward and backward, fused (``gated_norm_sum``: the sum, the norm and their backward in one
autograd node) against the same formula left to autograd (``gated_sum`` of α·x, β·F and γ·LN(x + F)), interleaved
round by round.

The connection alone, on PreAct-ResNet-56's three stage shapes at a batch of 128 (conv layout, one-group GroupNorm),
the branch's output given: what the fusion changes is memory traffic, which a whole training step's convolutions
hide in their own round-to-round spread (benchmarks/profile_steps.py). Per shape: the median time of each form over
the rounds and the median of the per-round ratios fused / plain.

Usage: python benchmarks/sas_fused.py [--rounds 30] [--threads 1] [--out FILE] [--small]  (--small: tiny, for tests)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import skiplab
from skiplab import host
from skiplab.bench.suite import machine_name
from skiplab.connections import fused, sas

SHAPES = ((128, 16, 32, 32), (128, 32, 16, 16), (128, 64, 8, 8))


def plain(a, s, b, f, g, norm):
    """The formula with autograd's own backward: SAS as it ran before the fusion."""
    return fused.gated_sum((a, s), (b, f), (g, norm(s + f)))


def time_forms(shape: tuple[int, ...], rounds: int) -> dict:
    """Seconds of one forward and backward of SAS at ``shape``, fused and plain, in ``rounds`` interleaved rounds."""
    torch.manual_seed(0)
    conn = skiplab.connection("SAS", shape[1], "conv")
    x, fx = torch.randn(shape, requires_grad=True), torch.randn(shape, requires_grad=True)
    forms = {"fused": fused.gated_norm_sum, "plain": plain}
    times: dict[str, list[float]] = {k: [] for k in forms}
    real = sas.gated_norm_sum
    try:
        for r in range(rounds + 1):  # the first round warms up and is dropped
            for name, form in forms.items():
                sas.gated_norm_sum = form
                start = time.perf_counter()
                y = conn(x, lambda _: fx)
                y.backward(torch.ones_like(y))
                if r:
                    times[name].append(time.perf_counter() - start)
    finally:
        sas.gated_norm_sum = real
    ratios = [f / p for f, p in zip(times["fused"], times["plain"])]
    return {"shape": list(shape), **{f"{k}_ms": 1e3 * statistics.median(v) for k, v in times.items()},
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, help="also write the table to this file (refused if it exists)")
    ap.add_argument("--small", action="store_true", help="tiny shapes, for the tests")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if args.out is not None and args.out.exists():
        ap.error(f"{args.out} exists; give another --out")
    torch.set_num_threads(args.threads)
    shapes = ((4, 3, 4, 4),) if args.small else SHAPES
    rows = [time_forms(s, args.rounds) for s in shapes]
    lines = [f"# SAS fused / plain: {machine_name()}; {args.rounds} rounds; torch {torch.__version__}, code "
             f"{host.code_name(host.environment())}"
             + ("; tiny shapes (--small: a test of the script, not a measurement)" if args.small else ""), "",
              "| shape | fused ms | plain ms | fused / plain (min-max) |", "|---|---|---|---|"]
    lines += [f"| {'x'.join(map(str, r['shape']))} | {r['fused_ms']:.1f} | {r['plain_ms']:.1f} | "
              f"{r['ratio']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f}) |" for r in rows]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return rows


if __name__ == "__main__":
    main()
