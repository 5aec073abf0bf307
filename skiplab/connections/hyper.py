"""Hyper-connections: n residual streams instead of one (Zhu et al., ICLR 2025, "Hyper-Connections",
arXiv 2409.19606, Section 2 and Algorithm 2; reference code lucidrains/hyper-connections), and their
manifold-constrained form mHC (Xie et al., DeepSeek 2025, arXiv 2512.24880).

The streams are one tensor (..., n, D), a position's n rows of D contiguous, as both reference implementations hold
them (hyper-connections folds them into the batch, DeepSeek-V4's port keeps [B, S, N, D]): mHC's flattened streams
are then a view, and each position's read and write are one small product over contiguous rows. Per sub-layer the
work is one projection of the streams giving every position's coefficients (HC: its n rows on the n + 2 columns of
W, normalised per stream; mHC: the flattened nD on the 2n + n² columns of φ), with the norm folded into the product,
then the read h₀ and the mixed streams in one batched product and the write in one element-wise pass, their backward
passes written out (:mod:`~skiplab.connections.hyper_mix`); under ``torch.compile`` the same formulas as broadcast
expressions inductor fuses (docs/performance.md, "hyper-connections at their cost")."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import hyper_mix
from .kernels import norm_project as norm_project_kernel
from .kernels import sinkhorn as sinkhorn_kernel
from .kernels import stream_mix
from .base import Branch, Connection, register
from .norms import make_norm
from .place import Place
from .second_order import graph_wanted, plain, vjp
from .spec import Option, Spec, SpecError, choice, positive_int

HC_SCALE = 0.01  # HC's s_α, s_β at initialisation (Zhu et al. 2025, Algorithm 2; the code's dynamic_alpha_scale)


_streams = positive_int  # n, iters: integers >= 1


class Expand(nn.Module):
    """The stack's input x (..., D) as n equal streams H⁰ (..., n, D), copied into one contiguous tensor: every
    layer then reads streams of one layout (a compiled layer serves the first as it serves the others)."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, x: Tensor) -> Tensor:
        return x.unsqueeze(-2).expand(*x.shape[:-1], self.n, x.shape[-1]).contiguous()

    def extra_repr(self) -> str:
        return f"n={self.n}"


class Reduce(nn.Sequential):
    """The streams summed, (..., n, D) -> (..., D), then the stack's final norm."""

    def forward(self, h: Tensor) -> Tensor:
        return super().forward(h.sum(-2))


