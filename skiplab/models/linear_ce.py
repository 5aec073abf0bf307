"""The output layer and its cross-entropy as one function: next-token loss without keeping the (N, V) logits.

    z = h Wᵀ,   loss = (1/n) Σ_{i: y_i ≠ ignore} [logsumexp_v z_iv − z_{i,y_i}]   (h: N×D, W: V×D; n scored)

    ∂z = (softmax(z) − onehot(y)) / n   (0 on ignored rows),   ∂h = ∂z W,   ∂W = ∂zᵀ h

``impl`` chooses how (:func:`linear_cross_entropy`):

  eager    ``F.linear`` then ``F.cross_entropy`` (in float32 from bf16 or fp16): autograd keeps the N×V
           log-probabilities for the backward and makes an N×V gradient there (at GPT-2's shape, 8 × 1,024 rows
           and V = 50,304: 1.6 GB each in float32).
  chunked  the rows in chunks; per chunk its logits, its loss, and its ∂z (known in the forward, because the loss
           is the last operation and its gradient is a scalar away) turned at once into the chunk's ∂h and its
           share of ∂W (accumulated in float32 or wider). The backward multiplies ∂h and ∂W by the incoming
           scalar. Only one chunk's logits exist at a time; ∂h (N×D) and ∂W (V×D) are kept instead of N×V. The
           design of Liger Kernel's ``LigerFusedLinearCrossEntropyFunction`` (Hsu et al. 2024, "Liger Kernel:
           Efficient Triton Kernels for LLM Training"; after mgmalek/efficient_cross_entropy), written in PyTorch
           operators, so it runs on any device.
  liger    liger-kernel's own function (Triton, CUDA only), imported when asked (``pip install liger-kernel``).

Under autocast (CUDA bf16) chunked does what eager does: the logits come from a matmul in the autocast dtype and
are taken to float32 for the softmax; ∂z goes back to that dtype for the two matmuls of the gradient.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..connections.second_order import graph_wanted, in_plain_formulas, transforming

IMPLS = ("eager", "chunked", "liger")
REDUCTIONS = ("mean", "sum")
MIN_CHUNK = 256  # rows: 32-row chunks took 1.6x the step on a CPU (benchmarks/head_loss_memory.py's record)
_ADDMM_OUT_DTYPE = torch.__version__ >= "2.8"  # addmm(..., out_dtype=): CUDA only


def default_chunk(rows: int, vocab: int, dim: int) -> int:
    """Rows per chunk: one chunk's logits about as many numbers as h (rows × dim), ⌈rows / ⌈V/D⌉⌉ (Liger's budget,
    there rounded to a power of two), but at least :data:`MIN_CHUNK` rows (or all of them)."""
    return max(min(rows, MIN_CHUNK), math.ceil(rows / max(1, math.ceil(vocab / dim))))


def wide(z: Tensor) -> Tensor:
    """Logits for the softmax: float32 from a half-width dtype, float32 and float64 as they are."""
    return z.float() if z.dtype.itemsize < 4 else z


def _compute_dtype(h: Tensor) -> torch.dtype:
    kind = h.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else h.dtype


class _ChunkedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, targets: Tensor, ignore_index: int, reduction: str,
                chunk: int) -> Tensor:
        dtype = _compute_dtype(h)
        want_h, want_w = h.requires_grad, weight.requires_grad
        with torch.autocast(h.device.type, enabled=False):
            w = weight.to(dtype)
            scored = targets != ignore_index
            n = int(scored.sum()) if reduction == "mean" else 1
            scale = 1.0 / n if n else math.nan  # every row ignored: the mean is 0/0, as F.cross_entropy's
            acc = torch.float32 if dtype.itemsize < 4 else dtype  # the logits' dtype for the softmax (wide)
            loss = torch.zeros((), dtype=acc, device=h.device)
            dh = torch.empty_like(h) if want_h else None
            dw = torch.zeros(weight.shape, dtype=acc, device=h.device) if want_w else None
            for start in range(0, h.shape[0], chunk):
                hc = h[start : start + chunk].to(dtype)
                yc, keep = targets[start : start + chunk], scored[start : start + chunk]
                z = wide(hc @ w.T)  # the chunk's logits, as eager's
                lse = torch.logsumexp(z, dim=1)
                picked = z.gather(1, yc.clamp(min=0).unsqueeze(1)).squeeze(1)
                loss += torch.where(keep, lse - picked, 0.0).sum()
                if not (want_h or want_w):
                    continue
                dz = z.sub_(lse.unsqueeze(1)).exp_()  # the softmax, made in z's memory (z is not needed again)
                rows = torch.arange(dz.shape[0], device=dz.device)
                dz[rows, yc.clamp(min=0)] -= 1.0
                dz *= (keep.to(dz.dtype) * (scale if n else 0.0)).unsqueeze(1)
                dz = dz.to(dtype)
                if want_h and dz.dtype == dh.dtype:
                    torch.mm(dz, w, out=dh[start : start + chunk])
                elif want_h:
                    dh[start : start + chunk] = (dz @ w).to(h.dtype)
                if want_w and dz.dtype == dw.dtype:
                    dw.addmm_(dz.T, hc)  # into ∂W in place: the product's V×D result is not made apart and added
                elif want_w and dw.is_cuda and _ADDMM_OUT_DTYPE:  # bf16 products summed into float32 in place
                    torch.addmm(dw, dz.T, hc, out_dtype=dw.dtype, out=dw)
                elif want_w:
                    dw += (dz.T @ hc).to(dw.dtype)
        ctx.save_for_backward(dh, dw.to(weight.dtype) if dw is not None else None)
        return loss * scale if reduction == "mean" else loss

    @staticmethod
    def backward(ctx, grad: Tensor):
        if graph_wanted():  # a second derivative (skiplab.connections.second_order)
            raise RuntimeError("the chunked head loss makes its gradient in the forward and keeps no logits, so it has "
                               "no second derivative: use head_loss eager, or run inside skiplab.plain_formulas()")
        dh, dw = ctx.saved_tensors
        return (None if dh is None else dh * grad.to(dh.dtype), None if dw is None else dw * grad.to(dw.dtype),
                None, None, None, None)


def _liger():
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    except ImportError as e:
        raise ValueError(f"head loss 'liger' could not import liger-kernel's fused linear cross-entropy (pip install "
                         f"liger-kernel; it needs Triton): {e}") from None
    return LigerFusedLinearCrossEntropyFunction


def _liger_loss(h: Tensor, weight: Tensor, targets: Tensor, ignore_index: int, reduction: str) -> Tensor:
    """liger-kernel's function on (N, D) states: no bias, no class weights, no z-loss, no label smoothing."""
    return _liger().apply(h, weight, targets, None, None, ignore_index, 0.0, 0.0, reduction)[0]


