"""Fetch one file over HTTP(S), verified by md5, without ever leaving a partial file behind.

The bytes go to a hidden temporary file in the destination's folder (same file system, so the final
rename is atomic), named with the downloading process's id; only once the md5 matches is it linked into place. A
download stopped by an error, Ctrl-C or SIGTERM removes its file; one killed outright (SIGKILL) leaves it, and the
next download of the same file removes it, its process being gone. An existing destination is
never overwritten: a file the user already has is used as it is, unchecked (the Debian package's
Fashion-MNIST files, for one, are recompressed and do not match the published md5s).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import signal
import tempfile
import threading
import urllib.request
from pathlib import Path
from typing import BinaryIO
from urllib.error import HTTPError, URLError

TIMEOUT_S = 30.0
_CHUNK = 1 << 20
# URLError, HTTPError and socket timeouts are OSErrors; a cut connection can be IncompleteRead.
_NETWORK_ERRORS = (OSError, http.client.HTTPException)


class DownloadError(ConnectionError):
    """The file could not be fetched (no network, server error); the message says where to put it."""


def download(url: str, dest: Path, md5: str | None, timeout: float = TIMEOUT_S) -> Path:
    """Fetch ``url`` to ``dest`` unless ``dest`` exists; check its md5 (``None``: no published checksum);
    return ``dest``.

    Raises :class:`DownloadError` when the network fails and ``ValueError`` on a checksum mismatch;
    either way nothing is left at ``dest`` or beside it, nor the folders made for it (where still empty);
    ``NotADirectoryError`` where a folder on the way is a file.
    """
    dest = Path(dest)
    if dest.exists():
        return dest
    blocked = next((p for p in dest.parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise NotADirectoryError(f"{blocked} is a file, not a folder that {dest.name} can be downloaded into")
    made = [p for p in dest.parents if not p.exists()]  # the folders mkdir makes, innermost first
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_parts(dest)
    try:
        with _terminated_as_exit():
            _download(url, dest, md5, timeout)
    except BaseException:
        for folder in made:  # a mistyped folder is not left behind, made and empty
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    return dest


def _download(url: str, dest: Path, md5: str | None, timeout: float) -> None:
    """:func:`download`'s fetch into the temporary file, checked and put in place; the file removed whatever
    happens."""
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.{os.getpid()}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            actual = _fetch(url, dest, out, timeout)
        if md5 is not None and actual != md5:
            raise ValueError(f"{url}: checksum mismatch for {dest.name}: expected md5 {md5}, got {actual}; "
                             "the download was deleted")
        _place(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _remove_stale_parts(dest: Path) -> None:
    """Remove the temporary files of ``dest`` left by downloads whose process is gone (killed outright)."""
    for part in dest.parent.glob(f".{dest.name}.*.part"):
        found = re.fullmatch(rf"\.{re.escape(dest.name)}\.(\d+)\.[^.]+\.part", part.name)
        if found and not _alive(int(found.group(1))):
            part.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's included: signalling it is refused, not unknown)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


@contextlib.contextmanager
def _terminated_as_exit():
    """Within the block, SIGTERM (``timeout``, a job scheduler) exits through Python, as Ctrl-C does, so that the
    download's clean-up runs; the signal's own handler again after. Only the main thread can set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)  # None: set outside Python


def _fetch(url: str, dest: Path, out: BinaryIO, timeout: float) -> str:
    """Stream ``url`` into ``out``; return the hex md5 of what was written."""
    digest = hashlib.md5(usedforsecurity=False)
    try:
        response = urllib.request.urlopen(url, timeout=timeout)
    except _NETWORK_ERRORS as exc:
        raise _offline(url, dest, exc) from None
    with response:
        while True:
            # Only the network calls are wrapped: a local write error (disk full) is not "offline".
            try:
                chunk = response.read(_CHUNK)
            except _NETWORK_ERRORS as exc:
                raise _offline(url, dest, exc) from None
            if not chunk:
                return digest.hexdigest()
            digest.update(chunk)
            out.write(chunk)


def _offline(url: str, dest: Path, exc: BaseException) -> DownloadError:
    # URLError wraps the real cause in .reason; HTTPError's str() already says "HTTP Error 404: ...".
    cause = exc.reason if isinstance(exc, URLError) and not isinstance(exc, HTTPError) else exc
    reason = " ".join(str(cause).split()) or type(cause).__name__
    return DownloadError(
        f"could not download {url} ({reason}); this machine seems offline: "
        f"fetch that file elsewhere and put it at {dest}"
    )


def _place(tmp: Path, dest: Path) -> None:
    # os.link fails rather than overwrite, so a file that appeared meanwhile is kept as it is.
    try:
        os.link(tmp, dest)
    except FileExistsError:
        pass
    except OSError:  # a file system without hard links: rename, still atomic, after a last check
        if not dest.exists():
            os.replace(tmp, dest)
