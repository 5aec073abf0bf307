"""The key/value cache's speed-up (the bench's "256 new tokens: recomputing the prefix / cached" row) at each
thread count, side by side: tests whether a second thread helps recomputing the prefix (a growing batch of
positions) but not the batch-1 cached step (one position per call, where per-call overhead weighs most). Also
times one forward of a single token, the floor under a cached step's cost, and profiles it at the last thread
count: the share of its time in the linear layers' matrix-vector products (aten::addmm) and the rate at which
those read their weights. The figures in docs/performance.md.

Usage: python benchmarks/lm_cache_threads.py [MODEL] [NEW_TOKENS] [THREADS ...]   default gpt-small 256 1 2
"""

import sys

import torch
from torch.profiler import profile

from skiplab.bench.steps import build
from skiplab.bench.timing import interleaved
from skiplab.models.generate import generate

spec = sys.argv[1] if len(sys.argv) > 1 else "gpt-small"
new = int(sys.argv[2]) if len(sys.argv) > 2 else 256
threads = [int(t) for t in sys.argv[3:]] or [1, 2]
model = build(f"{spec}(connection=PreLN)", vocab_size=257, context=new + 1).eval()
one = torch.tensor([[0]])
with torch.no_grad():
    cases = {"cached": lambda: generate(model, [0], new, temperature=0),
             "recompute": lambda: generate(model, [0], new, temperature=0, cache=False),
             "forward, 1 token": lambda: model(one)}
    for n in threads:
        torch.set_num_threads(n)
        t = interleaved(cases, 3, 1)
        print(f"{spec}, {new} new tokens, {n} thread(s): cached {t['cached']:.3f} s ({new / t['cached']:,.0f} "
              f"tokens/s, {t['cached'] / new * 1e3:.2f} ms a token), recompute {t['recompute']:.3f} s; "
              f"recompute / cached = {t['recompute'] / t['cached']:.3f}x; "
              f"forward of 1 token {t['forward, 1 token'] * 1e3:.2f} ms")

    calls = 20
    with profile() as prof:
        for _ in range(calls):
            model(one)
    ops = {e.key: e for e in prof.key_averages()}
    total = sum(e.self_cpu_time_total for e in ops.values())
    addmm = ops["aten::addmm"].self_cpu_time_total
    weights = sum(m.weight.numel() * m.weight.element_size() for m in model.modules()
                  if isinstance(m, torch.nn.Linear) and m.bias is not None)  # the ones that run as addmm
    print(f"{threads[-1]} thread(s), a 1-token forward under the profiler: {total / calls / 1e3:.2f} ms, of which "
          f"aten::addmm {100 * addmm / total:.1f}% ({ops['aten::addmm'].count // calls} calls a forward); the "
          f"biased linear layers' weights, {weights / 1e6:.2f} MB, read at {weights * calls / addmm / 1e3:.2f} GB/s")
