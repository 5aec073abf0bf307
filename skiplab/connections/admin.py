"""Admin: post-norm with a per-feature shortcut weight ω initialised from the depth or from one batch (Liu et al.,
EMNLP 2020, "Understanding the Difficulty of Training Transformers", its Admin: adaptive model initialisation).

The quantity Admin controls is each sub-layer's *dependency on its residual branch*, the share of the branch in
the variance of what the sub-layer normalises (the paper's Section 1, footnote 3: Var[f(x)] / Var[x + f(x)];
with Admin's ω, :func:`shares`):

    share_i = Var[F_i(x)] / Var[ω_i ⊙ x + F_i(x)]

Post-LN (ω = 1) with unit-variance branches gives share 1/2 at every sub-layer, Σ_i share_i = n/2 over n
sub-layers; Admin's ω brings the sum down to O(log n), the output change it aims for (O(n) for the original
Transformer, O(log n) with Admin: microsoft/admin-torch README, ``output_change_scale``): with the paper's
ω_i² = Σ_{j<i} Var[F_j] and equal branch variances, share_i = 1/i and Σ_i share_i ≈ ln n.
"""

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

# init=auto keeps the closed form on a stack where its summed share is within this factor of the profiled one.
# Measured once (one batch of random tokens, not recorded as a run; the tests bound the two ends: the GPT's gap above
# 10, the Xavier Transformer's below 2, tests/connections/test_admin.py): the Xavier-initialised Transformer (the closed form's setting) 1.3 to
# 1.9 at 6, 12 and 24 layers per stack, the PreAct-ResNet (He init) 1.6; the GPT's N(0, 0.02²) init 140 to 160
# at d = 256 (Σ share 0.019 against 2.6 at 6 layers, 0.023 against 3.4 at 12), 14 at d = 768; the translation
# Transformer's init=lipschitz 5 to 9.
KEEP_CLOSED = 4.0


def admin_omega(n: int) -> float:
    """ω for a stack of ``n`` residual sub-layers with an O(log n) output change: √((n + 1)/ln(n + 1) − 1)
    (microsoft/admin-torch, ``admin_torch/admin.py``, ``calculate_init`` with ``'O(logn)'``; n counts every
    residual sub-layer, 2N in an N-layer encoder). n = 24 gives 2.60, n = 48 gives 3.40.

    Its assumption: Var[F] = Var[x] = 1 (unit-variance branches on the normalised input, as the Xavier-initialised
    Transformer it was written for roughly has). Then 1 + ω² = (n + 1)/ln(n + 1), every sub-layer's share is
    1/(1 + ω²) = ln(n + 1)/(n + 1), and the n shares sum to n ln(n + 1)/(n + 1) ≈ ln(n + 1). With a branch of
    variance v ≪ 1 the share is v/(v + ω²) instead, v times smaller."""
    return math.sqrt((n + 1) / math.log(n + 1) - 1)


