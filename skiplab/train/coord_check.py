"""The coordinate check of a language model's parametrisation: train a few steps at a list of widths and a list of
depths, and record how large the residual stream, the branches, the logits and their changes are after each step
(``skiplab analyze coord-check``; the verdicts and figures: :mod:`skiplab.analysis.coord_check`).

The check is how the field catches a broken parametrisation (Yang et al. 2022, Tensor Programs V, arXiv 2203.03466,
Appendix D.1, "coordinate check": the ``mup`` package's ``get_coord_data``; gpt-neox #956; OLMo-core's coord-check
test): where a parametrisation claims that what it tunes transfers across width (μP) or depth (depth-μP,
CompleteP), the size of every activation and of its change after t updates stays the same as the model grows;
where it does not (the standard parametrisation under Adam), the change grows with width.

For each point (width d at the base depth, or depth L at the base width) and seed, a fresh model of the spec,
d_head fixed (heads = d / d_head, ffn = 4d), trains ``steps`` AdamW updates (no weight decay, constant lr, the
parametrisation's groups: :mod:`skiplab.train.parametrization`; μP's base width is the smallest width, CompleteP's
base depth the smallest depth) on batches of uniform random tokens, and before the first update and after each one,
on one fixed probe batch in eval mode, it records (RMS = sqrt(mean of squares) over every entry):

    stream_rms         mean over the sub-layers of the RMS of the residual stream entering each
    branch_rms         mean over the sub-layers of the RMS of each branch's output F
    final_rms          RMS of what the final norm reads (the stack's output)
    logits_rms         RMS of the logits
    delta_final_rms    RMS of (the stack's output at step t − at step 0), on the probe batch
    delta_logits_rms   RMS of (the logits at step t − at step 0)

and per sub-layer the stream's and the branch's RMS (``stream_rms_by_layer``, ``branch_rms_by_layer``).
Hyper-connections' n streams are summed, as ``--log-layers`` takes them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from ..models import build_model, model_config
from . import parametrization
from .layer_telemetry import _streams, sublayers

QUANTITIES = ("stream_rms", "branch_rms", "final_rms", "logits_rms", "delta_final_rms", "delta_logits_rms")
AXES = ("width", "depth")


@dataclass(frozen=True)
class CoordCheckConfig:
    """One design under one parametrisation, checked across ``widths`` (at depth ``depths[0]``) and ``depths``
    (at width ``widths[0]``)."""

    connection: str = field(default="PreLN", metadata={"help": "the design's connection spec"})
    parametrization: str = field(default="standard", metadata={"help": "standard, mup or completep"})
    model: str = field(default="gpt-mini", metadata={
        "help": "the model spec the points are made of (its width, depth, heads, ffn and context are the check's)"})
    widths: tuple[int, ...] = field(default=(64, 128, 256, 512), metadata={
        "help": "widths d of the width axis, at the smallest depth; the smallest is muP's base width"})
    depths: tuple[int, ...] = field(default=(2, 4, 8, 16), metadata={
        "help": "depths L of the depth axis, at the smallest width; the smallest is CompleteP's base depth"})
    head_dim: int = field(default=16, metadata={"help": "d_head at every width (heads = d / d_head)", "min": 1})
    steps: int = field(default=4, metadata={"help": "AdamW updates of each model", "min": 1})
    lr: float = field(default=1e-2, metadata={"help": "the (base) learning rate, constant"})
    batch_size: int = field(default=8, metadata={"help": "sequences a batch (the probe batch too)", "min": 1})
    context: int = field(default=64, metadata={"help": "tokens a sequence", "min": 1})
    vocab_size: int = field(default=256, metadata={"help": "the random tokens' vocabulary", "min": 2})
    seeds: int = field(default=3, metadata={"help": "models per point (seeds 1..N)", "min": 1})
    extra: dict[str, Any] = field(default_factory=dict)  # more model fields, as a model spec's options

    def __post_init__(self):
        if self.parametrization not in parametrization.PARAMETRIZATIONS:
            raise ValueError(f"unknown parametrization {self.parametrization!r}; known: "
                             f"{', '.join(parametrization.PARAMETRIZATIONS)}")
        for name in ("widths", "depths"):
            values = getattr(self, name)
            if len(values) < 2 or len(set(values)) != len(values) or min(values) < 1:
                raise ValueError(f"coord-check needs at least two different positive {name}, got "
                                 f"{', '.join(map(str, values)) or 'none'}")
        if bad := [w for w in self.widths if w % self.head_dim]:
            raise ValueError(f"every width must be a multiple of the head size {self.head_dim}; "
                             f"{', '.join(map(str, bad))} is not")
        for name in ("steps", "batch_size", "context", "seeds", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")

    @property
    def label(self) -> str:
        return f"{self.connection} ({self.parametrization})"

    def points(self) -> Iterator[tuple[str, int, int, int]]:
        """(axis, value, width, depth) of every point: the widths at the base depth, the depths at the base width
        (the base point appears on both axes)."""
        base_w, base_l = min(self.widths), min(self.depths)
        for w in sorted(self.widths):
            yield "width", w, w, base_l
        for depth in sorted(self.depths):
            yield "depth", depth, base_w, depth

    def model_config(self, width: int, depth: int):
        """The model of one point, as the parametrisation shapes it."""
        mcfg = model_config(self.model, **{**self.extra, "connection": self.connection, "d_model": width,
                                           "heads": width // self.head_dim, "ffn_dim": 4 * width, "layers": depth,
                                           "context": self.context, "vocab_size": self.vocab_size,
                                           "dropout": 0.0})
        if self.parametrization != "standard":
            mcfg = dataclasses.replace(mcfg, mup_base_width=min(self.widths))
        depth_base = min(self.depths) if self.parametrization == "completep" else 0
        return parametrization.apply(mcfg, self.parametrization, depth_base)


def _rms(t: Tensor) -> float:
    """sqrt(mean t²), to 7 significant digits (the file holds hundreds of them)."""
    return float(f"{t.detach().double().pow(2).mean().sqrt().item():.7g}")


class _Probe:
    """Forward hooks that keep, for one pass, every sub-layer's stream input and branch output and the final
    norm's input."""

    def __init__(self, model: nn.Module):
        self.streams: list[Tensor] = []
        self.branches: list[Tensor] = []
        self.final: Tensor | None = None
        self.handles = []
        for _, conn, branch, _ in sublayers(model):
            self.handles.append(conn.register_forward_pre_hook(lambda m, args: self.streams.append(_streams(args[0]))))
            self.handles.append(branch.register_forward_hook(lambda m, args, out: self.branches.append(out)))
        self.handles.append(model.norm.register_forward_pre_hook(lambda m, args: setattr(self, "final", args[0])))

    def clear(self) -> None:
        self.streams, self.branches, self.final = [], [], None

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


