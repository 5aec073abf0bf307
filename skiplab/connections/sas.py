"""Self-Adaptive Scaling (SAS) and its Scaling Gate.

Source: "Self-Adaptive Scaling Approach for Learnable Residual Structure" (Liu, Gao, Liu, Lei; CoNLL
2019), the SAS paper: Scaling Gate (Eq. 2), free-γ form (Eq. 3), SAS (Eq. 4), single-layer gate
(Table 6), BN form (Table 7), gate bias initialisation +3 / -3 for α / β (Section 4.2).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .base import Branch, Connection, register
from .fused import gated_norm_sum, gated_sum
from .norms import make_norm
from .place import Place
from .spec import Option, Spec, choice, finite_float


def pool_features(t: Tensor, layout: str) -> Tensor:
    """What a gate reads of a tensor: itself (seq) or the per-channel spatial mean ``(N, C)`` (conv).

    The mean is taken as a sum divided afterwards: the backward of a sum is a broadcast view, that of a
    mean a full-size division."""
    return t if layout == "seq" else t.flatten(2).sum(-1) / t.shape[2:].numel()


def unpool(g: Tensor, layout: str, like: Tensor) -> Tensor:
    """Shape a gate output computed on :func:`pool_features` so that it broadcasts against ``like``."""
    return g if layout == "seq" else g.view(*g.shape, *([1] * (like.dim() - g.dim())))


class ScalingGate(nn.Module):
    """The Scaling Gate, one scalar per position (per example in the conv layout), or Highway's transform gate:

    full (Eq. 2):   σ(S(x, F)),  S(x, F) = Tanh([x; F] W_f + b_f) W_ff + b_ff,  W_f ∈ R^{2h×h}, W_ff ∈ R^{h×1}
    single (Table 6): σ([x; F] W_f + b_f),  W_f ∈ R^{2h×1}
    transform (Table 6): σ(T(x)),  T(x) = x W_T + b_T,  W_T ∈ R^{h×h}: from x alone, one factor per feature
                     (per channel in the conv layout), Highway's transform gate (Srivastava et al. 2015)

    The last bias starts at ``bias`` (SAS paper Section 4.2: +3 for α, -3 for β); the other weights
    follow PyTorch's defaults.
    """

    def __init__(self, dim: int, bias: float, kind: str = "full"):
        super().__init__()
        self.reads_branch = kind != "transform"
        if kind == "single":
            self.net = nn.Linear(2 * dim, 1)
        elif kind == "transform":
            self.net = nn.Linear(dim, dim)
        else:
            self.net = nn.Sequential(nn.Linear(2 * dim, dim), nn.Tanh(), nn.Linear(dim, 1))
        nn.init.constant_(self.out.bias, bias)

    @property
    def out(self) -> nn.Linear:
        """The final linear layer, whose bias b_ff sets the gate's starting value σ(b_ff)."""
        return self.net if isinstance(self.net, nn.Linear) else self.net[-1]

    def forward(self, x: Tensor, fx: Tensor) -> Tensor:
        return torch.sigmoid(self.net(torch.cat([x, fx], dim=-1) if self.reads_branch else x))


@register
class SelfAdaptiveScaling(Connection):
    """``SAS[+BN](gate=full|single|transform, gamma=tied|free)``:

        y = α·x + β·F + (1-α)(1-β)·LN(x + F)     (Eq. 4; gamma=tied, the default)
        y = α·x + β·F + γ·LN(x + F)              (Eq. 3; gamma=free, γ from a third gate)

    α = σ(S_α(x, F)), β = σ(S_β(x, F)) (and γ) come from Scaling Gates with their own parameters; F is
    computed once. ``+BN`` replaces LN by BatchNorm (Table 7), ``+RMS`` by RMSNorm. Special cases (Table 2):
    α, β → 0, 0 gives LN(x + F); 1, 1 gives x + F; 1, 0 gives x; 0, 1 gives F.
    In the conv layout each gate reads the per-channel spatial means of x and F: one α, β per example.
    """

    name = "SAS"
    accepts_norms = ("LN", "BN", "RMS", "DyT")
    default_norm = "LN"
    options = {
        "gate": Option("full", choice("full", "single", "transform"),
                       "Scaling Gate: two layers (Eq. 2), one (Table 6), or Highway's transform gate on x (Table 6)"),
        "gamma": Option("tied", choice("tied", "free"), "γ = (1-α)(1-β) (Eq. 4) or from its own gate (Eq. 3)"),
        "alpha_bias": Option(3.0, finite_float, "initial b_ff of the α gate"),
        "beta_bias": Option(-3.0, finite_float, "initial b_ff of the β gate"),
        "gamma_bias": Option(-3.0, finite_float, "initial b_ff of the γ gate (gamma=free); σ(-3) ≈ the tied γ at start"),
    }
    patterns = {
        "SAS": "y = α·x + β·F + (1-α)(1-β)·LN(x+F), α, β from Scaling Gates  (Eq. 4 of the SAS paper)",
        "SAS(gate=single)": "the single-layer Scaling Gate S = [x;F]W_f + b_f  (Table 6 of the SAS paper)",
        "SAS(gate=transform)": "α, β per feature from x alone: σ(xW_T + b_T)  (Transform Gate, Table 6 of the SAS paper)",
        "SAS(gamma=free)": "y = α·x + β·F + γ·LN(x+F), γ from a third gate  (Eq. 3 of the SAS paper)",
        "SAS+BN": "SAS with BatchNorm in place of LN  (Table 7 of the SAS paper)",
    }

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        kind = spec.options["gate"]
        self.alpha = ScalingGate(dim, spec.options["alpha_bias"], kind)
        self.beta = ScalingGate(dim, spec.options["beta_bias"], kind)
        self.gamma = ScalingGate(dim, spec.options["gamma_bias"], kind) if spec.options["gamma"] == "free" else None
        self.norm = make_norm(spec.norm, dim, layout)
        self._last: dict[str, Tensor] = {}

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        s = x if skip is None else skip(x)
        fx = branch(x)
        ps, pf = pool_features(s, self.layout), pool_features(fx, self.layout)
        a = unpool(self.alpha(ps, pf), self.layout, s)
        b = unpool(self.beta(ps, pf), self.layout, s)
        g = (1 - a) * (1 - b) if self.gamma is None else unpool(self.gamma(ps, pf), self.layout, s)
        self._last = {"alpha": a.detach(), "beta": b.detach(), "gamma": g.detach()}  # one value per position
        if self.recording is None:  # training: the sum and the norm in one autograd node where the norm allows
            return gated_norm_sum(a, s, b, fx, g, self.norm)
        h = s + fx
        n = self.norm(h)
        self.record(alpha=a, beta=b, gamma=g, pre=h, post=n)
        return gated_sum((a, s), (b, fx), (g, n))  # α·x + β·F + γ·G(x + F), one output buffer

    def stats(self) -> dict[str, Any]:
        """Mean α, β, γ of the last forward pass (averaged here, not in the forward pass: training pays nothing)."""
        return {k: (self._last[k].float().mean().item() if self._last else None) for k in ("alpha", "beta", "gamma")}
