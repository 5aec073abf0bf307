"""Same-config training steps repeated in one process, compared to the bit, one component at a time: where two runs
of one config part. Each repeat seeds, builds the model, and makes ``--steps`` updates on fixed random batches
(forward, backward, clipping, AdamW); each component's result (logits, gradients, clipped gradients, weights) is
hashed and compared with the first repeat's, and the first that differs is named; the first repeat's final
weights' digest is printed, to compare separate processes. ``--gemm`` also compares the
model's matrix products computed by MKL on one thread and on every thread (whether this CPU's kernels split a
product's sum by thread), and MKL's dynamic thread choice on and off.

The threads come from the environment (``OMP_NUM_THREADS``), not from ``torch.set_num_threads`` (which turns MKL's
dynamic thread choice off): ``--settings default`` runs as a process left alone does; ``--settings run`` applies
what a skiplab run applies (:func:`skiplab.host.fix_threads`) first. ``--load N`` keeps N busy processes
beside it (a loaded machine).

Usage: OMP_NUM_THREADS=2 python benchmarks/determinism.py [--model gpt-mini(layers=3,connection=PostLN)]
           [--repeats 4] [--steps 3] [--batch-size 8] [--settings default|run] [--load 0] [--gemm]
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import time

import torch
import torch.nn.functional as F

from skiplab.host import fix_threads, thread_settings
from skiplab.models import build_model, model_config


def digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha1()
    for t in tensors:
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def repeat(mcfg, batches: list[torch.Tensor], seed: int) -> list[tuple[int, str, str]]:
    """One repeat's (step, component, digest) in order."""
    torch.manual_seed(seed)
    model = build_model(mcfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    params = list(model.parameters())
    trace = []
    for s, b in enumerate(batches):
        logits = model(b[:, :-1])
        trace.append((s, "forward", digest([logits])))
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(logits.float().transpose(1, 2), b[:, 1:]).backward()
        trace.append((s, "backward", digest([p.grad for p in params])))
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        trace.append((s, "clip", digest([p.grad for p in params])))
        opt.step()
        trace.append((s, "step", digest(params)))
    return trace


def gemm_check(mcfg, batch: int) -> None:
    """The model's products (forward x W^T, the weight gradient g^T x) on 1 thread and on all, MKL's dynamic
    choice on and off; printed: which agree bitwise."""
    rows, d, f = batch * mcfg.context, mcfg.d_model, mcfg.ffn_dim
    g = torch.Generator().manual_seed(0)
    shapes = {"x W_qkv^T": ((rows, d), (d, 3 * d)), "x W_ffn^T": ((rows, d), (d, f)),
              "grad W_ffn (g^T x)": ((f, rows), (rows, d)), "grad W_qkv (g^T x)": ((3 * d, rows), (rows, d))}
    mats = {k: (torch.randn(*a, generator=g), torch.randn(*b, generator=g)) for k, (a, b) in shapes.items()}
    n = torch.get_num_threads()
    first = {k: a @ b for k, (a, b) in mats.items()}  # as the repeats ran (--settings default: MKL chooses)
    torch.set_num_threads(1)
    one = {k: a @ b for k, (a, b) in mats.items()}
    torch.set_num_threads(n)  # MKL's dynamic choice off
    fixed = {k: a @ b for k, (a, b) in mats.items()}
    for k in mats:
        print(f"gemm {k} {tuple(shapes[k][0])}x{tuple(shapes[k][1])}: 1 thread == {n} fixed: "
              f"{torch.equal(one[k], fixed[k])}; as the repeats had it == {n} fixed: {torch.equal(first[k], fixed[k])}")


def spin() -> None:
    while True:
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt-mini(layers=3,connection=PostLN)")
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=4)
    p.add_argument("--settings", choices=("default", "run"), default="default")
    p.add_argument("--load", type=int, default=0)
    p.add_argument("--gemm", action="store_true")
    a = p.parse_args()
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(a.load)]
    for s in spinners:
        s.start()
    if a.settings == "run":
        fix_threads()
    mcfg = model_config(a.model, vocab_size=257)
    print(f"{a.model}, batch {a.batch_size}, {a.steps} steps, settings {a.settings}, {a.load} busy processes; "
          f"{thread_settings()}; load average {os.getloadavg()[0]:.1f}", flush=True)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, mcfg.vocab_size, (a.batch_size, mcfg.context + 1), generator=g)
               for _ in range(a.steps)]
    reference = repeat(mcfg, batches, a.seed)
    differ = 0
    for r in range(1, a.repeats):
        t0 = time.time()
        trace = repeat(mcfg, batches, a.seed)
        first = next(((x[0], x[1]) for x, y in zip(reference, trace) if x != y), None)
        differ += first is not None
        print(f"repeat {r}: " + ("identical" if first is None else f"differs first at step {first[0]}, {first[1]}")
              + f" ({time.time() - t0:.1f} s, load average {os.getloadavg()[0]:.1f})", flush=True)
    print(f"{differ} of {a.repeats - 1} repeats differ from the first; the first's weights: {reference[-1][2][:16]}")
    if a.gemm:  # last: it sets the thread count, which turns MKL's dynamic choice off
        gemm_check(mcfg, a.batch_size)
    for s in spinners:
        s.terminate()


if __name__ == "__main__":
    main()
