"""PreAct-ResNet-56 training step of each design / 1xSkip, side by side (10 rounds, median of the last 8).

Self-contained so that it runs on any commit of skiplab: `PYTHONPATH=<checkout> python benchmarks/resnet56_design_steps.py`
(docs/results/bench/before_after.txt holds its output at 447cef2 and after the fused connections).

glibc's malloc is left at its defaults (the goals' figures in docs/performance.md were taken so); `--run-malloc` sets it
as a skiplab training run does (skiplab.host.keep_freed_memory: what a step frees kept for the next step), where the
checkout has it. The output line ends with the setting.
"""
import argparse, statistics, sys, time, torch
import torch.nn.functional as F
import skiplab
from skiplab.models import build_model, model_config
p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--run-malloc", action="store_true", help="malloc set as a skiplab training run sets it")
args = p.parse_args()
kept = None
if args.run_malloc:
    try:
        from skiplab.host import keep_freed_memory
        kept = keep_freed_memory()
    except ImportError:  # a commit before skiplab.host had it
        pass
designs = ["1xSkip", "2xSkip+LN", "2rSkip+LN", "SAS"]
torch.manual_seed(0)
models = {d: build_model(model_config("preact-resnet56", connection=d)).train() for d in designs}
opts = {d: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9) for d, m in models.items()}
g = torch.Generator().manual_seed(0)
x = torch.randn(128, 3, 32, 32, generator=g); y = torch.randint(0, 10, (128,), generator=g)
times = {d: [] for d in designs}
for i in range(10):
    for d, m in models.items():
        t = time.perf_counter()
        loss = F.cross_entropy(m(x), y); opts[d].zero_grad(); loss.backward(); opts[d].step()
        if i >= 2: times[d].append(time.perf_counter() - t)
med = {d: statistics.median(v) for d, v in times.items()}
print(skiplab.__file__, " ".join(f"{d} {med[d]/med['1xSkip']:.3f}x" for d in designs), f"(1xSkip {med['1xSkip']*1e3:.0f} ms)",
      "malloc: freed memory kept" if kept else "malloc: glibc's defaults")
