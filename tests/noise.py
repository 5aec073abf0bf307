"""Tolerances for comparing two float32 computations of the same math, set from float32 noise measured on
the machine the test runs on, not tuned to one CPU.

Two float32 computations of one formula that differ only in the order of their sums (thread count, vector
width of the instruction set, a compiler's fusion, a batch of many against a batch of one) differ by
rounding: each is off the exact result by its float32 error. A test measures that error as the distance of
a float32 result from the same computation in float64 (2^29 times finer), and allows

    |actual − expected| <= FACTOR · noise,   noise = max over pairs (x, x64) of max|x − x64|,

per tensor, floored at eps32 · max|x64| (one float32 ulp of the largest entry: a float32 result carries at
least its own rounding, so the noise is never zero where two float32 computations can differ). The pairs
are the float32 reference against its float64 run and, where the test can run it in float64, the actual
computation against its own: kernels differ in accuracy, so one side's error alone may be too small.

Training through ReLUs needs one more pair. Where a pre-activation lies within its float32 error of zero,
rounding decides whether the ReLU passes its gradient; in the two SGD steps of the PreAct-ResNet-8 of
tests/train/test_image.py one such flip moves stem.weight by 4.6e-4 (1.3e-3 of its largest entry), against
2.7e-7 of smooth rounding. Whether a float32 run flips one is chance (of 8 seeds the eager run flipped in 3,
the compiled run in 4, the same in 2), and even without a flip |compiled − eager| in the last BatchNorm's
bias was 20-50 times eager's own error: over all tensors it reached 2.2e4 times |eager − float64|. The
spread over thread counts is no better (1 against 2 threads: at most 3e-7, exactly 0 for some tensors). So
such tests add the pair (float64 run on inputs :func:`perturbed` to x·(1 + δu), u ~ U(−1, 1); the float64
run), δ = DELTA = 2^-16 = 128 eps32: about the float32 error of the model's pre-activations (≈ √n · eps32
for the n ≈ 3·10^4 terms of a batch's BatchNorm statistics; measured up to 5e-6 on values of order 1), so
that its kinks flip as a float32 run's may.

FACTOR = 16. The worst ratio |actual − expected| / noise over each test's tensors, measured here (AVX-512)
and with the kernels of AVX2 and of no vector unit (ATEN_CPU_CAPABILITY=avx2 / default, ONEDNN_MAX_CPU_ISA,
inductor's cpp.simdlen = 256 / 1): compiled-vs-eager training 1.00 (8 seeds: 1.00, 0.10, 0.02, 0.03, 0.65,
0.09, 0.74, 0.15; AVX2 0.14, none 0.52); two processes with synchronised BatchNorm against one 2.4-3.2 over
5 seeds, AVX2 2.9-3.8 (running means and biases that are 0 in exact arithmetic: rounding on both sides);
beam search against rescoring 2.1; cached decoding against full recomputation 1.4; the others below 1.8.
Two independent errors of one size give about 2; 16 leaves a margin of 4 over the worst seen, and still
catches real differences: in the compiled-vs-eager test lr 0.099 for 0.1 (67 times the tolerance), no
weight decay (2.5 times), any one of 31 of its 39 tensors scaled by 1.01; see also tests/test_noise.py.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager

import torch
import torch.nn.functional as F

FACTOR = 16.0
DELTA = 2.0**-16
EPS32 = torch.finfo(torch.float32).eps


def _f64(x) -> torch.Tensor:
    return torch.as_tensor(x).detach().to(torch.float64)


def noise(*pairs) -> float:
    """max over the (x, x64) pairs of max|x − x64|, at least eps32 · max|x64|: the measured float32 error."""
    error = max(float((_f64(x) - _f64(x64)).abs().max()) for x, x64 in pairs)
    return max(error, max(EPS32 * float(_f64(x64).abs().max()) for _, x64 in pairs))


def assert_within_noise(actual, expected, noise_level: float, msg: str | None = None) -> None:
    """|actual − expected| <= FACTOR · noise_level everywhere (integer tensors: equal)."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    if not expected.is_floating_point():
        assert torch.equal(actual, expected), msg
        return
    torch.testing.assert_close(_f64(actual), _f64(expected), rtol=0, atol=FACTOR * noise_level, msg=msg)


def perturbed(x: torch.Tensor, delta: float = DELTA, seed: int = 0) -> torch.Tensor:
    """x · (1 + δu), u ~ U(−1, 1) from ``seed``."""
    u = 2 * torch.rand(x.shape, generator=torch.Generator().manual_seed(seed), dtype=x.dtype) - 1
    return x * (1 + delta * u)


@contextmanager
def image_training_in_float64(delta: float = 0.0):
    """``skiplab.train.image.train`` (one process) in float64: the model built as ever, then cast (the same
    initial weights); the loss without its float32 cast; with ``delta``, every batch of images
    :func:`perturbed` (batch k with seed k)."""
    from skiplab.train import image

    build, normalise, share_loss = image.build, image.normalise, image.share_loss
    calls = itertools.count()

    def build64(cfg, data):
        mcfg, model = build(cfg, data)
        return mcfg, model.double()

    def normalise64(x, mean, std):
        x = normalise(x, mean, std).double()
        return perturbed(x, delta, next(calls)) if delta else x

    def share_loss64(logits, y, union, group):
        assert not group.active, "a float64 reference is a one-process run"
        return F.cross_entropy(logits, y)

    image.build, image.normalise, image.share_loss = build64, normalise64, share_loss64
    try:
        yield
    finally:
        image.build, image.normalise, image.share_loss = build, normalise, share_loss
