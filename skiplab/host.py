"""The machine a result comes from: what it is, how many CPU threads its kernels use, and how to name it.

Every run, table and benchmark records :func:`environment` (versions, the processor and the instruction set torch's
CPU kernels use, the GPU, the threads, the code's commit). :func:`machine_name` turns such a record into a short name
and :func:`machine_kind` into the kind of machine a paired comparison may pool (a processor and its kernels at fp32,
or a GPU and its precision). A CPU's kernels give the same bits for the same config only with a fixed thread count:
:func:`fix_threads` fixes it for the rest of the process.
"""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch


def processor() -> str:
    """The CPU's model name (/proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
    config on one machine with the same count make the same updates, to the bit (docs/images.md)."""
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


# -- the C library's allocator -------------------------------------------------------------------------------
# glibc's mallopt parameters (malloc.h) and the largest mmap threshold it accepts on a 64-bit machine
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
KEEP_MMAP_THRESHOLD = 32 << 20
KEEP_TRIM_THRESHOLD = 2**31 - 1
_kept: dict[str, Any] | None = None


def keep_freed_memory() -> dict[str, Any] | None:
    """Have glibc's malloc keep the memory the process frees for its next allocations, for the rest of the process,
    and return the settings (None where the C library is not glibc: nothing changed).

    PyTorch's CPU tensors come from malloc, and a training step frees at its end what the next step allocates
    again. By default glibc hands large free memory at the top of its heap back to the system (past the trim
    threshold, twice a threshold that moves with the sizes seen, at most 64 MiB) and serves an allocation larger
    than the mmap threshold from fresh pages: the next step then takes a page fault for every 4 KiB it writes
    first. ``mallopt(M_MMAP_THRESHOLD, 32 MiB)`` (the largest glibc takes) and ``mallopt(M_TRIM_THRESHOLD, 2 GiB)``
    keep that memory in the heap (glibc manual, "Memory Allocation Tunables"; the same as ``MALLOC_MMAP_THRESHOLD_``
    and ``MALLOC_TRIM_THRESHOLD_`` in the environment). The process then holds its peak heap; allocations larger
    than 32 MiB are still mapped and unmapped each time. Results are unchanged: only where memory comes from."""
    global _kept
    if _kept is not None:
        return _kept
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(_M_MMAP_THRESHOLD, KEEP_MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, KEEP_TRIM_THRESHOLD)):
        return None
    _kept = {"mmap_threshold": KEEP_MMAP_THRESHOLD, "trim_threshold": KEEP_TRIM_THRESHOLD}
    return _kept


def malloc_settings() -> dict[str, Any]:
    """What this process's malloc was told: :func:`keep_freed_memory`'s settings (None where it was not called or
    changed nothing) and the ``MALLOC_*``, ``GLIBC_TUNABLES`` and ``LD_PRELOAD`` variables that are set (glibc's
    tunables, another allocator)."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "GLIBC_TUNABLES")) or k == "LD_PRELOAD"}
    return {"kept": _kept, "env": env}


def git_state(folder: Path) -> tuple[str, bool | None]:
    """``(short commit, dirty)`` of the git checkout holding ``folder``: dirty where a tracked file under ``folder``
    differs from that commit (files git does not track are not code it ran); ``("", None)`` outside git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=folder, capture_output=True, text=True,
                                timeout=5).stdout.strip()
        if not commit:
            return "", None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "."], cwd=folder,
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "", None
    return commit, (bool(status.stdout.strip()) if status.returncode == 0 else None)


def environment() -> dict[str, Any]:
    """What produced a result: versions, the machine (CPU results depend on the processor's kernels: the
    instruction set torch's CPU kernels use is recorded), device, the CPU threads and how they were fixed
    (:func:`thread_settings`), and the code's git commit where there is one, with ``git_dirty``: whether the
    package's tracked files differ from that commit (a result of uncommitted code; None where git cannot say)."""
    commit, dirty = git_state(Path(__file__).resolve().parent)
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": processor(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        **thread_settings(),  # threads, interop_threads, mkl_dynamic, thread_env
        "malloc": malloc_settings(),
        # a copy of the tree without its .git (a device's working copy) names its commit in SKIPLAB_GIT_COMMIT
        "git_commit": commit or os.environ.get("SKIPLAB_GIT_COMMIT") or None,
        "git_dirty": dirty,
    }


def code_name(env: dict[str, Any]) -> str:
    """The code version an ``environment()`` record names: its commit, "+uncommitted" where the package differed from
    it (``git_dirty``), "unknown" where none was recorded."""
    commit = env.get("git_commit") or "unknown"
    return f"{commit}+uncommitted" if env.get("git_dirty") else commit


def machine_name(env: dict[str, Any]) -> str:
    """A short name of the machine an ``environment()`` record describes: its GPU, else its CPU and the
    instruction set torch's kernels used (e.g. "Intel Xeon Processor (AVX512)"); "unknown" if not recorded."""
    if env.get("cuda"):
        return str(env["cuda"])
    cpu = " ".join(str(env.get("cpu", "")).replace("(R)", "").replace("(TM)", "").split())
    if not cpu:
        return "unknown"
    return f"{cpu} ({env['cpu_capability']})" if env.get("cpu_capability") else cpu


def machine_kind(env: dict[str, Any], device: str, amp: bool) -> str:
    """The kind of machine a run trained on, what a paired comparison may pool: on a GPU its model and precision
    ("NVIDIA H100 80GB HBM3, bf16 autocast" or ", fp32"), on a CPU its model, the instruction set torch's kernels
    used and fp32 ("AMD EPYC (AVX512), fp32"; autocast is CUDA only). Two runs of one kind compute the same
    kernels at the same precision; of two kinds, a design's difference to its baseline may itself differ."""
    if str(device).startswith("cuda") and env.get("cuda"):
        return f"{env['cuda']}, {'bf16 autocast' if amp else 'fp32'}"
    cpu = machine_name({**env, "cuda": None})  # the processor and its kernel set
    return "unknown" if cpu == "unknown" else f"{cpu}, fp32"
