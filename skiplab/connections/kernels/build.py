"""Build and load the C kernels of this folder with the system's C compiler, once per source and machine.

A kernel is one C file here (with the headers of this folder, which it may include), compiled twice (``REAL`` =
float and double, its functions suffixed ``_f32`` and ``_f64``) into one shared library and called through
``ctypes`` (which releases the GIL). The library is compiled for the processor it runs on (``-march=native``), so
the cache key holds the source and the headers, the compiler and its version, the flags and the processor's feature
flags: a cache shared by two kinds of machine keeps one library per kind. It lives in ``$SKIPLAB_KERNEL_CACHE``,
else ``$XDG_CACHE_HOME/skiplab/kernels``, else ``~/.cache/skiplab/kernels``. Built with ``-fopenmp`` where the
compiler has it, a kernel takes its threads from the OpenMP runtime PyTorch has already loaded (its
``libgomp.so.1``, found by that name), so it never competes with PyTorch's own threads; elsewhere it runs on one
thread. A build is written to a temporary name and renamed, so concurrent processes never load a half-written file.
``SKIPLAB_KERNELS=0`` turns every kernel off (the connections then run their eager formulas); so does a machine
without a C compiler, with one warning that says why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLAGS = ("-O3", "-fopenmp-simd", "-fPIC", "-std=c11", "-ffp-contract=fast")  # fast: a * b + c as one FMA
NATIVE = "-march=native"
OPENMP = "-fopenmp"  # threads from the OpenMP runtime PyTorch has loaded (libgomp.so.1); without it, one thread
TYPES = (("float", "f32"), ("double", "f64"))


def cache_dir() -> Path:
    """Where built kernels are kept (see the module docstring)."""
    if os.environ.get("SKIPLAB_KERNEL_CACHE"):
        return Path(os.environ["SKIPLAB_KERNEL_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "skiplab" / "kernels"


def enabled() -> bool:
    """False when ``SKIPLAB_KERNELS`` is set to 0, false, no or off."""
    return os.environ.get("SKIPLAB_KERNELS", "1").strip().lower() not in ("0", "false", "no", "off")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")


def _compile(cc: str, source: Path, out: Path, native: bool, openmp: bool = True) -> None:
    flags = [*FLAGS, *([NATIVE] if native else []), *([OPENMP] if openmp else [])]
    objects = []
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        for real, suffix in TYPES:
            obj = Path(tmp) / f"{suffix}.o"
            subprocess.run([cc, *flags, f"-I{HERE}", f"-DREAL={real}", f"-DNAME(x)=x##_{suffix}", "-c", str(source),
                            "-o", str(obj)], check=True, capture_output=True, text=True)
            objects.append(str(obj))
        lib = Path(tmp) / out.name
        subprocess.run([cc, "-shared", *([OPENMP] if openmp else []), *objects, "-o", str(lib), "-lm"], check=True,
                       capture_output=True, text=True)
        os.replace(lib, out)


def _build(name: str) -> Path:
    source = HERE / f"{name}.c"
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC, or install gcc or clang)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    headers = [h.read_text() for h in sorted(HERE.glob("*.h"))]  # what the sources include from this folder
    key = hashlib.sha256("\0".join([source.read_text(), *headers, cc, version, " ".join(FLAGS), NATIVE, OPENMP,
                                    platform.machine(), _cpu_flags()]).encode()).hexdigest()[:16]
    out = cache_dir() / f"{name}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    for native, openmp in ((True, True), (True, False), (False, False)):  # what this compiler can do
        try:
            _compile(cc, source, out, native=native, openmp=openmp)
            return out
        except subprocess.CalledProcessError as err:
            failure = err
    raise failure


def typed(lib: ctypes.CDLL | None, signatures: dict) -> ctypes.CDLL | None:
    """``lib`` with each function of ``signatures`` ({name: (argument types, result type)}) typed in both of its
    builds (``name_f32``, ``name_f64``), once; None stays None."""
    if lib is not None and not getattr(lib, "_typed", False):
        for name, (args, result) in signatures.items():
            for _, suffix in TYPES:
                fn = getattr(lib, f"{name}_{suffix}")
                fn.argtypes, fn.restype = args, result
        lib._typed = True
    return lib


def load(name: str) -> ctypes.CDLL | None:
    """The kernel ``name`` (``<name>.c`` in this folder), built if need be; None where kernels are turned off or
    cannot be built here (one warning names the reason, once per kernel and process)."""
    return _load(name) if enabled() else None


@functools.cache
def _load(name: str) -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(str(_build(name)))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as err:
        lines = (getattr(err, "stderr", None) or str(err) or type(err).__name__).strip().splitlines()
        warnings.warn(f"skiplab: the {name} kernel could not be built ({lines[-1] if lines else type(err).__name__}); "
                      "the eager formula runs instead", RuntimeWarning, stacklevel=2)
        return None
