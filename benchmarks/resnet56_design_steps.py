"""PreAct-ResNet-56 training step of each design / 1xSkip, side by side (10 rounds, median of the last 8).

Self-contained so that it runs on any commit of skiplab: `PYTHONPATH=<checkout> python benchmarks/resnet56_design_steps.py`
(docs/results/bench/before_after.txt holds its output at 447cef2 and after the fused connections).
"""
import statistics, sys, time, torch
import torch.nn.functional as F
import skiplab
from skiplab.models import build_model, model_config
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
print(skiplab.__file__, " ".join(f"{d} {med[d]/med['1xSkip']:.3f}x" for d in designs), f"(1xSkip {med['1xSkip']*1e3:.0f} ms)")
