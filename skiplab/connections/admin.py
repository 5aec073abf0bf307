"""Admin: post-norm with a per-feature shortcut weight ω initialised from the depth (Liu et al., EMNLP 2020,
"Understanding the Difficulty of Training Transformers", its Admin: adaptive model initialisation)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .base import Branch, Connection, iter_connections, register
from .norms import feature_axis, make_norm
from .place import Place
from .spec import Option, Spec, choice


def admin_omega(n: int) -> float:
    """ω for a stack of ``n`` residual sub-layers with an O(log n) output change: √((n + 1)/ln(n + 1) − 1)
    (microsoft/admin-torch, ``admin_torch/admin.py``, ``calculate_init`` with ``'O(logn)'``; n counts every
    residual sub-layer, 2N in an N-layer encoder). n = 24 gives 2.60, n = 48 gives 3.40."""
    return math.sqrt((n + 1) / math.log(n + 1) - 1)


@register
class Admin(Connection):
    """``Admin[+RMS](init=closed|profile)``: b = ω ⊙ x + F(x), y = LN(b), ω ∈ R^d learned (Liu et al. 2020;
    the Transformer-Clinic code's ``nn.Parameter`` per dimension). Post-norm: no final norm.

    ``init=closed`` (default): every entry of ω is :func:`admin_omega` of the stack's residual sub-layer count
    (layers × sub-layers per layer, from the block's :class:`Place`). ``init=profile``: ω starts at 1 and
    :func:`profile` sets it from one forward pass on real data, in order along each stack, as the authors'
    code does (LiyuanLucasLiu/Transformer-Clinic, ``transformer_layer.py``, ``--init-type adaptive``):
    ω_1 = 1, ω_{i+1} = √(Var[ω_i ⊙ x_{i−1}] + Var[F_i(x_{i−1})]). The paper writes
    ω_i = √(Σ_{j<i} Var[F_j]), which leaves out the input's variance (and would give the first block no
    skip at all); skiplab counts it, as the code does. A separate ω per sub-layer and one chain per stack,
    as the code has (its decoder's self, cross and FFN ω share one ``decoder_ratio`` chain). The code profiles
    in training mode, after dropout; skiplab profiles in evaluation mode, so the profile is deterministic."""

    name = "Admin"
    accepts_norms = ("LN", "RMS", "DyT")
    default_norm = "LN"
    options = {"init": Option("closed", choice("closed", "profile"), "closed: from depth; profile: from one batch")}
    patterns = {"Admin[+RMS](init=closed|profile)": "y = LN(ω ⊙ x + F(x)), ω learned per feature; ω = √((n+1)/ln(n+1) − 1) "
                                                   "for n residual sub-layers, or profiled  (Liu et al. 2020, Admin)"}

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        n = self.place.layers * self.place.sublayers
        self.init = spec.options["init"]
        start = admin_omega(n) if self.init == "closed" else 1.0
        self.omega = nn.Parameter(torch.full((dim,), start))
        self.norm = make_norm(spec.norm, dim, layout)
        self.profiling: dict[str, float] | None = None  # the running ratio of this stack, inside profile()

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        fx = branch(x)
        if self.profiling is not None:
            with torch.no_grad():
                self.omega.fill_(self.profiling["ratio"])
                self.profiling["ratio"] = math.sqrt(float((self.omega.view(self._shape(s)) * s).var(unbiased=False))
                                                    + float(fx.var(unbiased=False)))
        h = torch.addcmul(fx, self.omega.view(self._shape(s)), s)
        y = self.norm(h)
        self.record(pre=h, post=y)
        return y

    def _shape(self, s: Tensor) -> tuple[int, ...]:
        return (-1,) if feature_axis(self.layout) == -1 else (-1, *([1] * (s.dim() - 2)))

    def stats(self) -> dict[str, Any]:
        w = self.omega.detach()
        return {"omega_mean": w.mean().item(), "omega_norm": w.norm().item(), "omega": w.cpu().clone()}


@torch.no_grad()
def profile(model: nn.Module, forward: Callable[[], Any]) -> dict[str, float]:
    """Set the ω of every ``Admin(init=profile)`` connection of ``model`` from one call of ``forward`` (a
    forward pass on a batch of real data, at initialisation, no update): each stack's chain starts at ω = 1.
    Returns ω per connection (qualified name); {} when the model has none to profile."""
    conns = {n: c for n, c in iter_connections(model) if isinstance(c, Admin) and c.init == "profile"}
    if not conns:
        return {}
    chains: dict[str, dict[str, float]] = {}
    for conn in conns.values():
        conn.profiling = chains.setdefault(conn.place.stack, {"ratio": 1.0})
    was_training = model.training
    model.eval()
    try:
        forward()
    finally:
        model.train(was_training)
        for conn in conns.values():
            conn.profiling = None
    return {n: c.omega[0].item() for n, c in conns.items()}
