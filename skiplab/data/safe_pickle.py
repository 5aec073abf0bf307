"""Read pickles that may hold only plain data and numpy arrays.

Unpickling runs whatever callable a file names, so a pickle from the web is code, not data. The
official CIFAR files are pickles (written by Python 2), so they are read through
:class:`RestrictedUnpickler`, whose ``find_class`` admits only the few globals that rebuild a numpy
array; anything else (``os.system``, ``builtins.eval``, ...) is refused before it can run.
Dicts, lists, tuples, bytes, strings and numbers are built by pickle opcodes and need no global.
"""

from __future__ import annotations

import _codecs
import io
import pickle
from typing import Any

import numpy as np

try:  # numpy >= 2 keeps the implementation in numpy._core; importing numpy.core warns there.
    from numpy._core.multiarray import _reconstruct
    from numpy._core.numeric import _frombuffer
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    from numpy.core.numeric import _frombuffer  # type: ignore[no-redef]

# (module, name) as written in the pickle -> the object to hand back. Resolved here, not imported by
# name at load time, so an allowed name can never be redirected to something else.
_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,  # written by numpy 1.x (the CIFAR files)
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,  # written by numpy 2.x
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,  # protocol >= 5 arrays, numpy 1.x
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,  # protocol >= 5 arrays, numpy 2.x
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _codecs.encode,  # how protocol 2 writes Python 3 bytes
}


class RestrictedUnpickler(pickle.Unpickler):
    """A ``pickle.Unpickler`` that only rebuilds plain data and numpy arrays."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refused to unpickle global {module}.{name} (only plain data and numpy arrays are allowed)"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused a persistent id (only plain data and numpy arrays are allowed)")


def safe_loads(data: bytes, source: str, encoding: str = "bytes") -> Any:
    """Unpickle ``data`` with :class:`RestrictedUnpickler`; ``source`` names the file in errors.

    ``encoding="bytes"`` keeps Python 2 ``str`` as ``bytes`` (so the CIFAR dict keys are ``b"data"``).
    Any failure, a refused global or a truncated/corrupt stream, becomes a one-line ``ValueError``.
    """
    try:
        return RestrictedUnpickler(io.BytesIO(data), encoding=encoding).load()
    except pickle.UnpicklingError as exc:
        message = str(exc)
        if message.startswith("refused"):
            raise ValueError(f"{source}: {message}") from None
        raise ValueError(f"{source}: corrupt or truncated pickle ({_one_line(message)})") from None
    # A damaged stream can fail in many ways (EOF, bad opcode arguments, numpy rejecting the state).
    except Exception as exc:  # noqa: BLE001 - every failure must become the one clear error
        detail = _one_line(f"{type(exc).__name__}: {exc}")
        raise ValueError(f"{source}: corrupt or truncated pickle ({detail})") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())
