"""The tutorial's gradient-flow demo: how far a gradient travels back through 50 tanh layers.

The tutorial ("Layer Normalization and Residual Connections") stacks 50 blocks F(x) = tanh(x W + b) of
width 512 and compares the input gradient with and without residuals. Here every block is
``connection(spec)(h, F)``, so any design can be compared on the same weights and input. The printed
figure is mean |∂L/∂h_l| at the input of block l (l = 0 is the network input, l = depth its output).

The loss is a fixed random read-out L = Σ y ⊙ r, r ~ N(0, 1), rather than the tutorial's L = Σ y: the
sum of a LayerNorm's output over its features is the constant Σ b, so with Σ y every design that ends
in LN would show a zero gradient that says nothing about the network. With a random read-out the
gradient arriving at the output is the same for every design.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from .. import host
from ..config import check_bounds
from ..connections import connection

DESIGNS = ("NoSkip", "1xSkip", "2xSkip", "PostLN", "PreLN", "2xSkip+LN", "2rSkip+LN", "SAS")


@dataclass(frozen=True)
class GradientFlowConfig:
    """What the demo builds and measures."""

    designs: tuple[str, ...] = field(default=DESIGNS, metadata={"help": "connection specs, comma-separated"})
    depth: int = field(default=50, metadata={"min": 1, "help": "number of tanh blocks"})
    width: int = field(default=512, metadata={"min": 1, "help": "features per layer"})
    batch: int = field(default=16, metadata={"min": 1, "help": "random inputs averaged over (the tutorial uses 1)"})
    seed: int = field(default=0, metadata={"help": "seed for weights, inputs and read-out"})
    out: str = field(default="runs/gradient-flow", metadata={"help": "directory for the table, JSON and plot"})

    def __post_init__(self):
        check_bounds(self)
        if not self.designs:
            raise ValueError("give at least one connection spec")


class TanhStack(nn.Module):
    """``depth`` blocks h_{l+1} = conn_l(h_l, F_l), F_l(h) = tanh(h W_l + b_l) (the tutorial's network)."""

    def __init__(self, spec: str, depth: int, width: int):
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.connections = nn.ModuleList(connection(spec, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every block input h_0 .. h_depth (h_depth is the output), each retaining its gradient."""
        hs = [x]
        for linear, conn in zip(self.linears, self.connections):
            hs.append(conn(hs[-1], lambda h, lin=linear: torch.tanh(lin(h))))
        for h in hs[1:]:
            h.retain_grad()
        return hs


def measure(spec: str, cfg: GradientFlowConfig) -> list[float]:
    """Mean |∂L/∂h_l| for l = 0..depth. Weights, input and read-out depend on the seed only."""
    torch.manual_seed(cfg.seed)
    net = TanhStack(spec, cfg.depth, cfg.width)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    x = torch.randn(cfg.batch, cfg.width, generator=gen, requires_grad=True)
    readout = torch.randn(cfg.batch, cfg.width, generator=gen)
    hs = net(x)
    (hs[-1] * readout).sum().backward()
    return [h.grad.abs().mean().item() for h in hs]


def report_depths(depth: int) -> list[int]:
    """The columns of the table: input, a few depths, output."""
    return sorted({0, depth // 5, depth // 2, (4 * depth) // 5, depth})


def format_table(grads: dict[str, list[float]], depth: int) -> str:
    cols = report_depths(depth)
    head = ["connection"] + ["input" if c == 0 else "output" if c == depth else f"block {c}" for c in cols]
    rows = [[spec] + [f"{g[c]:.3e}" for c in cols] for spec, g in grads.items()]
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def plot(grads: dict[str, list[float]], cfg: GradientFlowConfig, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Left: every design on the full range. Right: the designs that keep the gradient near the
    # output's (within 100x), where exploding and vanishing lines would flatten the differences.
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, zoom in zip(axes, (False, True)):
        for i, (spec, g) in enumerate(grads.items()):
            t = torch.tensor(g, dtype=torch.float64)
            t[t <= 0] = float("nan")  # an exact zero (underflow) cannot be drawn on a log axis
            ratio = t / t[-1]
            if zoom and not bool(((ratio > 0.01) & (ratio < 100)).all()):
                continue
            ax.semilogy(range(len(g)), t.numpy(), label=spec, color=f"C{i}", marker="o", markersize=2)
        ax.set_xlabel("block l (0 = network input)")
        ax.set_ylabel("mean |∂L/∂h_l|")
        ax.set_title("designs within 100x of the output gradient" if zoom else "all designs")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, ncol=2)
    fig.suptitle(f"Gradient flow: {cfg.depth} tanh blocks, width {cfg.width}, batch {cfg.batch}, seed {cfg.seed}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


FILES = ("gradient_flow.md", "gradient_flow.json", "gradient_flow.png")


def run(cfg: GradientFlowConfig, overwrite: bool = False) -> dict[str, list[float]]:
    """Measure every design, print the table, and write table (its settings above it), JSON (config, seed, results,
    the machine and code version) and plot to ``cfg.out``; files already there are replaced only with
    ``overwrite``."""
    for spec in cfg.designs:  # fail on a bad spec before any work
        connection(spec, 1)
    out = Path(cfg.out)
    present = [out / f for f in FILES if (out / f).exists()]
    if present and not overwrite:
        raise FileExistsError(f"{present[0]} exists; use --overwrite to replace it")
    grads = {spec: measure(spec, cfg) for spec in tqdm(cfg.designs, desc="gradient flow", unit="design")}
    table = format_table(grads, cfg.depth)
    out.mkdir(parents=True, exist_ok=True)
    env = host.environment()
    head = (f"mean |dL/dh| at the input of block l; {cfg.depth} tanh blocks of width {cfg.width}, batch {cfg.batch}, "
            f"seed {cfg.seed}; {host.machine_name(env)}, torch {env['torch']}, code {host.code_name(env)}")
    (out / "gradient_flow.md").write_text(head + "\n\n" + table + "\n")
    record = {"config": dataclasses.asdict(cfg), "torch": torch.__version__, "grad_mean_abs": grads,
              "environment": env}
    (out / "gradient_flow.json").write_text(json.dumps(record, indent=2))
    plot(grads, cfg, out / "gradient_flow.png")
    print(head)
    print(table)
    print(f"wrote {out / 'gradient_flow.png'}, {out / 'gradient_flow.json'}, {out / 'gradient_flow.md'}")
    return grads
