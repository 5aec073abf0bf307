"""Where training and decoding run."""

from __future__ import annotations

import torch


def pick_device(name: str) -> torch.device:
    """``auto``: CUDA where present, else the CPU; otherwise the device named (cpu, cuda, cuda:1, ...)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}; use cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but CUDA is not available here")
    return device
