"""Where training and decoding run, and with how many CPU threads."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

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


# -- the CPU's threads ---------------------------------------------------------------------------------------
# environment variables that set how many threads the CPU kernels use, whether a library may change that count
# while a run goes on, and MKL's code branch: recorded with every run where set
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_DYNAMIC", "MKL_DYNAMIC", "MKL_CBWR", "OMP_PROC_BIND",
              "KMP_AFFINITY", "GOMP_CPU_AFFINITY")


def fix_threads(threads: int = 0) -> dict[str, Any]:
    """Fix the number of threads the CPU kernels use for the rest of the process (``threads``, else the number the
    process has: ``OMP_NUM_THREADS`` or the cores) and return :func:`thread_settings`.

    ``torch.set_num_threads`` also turns MKL's dynamic thread choice off (``mkl_set_dynamic(0)``, which a process
    that never calls it leaves on): MKL computes the same product the same way only when its number of threads
    is fixed (oneMKL Developer Guide, "Reproducibility Conditions": a fixed number of threads, ``MKL_DYNAMIC`` and
    ``OMP_DYNAMIC`` false). torch's own kernels split their work by the thread count alone. So two runs of one
    config on one machine with the same count make the same updates, to the bit (docs/language-models.md)."""
    torch.set_num_threads(threads or torch.get_num_threads())
    return thread_settings()


def thread_settings() -> dict[str, Any]:
    """The thread count of torch's kernels (intra-op) and of its inter-op pool, whether MKL may change its thread
    count at run time (None where that cannot be read), and the :data:`THREAD_ENV` variables that are set."""
    return {"threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
            "mkl_dynamic": _mkl_dynamic(), "thread_env": {k: os.environ[k] for k in THREAD_ENV if k in os.environ}}


def _mkl_dynamic() -> bool | None:
    """MKL's dynamic thread choice (MKL_DYNAMIC) as the MKL linked into torch has it now; None without MKL or where
    the build does not expose it."""
    if not torch.backends.mkl.is_available():
        return None
    try:
        return bool(ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")).mkl_serv_get_dynamic())
    except (OSError, AttributeError):
        return None
