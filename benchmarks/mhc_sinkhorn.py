"""mHC's Sinkhorn-Knopp projection: autograd through the plain loop (the (..., n, n) layout, as skiplab had it
before) against skiplab's ``sinkhorn`` (hand-written backward, (n, n, positions) layout), alone and inside the
gpt-small mHC training step, side by side with the PreLN and HC steps (docs/performance.md).

Usage: OMP_NUM_THREADS=1 python benchmarks/mhc_sinkhorn.py [REPEATS]
"""

import sys

import torch

from skiplab.bench.steps import build, lm_step
from skiplab.bench.timing import interleaved
from skiplab.connections import hyper

torch.set_num_threads(1)
repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
fast = hyper.sinkhorn


def looped(logits: torch.Tensor, iters: int = 20) -> torch.Tensor:
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iters):
        m = m / m.sum(-2, keepdim=True)
        m = m / m.sum(-1, keepdim=True)
    return m


def using(fn, step):
    def run():
        hyper.sinkhorn = fn
        try:
            return step()
        finally:
            hyper.sinkhorn = fast
    return run


# one sub-layer's projection at the gpt-small shape: 16 x 256 positions, n = 4
logits = torch.randn(16, 256, 4, 4, requires_grad=True)
grad = torch.randn(16, 256, 4, 4)
alone = {name: (lambda f=f: f(logits, 20).backward(grad)) for name, f in (("loop", looped), ("sinkhorn", fast))}
t = interleaved(alone, 10 * repeats, 2)
print(f"Sinkhorn forward + backward, 16x256 positions, n = 4, 20 iterations: loop {1e3 * t['loop']:.1f} ms, "
      f"sinkhorn {1e3 * t['sinkhorn']:.1f} ms ({t['loop'] / t['sinkhorn']:.1f}x faster)")

tokens = torch.randint(0, 257, (16, 257), generator=torch.Generator().manual_seed(0))
batch = tokens[:, :-1], tokens[:, 1:]
mhc = build("gpt-small(connection=mHC)", vocab_size=257)
steps = {"PreLN": lm_step(build("gpt-small(connection=PreLN)", vocab_size=257), batch),
         "HC": lm_step(build("gpt-small(connection=HC)", vocab_size=257), batch),
         "mHC, loop": using(looped, lm_step(mhc, batch)), "mHC, sinkhorn": using(fast, lm_step(mhc, batch))}
t = interleaved(steps, repeats, 1)
for name, seconds in t.items():
    print(f"gpt-small step, {name}: {seconds:.3f} s, {seconds / t['PreLN']:.3f}x PreLN")