@register
class Admin(Connection):
    """``Admin[+RMS](init=auto|closed|profile)``: b = ω ⊙ x + F(x), y = LN(b), ω ∈ R^d learned (Liu et al. 2020;
    the Transformer-Clinic code's ``nn.Parameter`` per dimension). Post-norm: no final norm.

    ``init=closed``: every entry of ω is :func:`admin_omega` of the stack's residual sub-layer count (layers ×
    sub-layers per layer, from the block's :class:`Place`), microsoft/admin-torch's closed form.

    ``init=profile``: the paper's own Admin. ω starts at 1 and :func:`profile` sets it from one forward pass on
    real data, in order along each stack, as the authors' code does (LiyuanLucasLiu/Transformer-Clinic,
    ``transformer_layer.py``, ``--init-type adaptive``): ω_1 = 1, ω_{i+1} = √(Var[ω_i ⊙ x_{i−1}] + Var[F_i(x_{i−1})]).
    The paper writes ω_i = √(Σ_{j<i} Var[F_j]), which leaves out the input's variance (and would give the first
    block no skip at all); skiplab counts it, as the code does. A separate ω per sub-layer and one chain per
    stack, as the code has (its decoder's self, cross and FFN ω share one ``decoder_ratio`` chain). The code
    profiles in training mode, after dropout; skiplab profiles with dropout off, so the profile is deterministic,
    and otherwise as training runs (a batch norm, in the PreAct-ResNet's branches, on the batch's statistics).

    ``init=auto`` (default): the closed form where its assumption holds, the profile where it does not. The
    closed form assumes branches of about their input's variance (:func:`admin_omega`); the paper's ω follows the
    branches' measured variances (ω_i² = Σ_{j<i} Var[F_j]: share_i = 1/i for equal variances, whatever their
    scale). The GPT family's N(0, 0.02²) init gives branches of variance 5e-4 to 1e-2 on a unit input (d = 256):
    the closed form leaves each sub-layer a share of 1e-4 to 3e-3 and the stack a summed share over 100 times
    below the profiled one, which is 2.6 and 3.4 at 6 and 12 layers, ≈ ln(n + 1), as the paper intends (the
    chain is ω_i² = Var[x_0] + Σ_{j<i} Var[F_j], every later x a unit-gain LN output, and the GPT's embeddings
    have variance 0.02²: the paper's formula). A data-free rescaling of the closed ω by the weights' variance
    cannot see attention's averaging or the activation's small-input gain, so ω starts at the closed form, and :func:`profile` measures on one batch each stack's summed
    share under the closed form and under the profiled ω: where the two agree within :data:`KEEP_CLOSED` the
    closed form is kept (the Xavier-initialised translation Transformer, the PreAct-ResNet: ω exactly as
    ``init=closed``), else the profiled ω stays (the GPT). Without :func:`profile` an ``auto`` connection is the
    closed form. ``skiplab train`` profiles every fresh run and records what was built in config.json
    (``admin``, from :func:`summary`)."""

    name = "Admin"
    accepts_norms = ("LN", "RMS", "DyT")
    default_norm = "LN"
    options = {"init": Option("auto", choice("auto", "closed", "profile"),
                              "auto: closed form where its branch-variance assumption holds (measured on one batch), "
                              "else profiled; closed: from depth; profile: from one batch")}
    patterns = {"Admin[+RMS](init=auto|closed|profile)":
                "y = LN(ω ⊙ x + F(x)), ω learned per feature; ω = √((n+1)/ln(n+1) − 1) for n residual sub-layers, "
                "or profiled on one batch; auto: profiled where the closed form's summed branch share is off "
                "(Liu et al. 2020, Admin)"}

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        self.n = self.place.layers * self.place.sublayers
        self.init = spec.options["init"]
        self.built_as = "profile" if self.init == "profile" else "closed"  # what ω holds now (auto: until profiled)
        self.summed_share: dict[str, float] | None = None  # auto: the stack's Σ share under each, once profiled
        self.omega = nn.Parameter(torch.full((dim,), admin_omega(self.n) if self.built_as == "closed" else 1.0))
        self.norm = make_norm(spec.norm, dim, layout)
        self.probe: Callable[[Admin, Tensor, Tensor], None] | None = None  # inside profile() and shares() only

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        fx = branch(x)
        if self.probe is not None:
            with torch.no_grad():
                self.probe(self, s, fx)
        h = torch.addcmul(fx, self.omega.view(self._shape(s)), s)
        y = self.norm(h)
        self.record(pre=h, post=y)
        return y

    def share(self, s: Tensor, fx: Tensor) -> float:
        """Var[F(x)] / Var[ω ⊙ x + F(x)] of one forward pass (skip path ``s``, branch output ``fx``), over every
        element: the paper's dependency on the residual branch."""
        h = torch.addcmul(fx, self.omega.view(self._shape(s)), s)
        return float(fx.float().var(unbiased=False)) / float(h.float().var(unbiased=False))

    def _shape(self, s: Tensor) -> tuple[int, ...]:
        return (-1,) if feature_axis(self.layout) == -1 else (-1, *([1] * (s.dim() - 2)))

    def stats(self) -> dict[str, Any]:
        w = self.omega.detach()
        return {"omega_mean": w.mean().item(), "omega_norm": w.norm().item(), "omega": w.cpu().clone()}


def _probed(model: nn.Module, probes: dict[Admin, Callable[[Admin, Tensor, Tensor], None]],
            forward: Callable[[], Any]) -> None:
    """One call of ``forward`` with each connection's ``probe`` set, the model as training runs it but for dropout:
    dropout off (evaluation mode), and every batch norm on the batch's statistics, as in training (in evaluation
    mode it would read its running statistics, at initialisation mean 0 and variance 1: no normalisation at all),
    its running statistics kept as they were."""
    for conn, probe in probes.items():
        conn.probe = probe
    was_training = model.training
    model.eval()
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    kept = [{k: v.clone() for k, v in m.named_buffers(recurse=False)} for m in norms]
    for m in norms:
        m.train()
    try:
        with torch.no_grad():
            forward()
    finally:
        model.train(was_training)
        with torch.no_grad():
            for m, buffers in zip(norms, kept):
                for k, v in buffers.items():
                    getattr(m, k).copy_(v)
        for conn in probes:
            conn.probe = None


