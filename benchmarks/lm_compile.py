"""gpt-small PreLN training step, torch.compile'd against eager, side by side (the figure in docs/performance.md).

Usage: OMP_NUM_THREADS=1 python benchmarks/lm_compile.py
"""

import time

import torch

from skiplab.bench.steps import build, lm_step
from skiplab.bench.timing import interleaved

torch.set_num_threads(1)
tokens = torch.randint(0, 257, (16, 257), generator=torch.Generator().manual_seed(0))
batch = tokens[:, :-1], tokens[:, 1:]
eager = build("gpt-small(connection=PreLN)", vocab_size=257)
model = build("gpt-small(connection=PreLN)", vocab_size=257)
start = time.time()
compiled = lm_step(model, batch, forward=torch.compile(model))
compiled(), compiled()
print(f"compile: {time.time() - start:.0f} s")
t = interleaved({"eager": lm_step(eager, batch), "compiled": compiled}, 3, 1)
print(f"eager {t['eager']:.3f} s, compiled {t['compiled']:.3f} s per step: compiled / eager = {t['compiled'] / t['eager']:.3f}")