@torch.no_grad()
def _measure(model: nn.Module, probe: _Probe, tokens: Tensor,
             start: dict[str, Tensor] | None) -> tuple[dict[str, Any], dict[str, Tensor]]:
    model.eval()
    probe.clear()
    logits = model(tokens)
    final = _streams(probe.final)
    model.train()
    streams = [_rms(s) for s in probe.streams]
    branches = [_rms(b) for b in probe.branches]
    row = {"stream_rms": sum(streams) / len(streams), "branch_rms": sum(branches) / len(branches),
           "final_rms": _rms(final), "logits_rms": _rms(logits),
           "delta_final_rms": 0.0 if start is None else _rms(final - start["final"]),
           "delta_logits_rms": 0.0 if start is None else _rms(logits - start["logits"]),
           "stream_rms_by_layer": streams, "branch_rms_by_layer": branches}
    return row, {"final": final.clone(), "logits": logits.clone()}


def check_point(cfg: CoordCheckConfig, width: int, depth: int, seed: int) -> list[dict[str, Any]]:
    """One model trained ``cfg.steps`` updates: a row per step t = 0 (the start), ..., steps."""
    mcfg = cfg.model_config(width, depth)
    torch.manual_seed(seed)
    model = build_model(mcfg).train()
    param = parametrization.resolve(mcfg, cfg.parametrization)
    opt = torch.optim.AdamW(parametrization.parameter_groups(model, 0.0, param), lr=cfg.lr)
    parametrization.set_lr(opt, cfg.lr)
    data = torch.Generator().manual_seed(seed)
    probe_tokens = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.context),
                                 generator=torch.Generator().manual_seed(10_000 + seed))
    probe = _Probe(model)
    try:
        row, start = _measure(model, probe, probe_tokens, None)
        rows = [{"step": 0, **row}]
        for t in range(1, cfg.steps + 1):
            batch = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.context + 1), generator=data)
            probe.clear()
            loss = F.cross_entropy(model(batch[:, :-1]).transpose(1, 2), batch[:, 1:])
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{cfg.label}: the loss is {loss.item()} at update {t} (width {width}, "
                                         f"depth {depth}, seed {seed}); lower --lr")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if hasattr(model, "after_step"):
                model.after_step()
            rows.append({"step": t, **_measure(model, probe, probe_tokens, start)[0]})
    finally:
        probe.remove()
    return rows


def coord_check(cfg: CoordCheckConfig, progress: bool = True) -> dict[str, Any]:
    """Every point of ``cfg`` at every seed (1, ..., seeds): ``{"config": ..., "rows": [...]}``, a row per axis,
    value, seed and step with :data:`QUANTITIES`."""
    points = list(cfg.points())
    rows = []
    bar = tqdm(total=len(points) * cfg.seeds, desc=f"coord-check {cfg.label}", unit="model", disable=not progress)
    for axis, value, width, depth in points:
        for seed in range(1, cfg.seeds + 1):
            for row in check_point(cfg, width, depth, seed):
                rows.append({"axis": axis, "value": value, "width": width, "depth": depth, "seed": seed, **row})
            bar.update(1)
    bar.close()
    return {"config": dataclasses.asdict(cfg), "label": cfg.label, "axes": list(AXES), "quantities": list(QUANTITIES),
            "rows": rows}
