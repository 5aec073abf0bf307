"""Documentation files to plain prose: HTML pages, manual pages, reStructuredText and plain text.

>>> from skiplab.corpora.prose import to_text
>>> to_text("html", b"<html><body><p>A <b>bold</b> claim.</p><script>x()</script></body></html>")
'A bold claim.'

Each kind has its converter (:mod:`~skiplab.corpora.prose.html`, :mod:`~skiplab.corpora.prose.man`,
:mod:`~skiplab.corpora.prose.rst`; plain text is taken as it is), and every result is finished the same way
(:func:`~skiplab.corpora.prose.clean.clean`: tables of numbers dropped, blank lines squeezed).
"""

from __future__ import annotations

import gzip
from collections.abc import Callable

from .clean import clean, text_key
from .html import html_to_text
from .man import man_to_text
from .rst import rst_to_text

CONVERTERS: dict[str, Callable[[str], str]] = {"html": html_to_text, "man": man_to_text, "rst": rst_to_text,
                                               "txt": lambda text: text}
_GZIP_MAGIC = b"\x1f\x8b"


def decode(data: bytes) -> str | None:
    """The text of a file's bytes: gunzipped when gzip (by its magic bytes), UTF-8, else Latin-1 (every byte is
    a Latin-1 character, so older pages still read); a leading byte-order mark and carriage returns dropped.
    None for a binary file (a NUL byte in it)."""
    if data.startswith(_GZIP_MAGIC):
        data = gzip.decompress(data)
    if b"\x00" in data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def to_text(kind: str, data: bytes) -> str:
    """The prose of a file of ``kind`` (a key of :data:`CONVERTERS`) from its bytes; "" for a binary file."""
    if kind not in CONVERTERS:
        raise ValueError(f"unknown document kind {kind!r}; known: {', '.join(CONVERTERS)}")
    text = decode(data)
    return clean(CONVERTERS[kind](text)) if text is not None else ""


__all__ = ["CONVERTERS", "clean", "decode", "html_to_text", "man_to_text", "rst_to_text", "text_key", "to_text"]
