"""Batch augmentation and normalisation in torch: the CIFAR recipe of He et al. (2016).

"4 pixels are padded on each side, and a 32x32 crop is randomly sampled from the padded image or its
horizontal flip." Done on whole batches with one gather, on whatever device the batch is on.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def augment_batch(x: torch.Tensor, generator: torch.Generator, pad: int = 4, flip: bool = True) -> torch.Tensor:
    """Random crop (after zero padding) and random horizontal flip, independently per example.

    ``x`` is (B, C, H, W), uint8 or float. Each example gets its own crop offset, uniform over the
    (2 * pad + 1) ** 2 positions of an H x W window in the zero-padded image, and, when ``flip``, is
    mirrored left-right with probability 1/2. All randomness comes from ``generator`` (offsets first,
    then flips), so the same seed gives the same batch. Returns a new tensor of ``x``'s shape and dtype.
    """
    if x.dim() != 4:
        raise ValueError(f"augment_batch: expected a batch (B, C, H, W), found shape {tuple(x.shape)}")
    if pad < 0:
        raise ValueError(f"augment_batch: pad must be >= 0, found {pad}")
    b, c, h, w = x.shape
    # Draw on the generator's device (a CPU generator cannot feed a CUDA randint), then move.
    gen_device = generator.device
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=generator, device=gen_device).to(x.device)
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=generator, device=gen_device).to(x.device)
    rows = dy[:, None] + torch.arange(h, device=x.device)  # (B, H) rows of the padded image
    cols = dx[:, None] + torch.arange(w, device=x.device)  # (B, W)
    if flip:
        mirror = torch.randint(0, 2, (b,), generator=generator, device=gen_device).to(x.device).bool()
        # Reading the window's columns right to left is the crop of the mirrored image.
        cols = torch.where(mirror[:, None], cols.flip(1), cols)
    padded = F.pad(x, (pad, pad, pad, pad)) if pad else x
    batch = torch.arange(b, device=x.device)[:, None, None, None]
    channel = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]


def normalise(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """float32 ``(x / 255 - mean[c]) / std[c]`` for raw 0..255 images ``x`` of shape (..., C, H, W)."""
    channels = x.shape[-3] if x.dim() >= 3 else -1
    if len(mean) != channels or len(std) != channels:
        raise ValueError(
            f"normalise: {len(mean)} means and {len(std)} stds for {channels} channels (shape {tuple(x.shape)})"
        )
    m = torch.as_tensor(mean, dtype=torch.float32, device=x.device).view(-1, 1, 1)
    s = torch.as_tensor(std, dtype=torch.float32, device=x.device).view(-1, 1, 1)
    return (x.to(torch.float32) / 255 - m) / s
