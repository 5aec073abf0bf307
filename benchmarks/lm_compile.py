"""gpt-small training step, torch.compile'd against eager, side by side, for each connection named (default PreLN):
the figures in docs/performance.md. Every step time is also given relative to the first connection's eager step.

Usage: OMP_NUM_THREADS=1 python benchmarks/lm_compile.py [CONNECTION ...]   e.g.  PreLN HC mHC
"""

import sys
import time

import torch

from skiplab.bench.steps import build, lm_step
from skiplab.bench.timing import interleaved

torch.set_num_threads(1)
designs = sys.argv[1:] or ["PreLN"]
tokens = torch.randint(0, 257, (16, 257), generator=torch.Generator().manual_seed(0))
batch = tokens[:, :-1], tokens[:, 1:]
steps = {}
for d in designs:
    eager = build(f"gpt-small(connection={d})", vocab_size=257)
    model = build(f"gpt-small(connection={d})", vocab_size=257)
    start = time.time()
    compiled = lm_step(model, batch, forward=torch.compile(model))
    compiled(), compiled()
    print(f"{d}: compile {time.time() - start:.0f} s")
    steps[f"{d} eager"], steps[f"{d} compiled"] = lm_step(eager, batch), compiled
t = interleaved(steps, 3, 1)
base = t[f"{designs[0]} eager"]
for d in designs:
    e, c = t[f"{d} eager"], t[f"{d} compiled"]
    print(f"{d}: eager {e:.3f} s ({e / base:.3f}x {designs[0]} eager), compiled {c:.3f} s ({c / base:.3f}x); "
          f"compiled / eager = {c / e:.3f}")