def linear_cross_entropy(h: Tensor, weight: Tensor, targets: Tensor, impl: str = "chunked", *,
                         ignore_index: int = -100, reduction: str = "mean", chunk: int | None = None) -> Tensor:
    """Cross-entropy of the logits ``h @ weight.T`` against ``targets``, as ``F.cross_entropy`` takes it:
    ``h`` (..., D), ``weight`` (V, D), ``targets`` (...) of class indices in [0, V) or ``ignore_index``. ``impl``
    one of :data:`IMPLS` (module docstring); ``chunk`` the rows a chunk takes (chunked; default
    :func:`default_chunk`). A bad argument raises ValueError naming it."""
    if impl not in IMPLS:
        raise ValueError(f"head loss {impl!r} is not one of {', '.join(IMPLS)}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction {reduction!r} is not one of {', '.join(REDUCTIONS)}")
    if weight.dim() != 2 or h.shape[-1] != weight.shape[1]:
        raise ValueError(f"h's last dimension ({h.shape[-1]}) must match the weight's columns "
                         f"(weight of shape {tuple(weight.shape)})")
    if h.shape[:-1] != targets.shape:
        raise ValueError(f"targets of shape {tuple(targets.shape)} do not match h's rows {tuple(h.shape[:-1])}")
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be a positive number of rows, got {chunk}")
    h, targets = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
    if impl == "eager" or in_plain_formulas() or transforming():  # eager's: autograd's to any order, torch.func's
        return F.cross_entropy(wide(F.linear(h, weight)), targets, ignore_index=ignore_index, reduction=reduction)
    return _fused(h, weight, targets, impl, ignore_index, reduction, chunk)


@torch.compiler.disable  # data-dependent checks and a loop of chunks: run eagerly, a compiled graph ends before it
def _fused(h: Tensor, weight: Tensor, targets: Tensor, impl: str, ignore_index: int, reduction: str,
           chunk: int | None) -> Tensor:
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= weight.shape[0]))
    if bool(bad.any()):
        raise ValueError(f"target {int(targets[bad][0])} is out of bounds for {weight.shape[0]} classes")
    if impl == "liger":
        if h.device.type != "cuda":
            raise ValueError(f"head loss 'liger' runs on CUDA only (h is on {h.device.type}); 'chunked' is the same "
                             f"computation in PyTorch")
        return _liger_loss(h, weight, targets, ignore_index, reduction)
    rows = chunk or default_chunk(h.shape[0], weight.shape[0], weight.shape[1])
    return _ChunkedLinearCE.apply(h, weight, targets, ignore_index, reduction, rows)
