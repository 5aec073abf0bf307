"""Normalisation layers for the connections, in the two layouts, and their affine unrolling.

A normalisation G maps h to ``w * (h - mu) / sigma + b`` (RMS: ``w * h / sigma``). With the statistics
mu, sigma held fixed, G is affine in h; the recursive skip's learned ratio (Appendix A of the rSkip+LN
paper) is read off that form, so besides building the layers this module gives, for any layer it
built, ``norm_sigma`` (the sigma of the last input, broadcastable to it) and ``norm_gain`` (w).

Layouts:

- ``"seq"``: features in the last dimension, ``(..., C)``. LN and RMS normalise each position over its
  C features (``nn.LayerNorm``, ``nn.RMSNorm``); BN normalises each feature over every other dimension.
- ``"conv"``: feature maps ``(N, C, H, W)``. LN normalises each example over (C, H, W) with a per-channel
  gain and bias (``nn.GroupNorm(1, C)``); RMS likewise without centring; BN is ``nn.BatchNorm2d``.

Every affine norm starts at gain 1, bias 0 (PyTorch's defaults).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NORMS = ("LN", "BN", "RMS")
LAYOUTS = ("seq", "conv")
EPS = 1e-5


class FeatureBatchNorm(nn.BatchNorm1d):
    """BatchNorm over every dimension but the last: ``(..., C)`` is normalised per feature."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.reshape(-1, x.shape[-1])).reshape(x.shape)


class ChannelRMSNorm(nn.Module):
    """RMSNorm of each example over (C, H, W) with a per-channel gain: ``w_c * h / rms(h)``.

    The conv-layout counterpart of ``nn.GroupNorm(1, C)`` without centring; PyTorch has no such layer.
    """

    def __init__(self, num_channels: int, eps: float = EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_channels))

    def forward(self, x: Tensor) -> Tensor:  # (N, C, H, W)
        return F.rms_norm(x, x.shape[1:], eps=self.eps) * self.weight.view(1, -1, *([1] * (x.dim() - 2)))

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}"


def make_norm(kind: str, dim: int, layout: str = "seq") -> nn.Module:
    """A fresh normalisation layer ``kind`` in {LN, BN, RMS} over ``dim`` features in ``layout``."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    if kind == "LN":
        return nn.LayerNorm(dim, eps=EPS) if layout == "seq" else nn.GroupNorm(1, dim, eps=EPS)
    if kind == "RMS":
        return nn.RMSNorm(dim, eps=EPS) if layout == "seq" else ChannelRMSNorm(dim, eps=EPS)
    if kind == "BN":
        return FeatureBatchNorm(dim, eps=EPS) if layout == "seq" else nn.BatchNorm2d(dim, eps=EPS)
    raise ValueError(f"unknown normalisation {kind!r}; use one of {', '.join(NORMS)}")


def feature_axis(layout: str) -> int:
    """The axis that holds the C features: the last for ``seq``, 1 for ``conv``."""
    return -1 if layout == "seq" else 1


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
