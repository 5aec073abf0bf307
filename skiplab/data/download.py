"""Fetch one file over HTTP(S), verified by md5, without ever leaving a partial file behind.

The bytes go to a hidden temporary file in the destination's folder (same file system, so the final
rename is atomic); only once the md5 matches is it linked into place. An existing destination is
never overwritten: a file the user already has is used as it is, unchecked (the Debian package's
Fashion-MNIST files, for one, are recompressed and do not match the published md5s).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
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
    try:
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
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
    except BaseException:
        for folder in made:  # a mistyped folder is not left behind, made and empty
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    return dest


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