def shares(model: nn.Module, forward: Callable[[], Any]) -> dict[str, float]:
    """Var[F_i] / Var[ω_i ⊙ x + F_i] of every Admin connection of ``model`` (qualified name; ω as it is now) in
    one call of ``forward`` (a forward pass on a batch, dropout off: :func:`_probed`); {} when it has none. Their
    sum over a stack is the quantity Admin keeps O(log n) (module docstring)."""
    out: dict[str, float] = {}
    conns = {c: n for n, c in iter_connections(model) if isinstance(c, Admin)}

    def record(conn: Admin, s: Tensor, fx: Tensor) -> None:
        out[conns[conn]] = conn.share(s, fx)

    _probed(model, dict.fromkeys(conns, record), forward)
    return out


def profile(model: nn.Module, forward: Callable[[], Any]) -> dict[str, float]:
    """Set the ω of every ``Admin(init=profile)`` connection of ``model`` from one call of ``forward`` (a forward
    pass on a batch of real data, at initialisation, no update): each stack's chain starts at ω = 1; and decide
    every ``Admin(init=auto)`` one: closed form or profiled, per stack (:class:`Admin`; one more forward pass
    measures the closed form's shares). Returns ω per connection (qualified name) whose ω was profiled; {} when
    the model has none (the closed form, asked for or kept, needs no record)."""
    conns = {c: n for n, c in iter_connections(model) if isinstance(c, Admin) and c.init in ("auto", "profile")}
    if not conns:
        return {}
    auto = [c for c in conns if c.init == "auto"]
    with torch.no_grad():
        for conn in auto:  # the closed form's shares, whatever ω holds now (a second call decides the same)
            conn.omega.fill_(admin_omega(conn.n))
    closed = shares(model, forward) if auto else {}
    chains: dict[str, list[float]] = {}
    profiled: dict[str, float] = {}

    def step(conn: Admin, s: Tensor, fx: Tensor) -> None:
        chain = chains.setdefault(conn.place.stack, [1.0])  # the stack's running ratio
        conn.omega.fill_(chain[0])
        chain[0] = math.sqrt(float((conn.omega.view(conn._shape(s)) * s).var(unbiased=False))
                             + float(fx.var(unbiased=False)))
        profiled[conns[conn]] = conn.share(s, fx)

    _probed(model, dict.fromkeys(conns, step), forward)
    for stack in {c.place.stack for c in auto}:
        group = [c for c in auto if c.place.stack == stack]
        summed = {"closed": sum(closed.get(conns[c], 0.0) for c in group),
                  "profiled": sum(profiled.get(conns[c], 0.0) for c in group)}
        keep = max(summed.values()) <= KEEP_CLOSED * min(summed.values())
        for conn in group:
            conn.built_as, conn.summed_share = ("closed" if keep else "profile"), summed
            if keep:
                with torch.no_grad():
                    conn.omega.fill_(admin_omega(conn.n))
    return {n: c.omega[0].item() for c, n in conns.items() if c.built_as == "profile"}


def summary(model: nn.Module) -> dict[str, dict[str, Any]]:
    """What the Admin connections of ``model`` were built as, per stack: ``init`` as written, ``built`` ("closed"
    or "profile": what ω holds), the range of ω's mean over the stack's connections, and, for ``init=auto`` once
    profiled, the stack's summed share under the closed form and the profiled ω. {} when it has none."""
    out: dict[str, dict[str, Any]] = {}
    for _, conn in iter_connections(model):
        if not isinstance(conn, Admin):
            continue
        w = conn.omega.detach().mean().item()
        entry = out.setdefault(conn.place.stack, {"init": conn.init, "built": conn.built_as, "connections": 0,
                                                  "omega": [w, w]})
        entry["connections"] += 1
        entry["omega"] = [min(entry["omega"][0], w), max(entry["omega"][1], w)]
        if conn.summed_share is not None:
            entry["summed_share"] = dict(conn.summed_share)
    return out
