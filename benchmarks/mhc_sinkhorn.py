"""mHC's Sinkhorn-Knopp projection: autograd through the plain loop (the (..., n, n) layout, as skiplab had it
before) against skiplab's ``sinkhorn`` as operators (hand-written backward, (n, n, positions) layout) and as the CPU
kernel (``kernels/sinkhorn.c``, where it can run), alone and inside the gpt-small mHC training step, side by side
with the PreLN and HC steps (docs/performance.md).

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


def looped(logits: torch.Tensor, iters: int = 20, kernel: bool = False) -> torch.Tensor:
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
def operators(logits: torch.Tensor, iters: int = 20, kernel: bool = False) -> torch.Tensor:
    return fast(logits, iters)


def kernel(logits: torch.Tensor, iters: int = 20, kernel: bool = False) -> torch.Tensor:
    return fast(logits, iters, kernel=True)


forms = [("loop", looped), ("sinkhorn", operators)]
if hyper.sinkhorn_kernel.usable(logits):
    forms.append(("kernel", kernel))
alone = {name: (lambda f=f: f(logits, 20).backward(grad)) for name, f in forms}
t = interleaved(alone, 10 * repeats, 2)
print("Sinkhorn forward + backward, 16x256 positions, n = 4, 20 iterations: "
      + ", ".join(f"{name} {1e3 * t[name]:.2f} ms ({t['loop'] / t[name]:.1f}x faster than loop)" for name, _ in forms))

tokens = torch.randint(0, 257, (16, 257), generator=torch.Generator().manual_seed(0))
batch = tokens[:, :-1], tokens[:, 1:]
mhc = build("gpt-small(connection=mHC)", vocab_size=257)
steps = {"PreLN": lm_step(build("gpt-small(connection=PreLN)", vocab_size=257), batch),
         "HC": lm_step(build("gpt-small(connection=HC)", vocab_size=257), batch),
         **{f"mHC, {name}": using(f, lm_step(mhc, batch)) for name, f in forms}}
t = interleaved(steps, repeats, 1)
for name, seconds in t.items():
    print(f"gpt-small step, {name}: {seconds:.3f} s, {seconds / t['PreLN']:.3f}x PreLN")
