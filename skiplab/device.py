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


# Dense bf16 tensor-core peak, TFLOP/s, by the exact name ``torch.cuda.get_device_name`` reports (the vendors' data
# sheets; the figures without sparsity). Matched whole, never by a part: an "NVIDIA RTX A1000" is no A100, and an
# H100 NVL or PCIe card is not the SXM module.
PEAK_BF16_TFLOPS = {
    "NVIDIA H100 80GB HBM3": 989.0,  # H100 SXM5
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H100 NVL": 835.0,
    "NVIDIA H200": 989.0,  # H200 SXM
    "NVIDIA H200 NVL": 835.0,
    "NVIDIA GH200 480GB": 989.0,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100-PCIE-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
    "NVIDIA B200": 2250.0,
    "NVIDIA L40S": 362.0,
}


def device_name(device: torch.device) -> str:
    """The device's name: the GPU's as CUDA reports it, else ``cpu``."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def peak_tflops(device: torch.device) -> float | None:
    """The dense bf16 peak of ``device`` where its exact name is in :data:`PEAK_BF16_TFLOPS`, else None (the CPU,
    or a card not in the table: see :func:`peak_note`)."""
    return PEAK_BF16_TFLOPS.get(device_name(device)) if device.type == "cuda" else None


def peak_note(device: torch.device) -> str:
    """Why a device has no model-FLOP utilisation, or '' where it has one."""
    if peak_tflops(device) is not None:
        return ""
    return f"no known peak for this device ({device_name(device)})"