@register
class HC(Connection):
    """``HC[+RMS](n=4, kind=dynamic|static, tanh=yes|no)``: n residual streams H ∈ R^{n×d} per position. Each
    sub-layer k reads h₀ = A_mᵀ H, computes F(LN(h₀)) (the pre-norm sub-layer) and writes H ← Bᵀ F(LN(h₀)) + A_rᵀ H, with
    A_m ∈ R^n, A_r ∈ R^{n×n}, B ∈ R^n (the hyper-connection matrix [[0, B], [A_m, A_r]]).

    Static (``kind=static``): A_m, A_r, B learned, initialised A_m = e_{k mod n} (k the sub-layer's 0-based index
    in its stack), A_r = I, B = 1, so that at initialisation the network is the pre-norm network. Dynamic
    (``kind=dynamic``, the paper's DHC): with H̄ = LN(H) per stream,
    A_m(H) = s_α tanh(H̄ W_m) + A_m, A_r(H) = s_α tanh(H̄ W_r) + A_r, B(H) = s_β tanh(H̄ W_β) + B,
    W_m ∈ R^d, W_r ∈ R^{d×n}, W_β ∈ R^d starting at 0 and the scales s_α, s_β learned from 0.01 (the code's
    ``dynamic_alpha_scale``, ``dynamic_beta_scale``); ``tanh=no`` drops the tanh, A_m(H) = s_α H̄ W_m + A_m and
    so on (the "W/O tanh" rows of the paper's Tables 1 and 2). The stack expands its input to n copies before the first
    layer and sums the streams before the final norm (:func:`~skiplab.connections.input_norm`,
    :func:`~skiplab.connections.final_norm`). With n = 1 and the initialisation above, HC is ``PreLN``.
    Initialisation constants: Section 2.3, Eq. 14; s_α, s_β: Section 2.2, Eqs. 10-13 and Algorithm 2. The
    paper's implementation notes (Section 4) also rescale the initial std of the output projections with n;
    skiplab keeps the model's own initialisation, so that designs compare on the same weights.

    ``HC+RMS`` is hyper-connections 0.4.11's ``HyperConnections`` (tests/oracles): its streams' RMSNorm has no ε
    and the gain 1 + γ, its static form is the dynamic one with W = 0, and its branch applies the sub-layer's norm.
    """

    name = "HC"
    accepts_norms = ("LN", "RMS")
    default_norm = "LN"
    needs_stack = True
    final_norm = "LN"
    options = {"n": Option(4, _streams, "residual streams (expansion rate)"),
               "kind": Option("dynamic", choice("dynamic", "static"), "dynamic: weights depend on H (DHC)"),
               "tanh": Option("yes", choice("yes", "no"), "dynamic: tanh on H̄W (no: the paper's W/O tanh rows)")}
    patterns = {"HC[+RMS](n=4,kind=dynamic|static,tanh=yes|no)": "n streams H; h₀ = A_mᵀH, H ← Bᵀ F(LN(h₀)) + A_rᵀH; A_m = e_{k mod n}, "
                                                      "A_r = I, B = 1 at start  (Zhu et al. 2025, Hyper-Connections)"}

    @classmethod
    def canonical(cls, spec: Spec) -> Spec:
        if spec.options.get("kind") == "static" and spec.options.get("tanh") == "no":
            raise SpecError("bad connection spec: tanh=no acts on the dynamic weights (HC(kind=dynamic,tanh=no)); "
                            "kind=static has none")
        return spec

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        super().__init__(spec, dim, layout, in_dim, place)
        if layout != "seq":
            raise ValueError("HC holds n residual streams of (..., dim) features; it has no conv layout")
        n = self.n = spec.options["n"]
        # the streams' read and write (and, dynamic, their norm and projection) as CPU kernels where they can run
        # (kernels.stream_mix, kernels.norm_project); None: hyper_mix's products
        self.kernel = "stream_mix"
        self.norm = make_norm(spec.norm, dim)  # the sub-layer's own pre-norm
        self.a_m = nn.Parameter(F.one_hot(torch.tensor((self.place.index - 1) % n), n).float())
        self.a_r = nn.Parameter(torch.eye(n))
        self.b = nn.Parameter(torch.ones(n))
        self.dynamic = spec.options["kind"] == "dynamic"
        self.tanh = spec.options["tanh"] == "yes"
        if not self.dynamic and not self.tanh:
            raise ValueError("HC(tanh=no) acts on the dynamic weights; kind=static has none")
        if self.dynamic:
            self.stream_norm = make_norm(spec.norm, dim)
            self.w_m = nn.Parameter(torch.zeros(dim))
            self.w_r = nn.Parameter(torch.zeros(dim, n))
            self.w_b = nn.Parameter(torch.zeros(dim))
            self.s_alpha = nn.Parameter(torch.tensor(HC_SCALE))
            self.s_beta = nn.Parameter(torch.tensor(HC_SCALE))

    @classmethod
    def final_norm_kind(cls, spec: Spec, layers: int) -> str | None:
        return spec.norm

    @classmethod
    def stack_input(cls, spec: Spec, dim: int, layout: str) -> nn.Module:
        return Expand(spec.options["n"])

    @classmethod
    def stack_output(cls, spec: Spec, dim: int, layout: str, layers: int) -> nn.Module:
        return Reduce(make_norm(spec.norm, dim, layout))

    def weights(self, h: Tensor, slot: hyper_mix.GradSlot | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """A_m (..., n), A_r (..., n, n), B (..., n) for streams ``h`` (..., n, D); ``slot``: shared with the read of
        the same streams (:class:`~skiplab.connections.hyper_mix.GradSlot`)."""
        if not self.dynamic:
            return self.a_m, self.a_r, self.b
        n = self.n
        # the three projections of the normalised streams in one product: H̄ W = N(H) (γ ⊙ W) + β W for the stream
        # norm N ⊙ γ + β, with N(H) never written out (hyper_mix.norm_project); W's columns as rows (n + 2, D)
        w = torch.cat([self.w_m.unsqueeze(0), self.w_r.t(), self.w_b.unsqueeze(0)], 0)
        norm = self.stream_norm
        centre = isinstance(norm, nn.LayerNorm)
        eps = norm.eps if norm.eps is not None else torch.finfo(h.dtype).eps
        t = self._norm_project(h.reshape(-1, self.dim), w if norm.weight is None else w * norm.weight, centre, eps,
                               slot)
        t = t.view(*h.shape[:-1], n + 2)  # (..., n, n + 2): stream i's row
        if getattr(norm, "bias", None) is not None:
            t = t + F.linear(norm.bias, w)
        t = torch.tanh(t) if self.tanh else t
        a_m = self.s_alpha * t[..., 0] + self.a_m
        a_r = self.s_alpha * t[..., 1 : n + 1] + self.a_r
        b = self.s_beta * t[..., n + 1] + self.b
        return a_m, a_r, b

    def _norm_project(self, x: Tensor, v: Tensor, centre: bool, eps: float, slot) -> Tensor:
        """N(x) Vᵀ (:func:`~skiplab.connections.hyper_mix.norm_project`), as a CPU kernel where the connection
        runs its kernels and it can run (:mod:`~skiplab.connections.kernels.norm_project`)."""
        if self.kernel and norm_project_kernel.usable(x, v):
            return norm_project_kernel.norm_project(x, v, centre, eps, slot)
        return hyper_mix.norm_project(x, v, centre, eps, slot)

    def mixing(self, h: Tensor, slot: hyper_mix.GradSlot | None = None) -> tuple[Tensor, Tensor]:
        """(W, B): W (..., n + 1, n) stacks A_mᵀ over A_rᵀ, so that W H gives h₀ and A_rᵀ H in one product."""
        a_m, a_r, b = self.weights(h, slot)
        return torch.cat([a_m.unsqueeze(-2), a_r.mT], -2), b

    def forward(self, x: Tensor, branch: Branch, skip: Branch | None = None) -> Tensor:
        if skip is not None:
            raise ValueError(f"{self.name} takes no projection shortcut: its streams keep the stack's width")
        if x.shape[-2:] != (self.n, self.dim):
            raise ValueError(f"{self.name}(n={self.n}) expects streams (..., {self.n}, {self.dim}), got "
                             f"{tuple(x.shape)}: the stack must begin with input_norm(spec, dim)")
        lead = x.shape[:-2]
        # (positions, n, D): a view of the residual path (contiguous from the stack's first layer on: Expand)
        streams = x.reshape(-1, self.n, self.dim).contiguous()
        # ∂H in one buffer, the read's part and the weights' (eager only: a compiled step fuses the sum itself)
        slot = hyper_mix.GradSlot() if self.dynamic and not plain() else None
        w, b = self.mixing(streams, slot)
        if self.kernel and streams.device.type == "cpu" and not plain():
            w_p = w.expand(streams.shape[0], *w.shape[-2:]).contiguous()
            b_p = b.expand(streams.shape[0], self.n).contiguous()
            if stream_mix.usable(streams, w_p, b_p):
                return self._kernel_forward(streams, w_p, b_p, slot, branch, lead).view(x.shape)
        # rows 0 and 1..n of W H: h₀ = A_mᵀ H and (A_rᵀ H)_j = Σ_i A_r[i, j] H_i, in one product
        h0, kept = hyper_mix.read(streams, w, slot)
        out = branch(self.norm(h0.view(*lead, self.dim)))
        return hyper_mix.write(kept, out.reshape(-1, self.dim), b).view(x.shape)  # + Bᵀ F

    def _kernel_forward(self, streams: Tensor, w: Tensor, b: Tensor, slot, branch: Branch, lead) -> Tensor:
        """The read and the write as CPU kernels (:mod:`~skiplab.connections.kernels.stream_mix`): h₀ = W[0] H, then
        W[1:] H + b ⊗ F, the mixed streams never written out; ∂H in one buffer (the write's, the read's and, where
        the streams' norm and projection made W, theirs)."""
        kslot = slot if slot is not None else hyper_mix.GradSlot()
        h0 = stream_mix.read(streams, w[:, 0], kslot, handoff=slot is not None)
        f = branch(self.norm(h0.view(*lead, self.dim))).reshape(-1, self.dim)
        return stream_mix.write(streams, w[:, 1:], f, b, kslot if stream_mix.reaches(f.grad_fn, h0.grad_fn) else None)

    def stats(self) -> dict[str, Any]:
        return {"A_m": self.a_m.detach().cpu().clone(), "A_r": self.a_r.detach().cpu().clone(),
                "B": self.b.detach().cpu().clone(), "A_r_diag_mean": self.a_r.detach().diagonal().mean().item(),
                "B_mean": self.b.detach().mean().item()}


class _Sinkhorn(torch.autograd.Function):
    """Sinkhorn–Knopp with the unrolled iterations' gradient written out (:func:`sinkhorn`).

    Each half-step is y = m / s, s = m.sum(k) over the rows or the columns, whose vector-Jacobian product is
    ∂L/∂m = (g − (g ⊙ y).sum(k)) / s for g = ∂L/∂y; the first, m⁰ = exp(l − max l), gives ∂L/∂l = g ⊙ m⁰ (the
    projection does not change when m⁰ is scaled, so the max, a common factor, carries no gradient). Forward and
    backward run with the n × n entries outermost, (n, n, positions), so that every sum and broadcast is over
    contiguous rows of positions: autograd through the same loop in the (..., n, n) layout ran its backward
    kernels on strided, expanded gradients, each about 25 times slower than the same kernel on contiguous
    tensors (a 16×256×4×4 division: 1.2 ms against 40 µs, profiled beside training runs)."""

    @staticmethod
    def forward(ctx, logits: Tensor, iters: int) -> Tensor:
        lead = logits.dim() - 2
        work = torch.promote_types(logits.dtype, torch.float32)  # bf16/fp16 in float32, float64 kept
        m = logits.to(work).permute(lead, lead + 1, *range(lead)).contiguous()  # (n, n, ...)
        m = torch.exp(m - m.amax(dim=(0, 1), keepdim=True))
        saved = [logits, m]  # the logits as given: a second derivative's graph starts there
        for _ in range(iters):
            for k in (0, 1):  # T_c: the columns (a sum over the rows i), then T_r: the rows
                s = m.sum(k, keepdim=True)
                m = m / s
                saved += [s, m]
        ctx.save_for_backward(*saved)
        ctx.lead, ctx.dtype, ctx.iters = lead, logits.dtype, iters
        return m.permute(*range(2, lead + 2), 0, 1).to(logits.dtype)

    @staticmethod
    def formula(logits: Tensor, iters: int) -> Tensor:
        """The projection as plain operators (what ``torch.compile`` fuses and a second derivative differentiates)."""
        m = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return sinkhorn_kernel.iterate(torch.exp(m - m.amax(dim=(-2, -1), keepdim=True)), iters).to(logits.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        lead, (logits, *saved) = ctx.lead, ctx.saved_tensors
        if graph_wanted():  # the iterates are made inside forward: no graph to a second order
            return vjp(_Sinkhorn.formula, (logits, ctx.iters), ctx.needs_input_grad, (grad,))
        g = grad.to(saved[0].dtype).permute(lead, lead + 1, *range(lead)).contiguous()
        for i in range(len(saved) - 1, 0, -2):  # (s, y) pairs, last half-step first
            s, y = saved[i - 1], saved[i]
            k = 1 if ((i - 1) // 2) % 2 else 0
            g = (g - (g * y).sum(k, keepdim=True)) / s
        g = g * saved[0]
        return g.permute(*range(2, lead + 2), 0, 1).to(ctx.dtype), None


def sinkhorn(logits: Tensor, iters: int = 20, kernel: bool = False) -> Tensor:
    """Sinkhorn–Knopp projection of exp(``logits``) (..., n, n) onto the doubly stochastic matrices: M⁰ = exp(·),
    M^t = T_r(T_c(M^{t−1})) (columns, then rows normalised to sum 1), ``iters`` times (mHC's Eq. 9; "we choose
    t_max = 20", Section 4.2). The rows sum to 1 exactly after the last step, the columns to within the
    iteration's convergence. Computed in at least float32 (a bf16 or fp16 input is cast up for the 40 steps) and
    returned in the input's dtype; the gradient is that of the unrolled iterations (:class:`_Sinkhorn`; under
    ``torch.compile``, autograd through the loop itself, which inductor fuses into a few kernels). ``kernel``: the
    CPU kernel (:mod:`~skiplab.connections.kernels.sinkhorn`, the same formula, the same values where a sum is
    subnormal) where it can run. Eq. 9 has no ε: a column of exp(l − max l) that underflows to 0 everywhere (a
    logit spread past about 87 in float32, 745 in float64) is 0/0, NaN, in both (transformers' port adds its
    ``hc_eps`` to every sum, class :class:`MHC`)."""
    if kernel and sinkhorn_kernel.usable(logits):
        return sinkhorn_kernel.sinkhorn(logits, iters)
    if plain():
        return _Sinkhorn.formula(logits, iters)
    return _Sinkhorn.apply(logits, iters)


PHI_STD = 0.02  # mHC's φ at initialisation: transformers' DeepseekV4Config.initializer_range
MHC_ALPHA = 0.01  # mHC's α^pre, α^post, α^res at initialisation (Xie et al. 2025, Table 5; the port's is 1)
POST_GAIN = 2.0  # mHC's H^post = 2σ(H̃^post) (Xie et al. 2025, Eq. 8)


@register
class MHC(HC):
    """``mHC[+RMS](n=4, iters=20)``: manifold-constrained hyper-connections (Xie et al., DeepSeek 2025, arXiv
    2512.24880). With streams x ∈ R^{n×C} and x̃ = RMSNorm(vec(x)) ∈ R^{nC} (no gain),

        H̃^pre = α^pre (x̃ φ^pre) + b^pre,  H̃^post = α^post (x̃ φ^post) + b^post,  H̃^res = α^res mat(x̃ φ^res) + b^res
        H^pre = σ(H̃^pre),  H^post = 2σ(H̃^post),  H^res = Sinkhorn–Knopp(exp(H̃^res))  (:func:`sinkhorn`)
        x ← H^res x + H^postᵀ F(LN(H^pre x))

    (Section 4.2, Eqs. 7-9), so the stream-mixing matrix is doubly stochastic (rows and columns sum to 1) and the
    composite mixing of a deep stack cannot blow up as HC's may.

    Initialisation: α^pre = α^post = α^res = 0.01, learned (the paper's Table 5, "mHC/HC gating factor init α
    0.01"). The paper leaves b and φ open; skiplab takes them from transformers' DeepSeek-V4 port
    (``DeepseekV4PreTrainedModel._init_weights``: ``base`` zeros, ``fn`` ~ N(0, initializer_range²) with
    initializer_range = 0.02): b^pre = b^post = 0, b^res = 0, φ ~ N(0, 0.02²). With the φ term left out that is
    H^pre = ½·1, H^post = 1, H^res = 11ᵀ/n, so on the n equal copies the stack starts from, every block is the
    pre-norm block, x_i ← x_i + F(LN(n/2 · x)) = x_i + F(LN(x)) (LN is scale-invariant, up to its ε); the random
    φ breaks the symmetry between the streams. Where the implementations differ:

    * transformers' port (``DeepseekV4HyperConnection``) sets the gating factors α to 1 (skiplab: the paper's 0.01)
      and adds ``hc_eps`` = 1e-6 to H^pre and inside Sinkhorn–Knopp. It stores H^resᵀ (``comb``, applied as
      combᵀ x) and starts with a softmax over comb's rows: on H^res the same iteration, T_c then T_r from exp(·).
      It ends the stack with a learned σ-gated sum of the streams (``DeepseekV4HyperHead``) where skiplab sums them.
      DeepSeek's own inference code creates these parameters empty and loads them from the checkpoint.
    * lucidrains' ``manifold_constrained_hyper_connections.py`` (hyper-connections 0.4.11) projects each stream on
      its own (HC's per-stream H̄ W, not the flattened x̃ φ) and uses HC's initial values as the biases:
      b^pre = e_{k mod n}, b^res = I, b^post = 1, which after the constraints are H^pre ≈ (0.73, 0.5, 0.5, 0.5),
      H^post = 2σ(1) ≈ 1.46 and diag H^res = e/(e + n − 1) ≈ 0.48 (n = 4). Its Sinkhorn–Knopp normalises the same
      way on the matrix it stores, which is H^resᵀ: on H^res it takes the rows first.

    The stack expands and sums the streams as HC's does.
    """

    name = "mHC"
    options = {"n": Option(4, _streams, "residual streams (expansion rate)"),
               "iters": Option(20, _streams, "Sinkhorn-Knopp iterations")}
    patterns = {"mHC[+RMS](n=4,iters=20)": "x ← H_res x + H_postᵀ F(LN(H_pre x)), H_res = Sinkhorn(exp(·)) doubly "
                                           "stochastic, H_pre = σ(·), H_post = 2σ(·)  (Xie et al. 2025, mHC)"}

    def __init__(self, spec: Spec, dim: int, layout: str = "seq", in_dim: int | None = None,
                 place: Place | None = None):
        Connection.__init__(self, spec, dim, layout, in_dim, place)
        if layout != "seq":
            raise ValueError("mHC holds n residual streams of (..., dim) features; it has no conv layout")
        n = self.n = spec.options["n"]
        self.kernel = "stream_mix"  # as HC's
        self.sinkhorn_kernel = True  # with kernel set: Sinkhorn-Knopp by kernels/sinkhorn.c where it can run
        self.iters = spec.options["iters"]
        self.dynamic = True
        self.norm = make_norm(spec.norm, dim)
        # φ^pre, φ^post, φ^res side by side; b and φ as transformers' DeepSeek-V4 port draws them (class docstring)
        self.phi = nn.Parameter(torch.empty(n * dim, 2 * n + n * n).normal_(0.0, PHI_STD))
        self.alpha = nn.Parameter(torch.full((3,), MHC_ALPHA))  # α^pre, α^post, α^res: the paper's Table 5
        self.b_pre = nn.Parameter(torch.zeros(n))
        self.b_post = nn.Parameter(torch.zeros(n))
        self.b_res = nn.Parameter(torch.zeros(n, n))

    def weights(self, h: Tensor, slot: hyper_mix.GradSlot | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """H^pre (..., n), H^res (..., n, n), H^post (..., n) for streams ``h`` (..., n, C); ``slot`` as HC's."""
        n = self.n
        # x̃ φ = (x φ) / rms(x), x the flattened streams (..., nC): one product, the normalised x̃ never written out
        # (hyper_mix.norm_project; φ's columns as rows, (2n + n², nC))
        proj = self._norm_project(h.reshape(-1, n * self.dim), self.phi.t(), False, torch.finfo(h.dtype).eps, slot)
        proj = proj.view(*h.shape[:-2], proj.shape[-1])
        pre = torch.sigmoid(self.alpha[0] * proj[..., :n] + self.b_pre)
        post = POST_GAIN * torch.sigmoid(self.alpha[1] * proj[..., n : 2 * n] + self.b_post)
        res = sinkhorn(self.alpha[2] * proj[..., 2 * n :].unflatten(-1, (n, n)) + self.b_res, self.iters,
                       kernel=bool(self.kernel) and self.sinkhorn_kernel)
        return pre, res, post

    def mixing(self, h: Tensor, slot: hyper_mix.GradSlot | None = None) -> tuple[Tensor, Tensor]:
        """(W, H^post): W (..., n + 1, n) stacks H^pre over H^res, so that W x gives h₀ and H^res x in one product."""
        pre, res, post = self.weights(h, slot)
        return torch.cat([pre.unsqueeze(-2), res], -2), post

    def stats(self) -> dict[str, Any]:
        res = sinkhorn(self.b_res.detach().float(), self.iters)
        return {"H_res_static": res.cpu(), "H_res_diag_mean": res.diagonal().mean().item(),
                "scales": self.alpha.detach().cpu().clone()}
