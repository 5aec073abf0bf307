"""Does compiling 2rSkip+LN's connection alone make PreAct-ResNet-56's eager step cheaper? (docs/performance.md)

The connection's chain h₁ = s + F, y₁ = GN₁(h₁), y = GN₂(s + y₁) (Eq. 4, GroupNorm with one group written out as
(h − μ)·(σ² + ε)^(−1/2)·w + b) through ``torch.compile`` (inductor's loops, forward and backward), the rest of the
model eager; timed against the eager connection and 1xSkip, the three models interleaved (10 rounds, the median
of the last 8; compiling happens in the first). Self-contained: `PYTHONPATH=. python benchmarks/compiled_chain_r56.py
[--dynamic]` (default: a kernel per shape; --dynamic: inductor's shape-generic kernels after the second shape).
"""
import statistics, sys, time, types
import torch
import torch.nn.functional as F
import torch._dynamo
import skiplab
from skiplab.connections.recursive import RecursiveSkip
from skiplab.models import build_model, model_config

torch._dynamo.config.recompile_limit = 64


def chain(s, f, weights, biases, eps):
    h, y = s + f, None
    for i, (w, b) in enumerate(zip(weights, biases)):
        var, mu = torch.var_mean(h, dim=(1, 2, 3), correction=0, keepdim=True)
        y = (h - mu) * torch.rsqrt(var + eps) * w.view(1, -1, 1, 1) + b.view(1, -1, 1, 1)
        if i + 1 < len(weights):
            h = s + y
    return y


compiled = torch.compile(chain, fullgraph=True, dynamic=None if "--dynamic" in sys.argv else False)


def forward(self, x, branch, skip=None):
    s = x if skip is None else skip(x)
    return compiled(s, branch(x), [n.weight for n in self.norms], [n.bias for n in self.norms], self.norms[0].eps)


designs = ["1xSkip", "2rSkip+LN", "2rSkip+LN compiled"]
torch.manual_seed(0)
models = {d: build_model(model_config("preact-resnet56", connection=d.split()[0])).train() for d in designs}
for m in models["2rSkip+LN compiled"].modules():
    if isinstance(m, RecursiveSkip):
        m.forward = types.MethodType(forward, m)
# the same function: one step's loss and gradients against the eager connection's, same weights
twin = models["2rSkip+LN compiled"]
twin.load_state_dict(models["2rSkip+LN"].state_dict())
g = torch.Generator().manual_seed(0)
x = torch.randn(128, 3, 32, 32, generator=g); y = torch.randint(0, 10, (128,), generator=g)
for m in (models["2rSkip+LN"], twin):
    m.zero_grad(); F.cross_entropy(m(x), y).backward()
grads = [(a.grad - b.grad).abs().max().item() for a, b in zip(models["2rSkip+LN"].parameters(), twin.parameters())]
print(f"largest gradient difference, compiled against eager connection: {max(grads):.2e}")
opts = {d: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9) for d, m in models.items()}
times = {d: [] for d in designs}
for i in range(10):
    for d, m in models.items():
        t = time.perf_counter()
        loss = F.cross_entropy(m(x), y); opts[d].zero_grad(); loss.backward(); opts[d].step()
        if i >= 2: times[d].append(time.perf_counter() - t)
med = {d: statistics.median(v) for d, v in times.items()}
print(skiplab.__file__, torch.get_num_threads(), "threads:",
      " ".join(f"{d} {med[d]/med['1xSkip']:.3f}x" for d in designs), f"(1xSkip {med['1xSkip']*1e3:.0f} ms)")
