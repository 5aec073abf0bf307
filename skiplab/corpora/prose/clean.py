"""What every converter's text goes through: blank lines squeezed, tables of numbers dropped, and the key two
documents are compared by.

A *numeric token* is a whitespace-separated word made of digits, hexadecimal digits after ``0x``, and the
punctuation of numbers (``.,:;%+-/()[]|``), with at least one digit: ``42``, ``0x1f``, ``-3.5%``, ``12:30``,
``[0]``. A *numeric line* has at least :data:`MIN_TOKENS` tokens, at least :data:`NUMERIC_SHARE` of them numeric.
A run of at least :data:`MIN_RUN` numeric lines in a row is a table of numbers (a register map, a benchmark's
output, a hex dump) and is dropped; a numeric line alone, in prose, stays.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

MIN_TOKENS = 3
NUMERIC_SHARE = 0.75
MIN_RUN = 3
_NUMERIC = re.compile(r"^[-+.,:;%/()\[\]|#]*(?:0[xX][0-9a-fA-F]+|[0-9][0-9a-fA-FxX.,:;%/_-]*)[-+.,:;%/()\[\]|]*$")


def is_numeric_line(line: str) -> bool:
    tokens = line.split()
    if len(tokens) < MIN_TOKENS:
        return False
    numeric = sum(1 for t in tokens if _NUMERIC.match(t) and any(c.isdigit() for c in t))
    return numeric >= NUMERIC_SHARE * len(tokens)


def drop_number_tables(lines: list[str]) -> list[str]:
    """``lines`` without their runs of :data:`MIN_RUN` or more numeric lines (see the module docstring)."""
    flags = [is_numeric_line(line) for line in lines]
    kept: list[str] = []
    i = 0
    while i < len(lines):
        j = i
        while j < len(lines) and flags[j]:
            j += 1
        if j - i >= MIN_RUN:
            i = j
            continue
        kept.extend(lines[i : max(j, i + 1)])
        i = max(j, i + 1)
    return kept


def squeeze(lines: list[str]) -> list[str]:
    """The lines right-stripped, with no two blank lines in a row and none at the start."""
    kept: list[str] = []
    for line in lines:
        line = line.rstrip()
        if line or (kept and kept[-1]):
            kept.append(line)
    return kept


def clean(text: str) -> str:
    """A converter's text, finished: tables of numbers dropped, blank lines squeezed, no blank line at either end."""
    return "\n".join(squeeze(drop_number_tables(text.split("\n")))).strip("\n")


def text_key(text: str) -> str:
    """The hash two documents are the same by: SHA-256 of the text in Unicode NFKC, case-folded, its whitespace
    runs made single spaces (so a page converted twice, or shipped by two packages, is one document)."""
    norm = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    return hashlib.sha256(norm.encode("utf-8")).hexdigest()
