"""The Transformer recipe's formulas: learning-rate schedules and loss (checkpoint averaging: ``skiplab.run_dir``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


# the learning-rate schedules a run may name (MTTrainConfig.schedule): inverse_sqrt and vaswani are the curve of
# inverse_sqrt_lr, constant holds the peak after the warm-up (self-critical training's fixed rate)
SCHEDULES = ("inverse_sqrt", "vaswani", "constant")


def inverse_sqrt_lr(step: int, peak: float, warmup: int) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then decay with the inverse square root of the step:

        lr(s) = peak · min(s / warmup, sqrt(warmup / s))       (s = 1, 2, ...)

    This is Vaswani et al.'s d^-0.5 · min(s^-0.5, s · warmup^-1.5) with the constant d^-0.5 · warmup^-0.5
    named ``peak`` (the lr reached at s = warmup), as fairseq's ``inverse_sqrt`` schedule writes it.
    """
    s = max(step, 1)
    if warmup <= 0:
        return peak / math.sqrt(s)
    return peak * min(s / warmup, math.sqrt(warmup / s))


def peak_lr(schedule: str, lr: float, d_model: int, warmup: int) -> float:
    """The learning rate ``schedule`` reaches at the end of warm-up (s = warmup):

        inverse_sqrt   lr                                  (fairseq's form: the peak is given)
        vaswani        d_model^-0.5 · warmup^-0.5          (Eq. 3 of Vaswani et al. at s = warmup; ``lr`` unused)
        constant       lr                                  (held after the warm-up: :func:`schedule_lr`)

    Vaswani et al.'s Eq. 3, lr(s) = d_model^-0.5 · min(s^-0.5, s · warmup^-1.5), is :func:`inverse_sqrt_lr`'s
    curve with this peak, so both schedules run through that one function (the tests check it step by step).
    """
    if schedule in ("inverse_sqrt", "constant"):
        return lr
    if schedule == "vaswani":
        return d_model**-0.5 * warmup**-0.5
    raise ValueError(f"unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")


def schedule_lr(schedule: str, step: int, peak: float, warmup: int) -> float:
    """The learning rate of update ``step`` (1, 2, ...): :func:`inverse_sqrt_lr`'s curve, or for ``constant`` a
    linear warm-up to ``peak`` that then holds it: lr(s) = peak · min(1, s / warmup)."""
    if schedule == "constant":
        return peak * min(1.0, step / warmup) if warmup > 0 else peak
    return inverse_sqrt_lr(step, peak, warmup)


def label_smoothed_loss(logits: Tensor, target: Tensor, eps: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over the non-pad targets.

        loss = Σ_t [ (1 - ε) · (-log p(y_t)) + ε · (1/V) Σ_v (-log p(v)) ]

    (Szegedy et al. 2016; ε = 0.1 in Vaswani et al. 2017, Section 5.4). ``logits`` (..., V), ``target`` (...).
    """
    lprobs = F.log_softmax(logits.float(), dim=-1).reshape(-1, logits.shape[-1])
    target = target.reshape(-1)
    keep = target != pad_id
    nll = -lprobs.gather(1, target[:, None]).squeeze(1)
    smooth = -lprobs.mean(dim=1)
    loss = ((1.0 - eps) * nll + eps * smooth)[keep].sum()
    return loss, nll[keep].sum()
