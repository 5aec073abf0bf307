"""Normalisation layers for the connections, in the two layouts, and their affine unrolling.

A normalisation G maps h to ``w * (h - mu) / sigma + b`` (RMS: ``w * h / sigma``). With the statistics
mu, sigma held fixed, G is affine in h; the recursive skip's learned ratio (Appendix A of the rSkip+LN
paper) is read off that form, so besides building the layers this module gives, for any layer it
built, ``normalize`` (G(h) together with the 1/sigma that G computed anyway: no extra pass over h;
RMS is skiplab's own fused RMSNorm, :func:`~skiplab.connections.fused.rms_norm`),
``norm_sigma`` (sigma recomputed from h, for layers ``normalize`` cannot see into) and ``norm_gain`` (w).

Layouts:

- ``"seq"``: features in the last dimension, ``(..., C)``. LN and RMS normalise each position over its
  C features (``nn.LayerNorm``, ``nn.RMSNorm``); BN normalises each feature over every other dimension.
- ``"conv"``: feature maps ``(N, C, H, W)``. LN normalises each example over (C, H, W) with a per-channel
  gain and bias (``nn.GroupNorm(1, C)``); RMS likewise without centring; BN is ``nn.BatchNorm2d``.

Every affine norm starts at gain 1, bias 0 (PyTorch's defaults).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .fused import autocast_on, group_norm_layout, rms_norm

NORMS = ("LN", "BN", "RMS")  # the normalisations proper (each divides by a statistic of its input)
ALL_NORMS = (*NORMS, "DyT")  # and DyT, the element-wise stand-in for LN
LAYOUTS = ("seq", "conv")
EPS = 1e-5


class FeatureBatchNorm(nn.BatchNorm1d):
    """BatchNorm over every dimension but the last: ``(..., C)`` is normalised per feature."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.reshape(-1, x.shape[-1])).reshape(x.shape)


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` over the last axis computed by :func:`~skiplab.connections.fused.rms_norm` (same
    parameters and state dict; ``nn.RMSNorm`` runs as five separate operations on the CPU)."""

    def forward(self, x: Tensor) -> Tensor:
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        return rms_norm(x, self.weight, tuple(range(-len(self.normalized_shape), 0)), eps)[0]


class ChannelRMSNorm(nn.Module):
    """RMSNorm of each example over (C, H, W) with a per-channel gain: ``w_c * h / rms(h)``.

    The conv-layout counterpart of ``nn.GroupNorm(1, C)`` without centring; PyTorch has no such layer.
    """

    def __init__(self, num_channels: int, eps: float = EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_channels))

    def forward(self, x: Tensor) -> Tensor:  # (N, C, H, W)
        return rms_norm(x, self.weight.view(-1, *([1] * (x.dim() - 2))), tuple(range(1, x.dim())), self.eps)[0]

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}"


SATURATED = 2.0  # |α·x| beyond which DyT's tanh is flat: tanh'(2) = 1 − tanh²(2) = 0.071, tanh(2) = 0.964


class DyT(nn.Module):
    """Dynamic Tanh, DyT(x) = γ ⊙ tanh(α·x) + β: α one learned scalar (α₀ = 0.5), γ and β per feature
    (channel) at 1 and 0 (Zhu et al., CVPR 2025, "Transformers without Normalization", arXiv 2503.10622, Section 4,
    Eq. 2 and Algorithm 1; α₀ = 0.5 is the paper's default for every non-LLM model, Section 7). One α per DyT
    module, i.e. per norm it replaces. No statistic of x: an element-wise stand-in for LN. The spec option
    ``alpha0`` sets α₀ otherwise, ``alpha0=llm`` by the paper's LLM recipe (:func:`dyt_llm_alpha0`)."""

    def __init__(self, dim: int, layout: str = "seq", alpha: float = 0.5):
        super().__init__()
        self.layout = layout
        self.alpha = nn.Parameter(torch.tensor(float(alpha)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        w, b = self.weight, self.bias
        if self.layout == "conv":  # (N, C, ...): one γ, β per channel, whatever the number of spatial axes
            shape = (-1, *([1] * (x.dim() - 2)))
            w, b = w.view(shape), b.view(shape)
        return torch.addcmul(b, w, torch.tanh(self.alpha * x))

    @torch.no_grad()
    def saturated(self, x: Tensor, threshold: float = SATURATED) -> Tensor:
        """Where the input ``x`` lies in tanh's flat range, |α·x| > ``threshold`` (bool, x's shape): there the output
        is γ ⊙ sign(x) + β to within 1 − tanh(threshold), and ∂DyT/∂x = γ α tanh'(α·x) < γ α (1 − tanh²(threshold))."""
        return (self.alpha.detach() * x.detach()).abs() > threshold

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, layout={self.layout!r}"


# The DyT paper's optimal α₀ for LLaMA models, width -> (attention, other): Section 7, "Initialization of α for
# LLMs", its table of optimal α₀ by width and depth (widths 1024, 2048, 4096, 8192; the same at every depth from
# 8 to 64: Table 12 of arXiv v1, Table 11 of the later version) and the LLaMA 13B row (width 5120) of its table by
# model (Table 11 of v1, Table 10 later). That table's 7B and 34B/70B rows (widths 4096 and "8196", i.e. 8192)
# agree with the width table; the authors' code (jiachenzhu/DyT, other_tasks/LLaMA/README.md) trains 7B, 13B,
# 34B and 70B with these attention / FFN / final α₀.
DYT_LLM_ALPHA0: dict[int, tuple[float, float]] = {
    1024: (1.0, 1.0), 2048: (1.0, 0.5), 4096: (0.8, 0.2), 5120: (0.6, 0.15), 8192: (0.2, 0.05)}


def dyt_llm_alpha0(width: int, attention: bool) -> float:
    """α₀ of a DyT layer by the DyT paper's LLM recipe (Section 7, :data:`DYT_LLM_ALPHA0`): the DyT layers of
    the attention blocks ("attention") start higher than those of the FFN blocks and the final DyT ("other"), and
    wider models start lower; depth does not matter. A width the paper does not list takes the values of the
    nearest listed width on a log scale (the listed widths double): every width up to 1448 takes 1024's 1.0/1.0
    (the presets of d 128 to 1024 do; llama-1b and olmo-1b, d 2048, are listed), 3000 takes 4096's 0.8/0.2, and widths beyond 8192 take 8192's."""
    if width < 1:
        raise ValueError(f"width must be a positive integer, got {width}")
    nearest = min(DYT_LLM_ALPHA0, key=lambda w: abs(math.log(width / w)))
    return DYT_LLM_ALPHA0[nearest][0 if attention else 1]


def dyt_alpha0(alpha0: float | str, width: int, attention: bool) -> float:
    """The α₀ a spec's ``alpha0`` option gives a DyT layer of ``width`` features: the number itself, or for
    ``llm`` :func:`dyt_llm_alpha0` (``attention``: the layer sits at a self-attention sub-layer)."""
    return dyt_llm_alpha0(width, attention) if alpha0 == "llm" else float(alpha0)


@torch.no_grad()
def set_dyt_alpha(module: nn.Module, alpha: float) -> None:
    """Start every DyT layer inside ``module`` at α = ``alpha``."""
    for m in module.modules():
        if isinstance(m, DyT):
            m.alpha.fill_(alpha)


class InputScale(nn.Module):
    """y = inner(s·x): s one learned scalar, starting at ``init``, on a stack's input before ``inner`` (its input
    module). The DyT paper's LLaMA has it "immediately after the embedding layer, before any Transformer blocks",
    initialised to √d (Zhu et al. 2025, Appendix A, "Large Language Models"; jiachenzhu/DyT
    ``other_tasks/LLaMA/fms_fsdp/models/llama.py``: ``shared_scale`` filled with ``math.sqrt(emb_dim)``)."""

    def __init__(self, init: float, inner: nn.Module | None = None):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(float(init)))
        self.inner = nn.Identity() if inner is None else inner

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(self.scale * x)


def make_norm(kind: str, dim: int, layout: str = "seq") -> nn.Module:
    """A fresh normalisation layer ``kind`` in {LN, BN, RMS, DyT} over ``dim`` features in ``layout``."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    if kind == "LN":
        return nn.LayerNorm(dim, eps=EPS) if layout == "seq" else nn.GroupNorm(1, dim, eps=EPS)
    if kind == "RMS":
        return RMSNorm(dim, eps=EPS) if layout == "seq" else ChannelRMSNorm(dim, eps=EPS)
    if kind == "BN":
        return FeatureBatchNorm(dim, eps=EPS) if layout == "seq" else nn.BatchNorm2d(dim, eps=EPS)
    if kind == "DyT":
        return DyT(dim, layout)
    raise ValueError(f"unknown normalisation {kind!r}; use one of {', '.join(ALL_NORMS)}")


@torch.no_grad()
def set_norm_eps(module: nn.Module, eps: float) -> int:
    """Every normalisation layer inside ``module`` (LayerNorm, RMSNorm, GroupNorm, BatchNorm, in either layout)
    divides by sqrt(statistic + ``eps``) from now on; the count of layers set. A model built with another eps
    than :data:`EPS` (GPT-2 and LLaMA checkpoints say theirs: ``layer_norm_epsilon``, ``rms_norm_eps``)."""
    kinds = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase, ChannelRMSNorm)
    count = 0
    for m in module.modules():
        if isinstance(m, kinds):
            m.eps = float(eps)
            count += 1
    return count


def feature_axis(layout: str) -> int:
    """The axis that holds the C features: the last for ``seq``, 1 for ``conv``."""
    return -1 if layout == "seq" else 1


def normalize(norm: nn.Module, h: Tensor) -> tuple[Tensor, Tensor]:
    """``(norm(h), 1/sigma)``: the output and the detached 1/sigma the layer divided by, broadcastable to h.

    The statistics come out of the same fused kernel that normalises (``native_layer_norm``,
    ``native_group_norm``, ``native_batch_norm``, skiplab's fused RMSNorm), so keeping
    them costs no pass over memory. Under autocast the layer runs in float32 as ``F.layer_norm`` would.
    Layers it does not know (e.g. a SyncBatchNorm swapped in for multi-process training) are called as
    they are and their sigma is recomputed by :func:`norm_sigma`.
    """
    if autocast_on(h.device.type):
        with torch.autocast(h.device.type, enabled=False):
            return normalize(norm, h.float())
    kind = type(norm)
    if kind is nn.LayerNorm:
        y, _, rstd = torch.native_layer_norm(h, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
        return y, rstd.detach()
    if kind is nn.GroupNorm and norm.num_groups == 1:
        n, c = h.shape[:2]
        h = group_norm_layout(h)
        y, _, rstd = torch.native_group_norm(h, norm.weight, norm.bias, n, c, h.shape[2:].numel(), 1, norm.eps)
        return y, rstd.detach().view(n, *([1] * (h.dim() - 1)))
    if kind in (nn.RMSNorm, RMSNorm, ChannelRMSNorm):
        channel = kind is ChannelRMSNorm
        dims = tuple(range(1, h.dim())) if channel else tuple(range(-len(norm.normalized_shape), 0))
        eps = norm.eps if norm.eps is not None else torch.finfo(h.dtype).eps
        w = norm.weight.view(-1, *([1] * (h.dim() - 2))) if channel else norm.weight
        return rms_norm(h, w, dims, eps)
    if kind in (nn.BatchNorm2d, FeatureBatchNorm) and norm.track_running_stats and norm.training and h.numel():
        flat = h.reshape(-1, h.shape[-1]) if kind is FeatureBatchNorm else h
        if flat.numel() == flat.shape[1]:  # as nn.BatchNorm refuses it: the variance of one value is 0/0
            raise ValueError(f"BatchNorm in training needs more than one value per feature, got an input of shape "
                             f"{tuple(h.shape)}")
        factor = 0.0 if norm.momentum is None else norm.momentum
        norm.num_batches_tracked.add_(1)
        if norm.momentum is None:  # cumulative moving average, as nn.BatchNorm does
            factor = 1.0 / float(norm.num_batches_tracked)
        y, _, invstd = torch.native_batch_norm(flat, norm.weight, norm.bias, norm.running_mean, norm.running_var,
                                               True, factor, norm.eps)
        shape = [1] * h.dim()
        shape[-1 if kind is FeatureBatchNorm else 1] = -1
        return y.reshape(h.shape), invstd.detach().view(shape)
    y = norm(h)
    return y, 1.0 / norm_sigma(norm, h)


@torch.no_grad()
def norm_sigma(norm: nn.Module, h: Tensor) -> Tensor:
    """The sigma by which ``norm`` divides its input ``h``, broadcastable to ``h``.

    LN: sqrt(Var(h) + eps) per position (seq) or per example (conv); RMS: sqrt(mean(h^2) + eps); BN:
    the batch variance in training, the running variance in evaluation, per feature.
    """
    h = h.float()
    if isinstance(norm, nn.LayerNorm):
        dims = tuple(range(-len(norm.normalized_shape), 0))
        return (h.var(dims, unbiased=False, keepdim=True) + norm.eps).sqrt()
    if isinstance(norm, nn.RMSNorm):
        dims = tuple(range(-len(norm.normalized_shape), 0))
        eps = norm.eps if norm.eps is not None else torch.finfo(h.dtype).eps
        return (h.pow(2).mean(dims, keepdim=True) + eps).sqrt()
    if isinstance(norm, nn.GroupNorm) and norm.num_groups == 1:
        dims = tuple(range(1, h.dim()))
        return (h.var(dims, unbiased=False, keepdim=True) + norm.eps).sqrt()
    if isinstance(norm, ChannelRMSNorm):
        dims = tuple(range(1, h.dim()))
        return (h.pow(2).mean(dims, keepdim=True) + norm.eps).sqrt()
    if isinstance(norm, nn.modules.batchnorm._BatchNorm):
        axis = -1 if isinstance(norm, FeatureBatchNorm) else 1
        shape = [1] * h.dim()
        shape[axis] = -1
        if not h.numel():  # an empty batch: torch's batch norm only scales and shifts it
            return h.new_ones(h.shape[axis]).view(shape)
        if norm.training or norm.running_var is None:
            dims = tuple(d for d in range(h.dim()) if d != axis % h.dim())
            var = h.var(dims, unbiased=False)
        else:
            var = norm.running_var.float()
        return (var + norm.eps).sqrt().view(shape)
    raise TypeError(f"no affine unrolling for {type(norm).__name__}")


def norm_gain(norm: nn.Module) -> Tensor:
    """The per-feature gain w of ``norm`` (shape ``(C,)``), detached."""
    return norm.weight.detach().float()


def feature_mean(t: Tensor, layout: str, dim: int) -> Tensor:
    """Mean of ``t`` over every axis but the feature axis, as a ``(dim,)`` vector.

    ``t`` may hold size-1 (broadcast) axes, the feature axis included: the mean of a broadcast tensor
    equals the mean of the tensor it broadcasts from, so nothing full-size is materialised.
    """
    axis = feature_axis(layout) % t.dim()
    dims = tuple(d for d in range(t.dim()) if d != axis)
    return t.mean(dims).expand(dim) if dims else t.expand(dim)
