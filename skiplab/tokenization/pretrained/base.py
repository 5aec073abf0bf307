"""What every pretrained tokenizer shares: its stored form, the end-of-text id, and reading its file.

A pretrained tokenizer is the file it was read from (``payload``: the bytes of a sentencepiece ``.model``, a
``tokenizer.json``, a ``.tiktoken`` ranks file) and the few facts that file does not say by itself (``header``:
the end-of-text id, the tiktoken encoding's name). Its stored form, in a run and every checkpoint, is::

    skiplab:pretrained-tokenizer\\n      the mark (:data:`MARK`)
    {"kind": "hf", "eot": 50256, ...}\\n  the header, one line of JSON
    <payload>                           the file's bytes, as read

so that :func:`skiplab.tokenization.pretrained.load_pretrained` rebuilds it with no file access.

These tokenizers read text, not bytes: a lone surrogate (a byte that was not UTF-8, see
:mod:`skiplab.corpora.documents`) is read as U+FFFD. Whether decoding an encoding gives the text back exactly is
the tokenizer's own property: byte-level BPE (GPT-2, GPT-NeoX, LLaMA-3, tiktoken) does; a sentencepiece model
that normalises text or has no byte fallback (T5's ``spiece.model``) does not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

MARK = b"skiplab:pretrained-tokenizer\n"
_SURROGATE = re.compile("[\ud800-\udfff]")


class PretrainedTokenizer:
    """A tokenizer read from a file of an outside format; documents are joined with its ``eot`` id.

    A subclass sets ``kind`` and ``file_name`` (the name of the copy written into a run directory), builds its
    library's object in ``__init__(payload, header, where)`` and implements ``_encode`` and ``_decode``."""

    kind = ""
    file_name = ""

    def __init__(self, payload: bytes, header: dict[str, Any], where: str) -> None:
        self.payload, self.header, self.where = payload, dict(header), where
        self.eot: int = int(header.get("eot", -1))
        self.vocab_size: int = 0

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, with no BOS, EOS or other token added."""
        return self._encode(_SURROGATE.sub("\ufffd", text))

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.uint32)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``; end of text is skipped."""
        kept = [i for i in map(int, ids) if i != self.eot]
        for i in kept:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"id {i} is out of range for a vocabulary of {self.vocab_size}")
        return self._decode(kept)

    def to_bytes(self) -> bytes:
        """The stored form (the module docstring): the mark, the header, the file."""
        header = json.dumps({"kind": self.kind, **self.header}, ensure_ascii=True, sort_keys=True)
        return MARK + header.encode("ascii") + b"\n" + self.payload

    def write(self, folder: str | Path) -> Path:
        """A copy of the file, ``folder/<file_name>``, for tools that read the format itself."""
        path = Path(folder) / self.file_name
        path.write_bytes(self.payload)
        return path

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, eot={self.eot})"

    def _encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def _decode(self, ids: list[int]) -> str:
        raise NotImplementedError


def read_file(path: str | Path, what: str, spec: str) -> bytes:
    """The bytes of ``path``, or a one-line FileNotFoundError saying which file was looked for, and where."""
    path = Path(path).expanduser()
    if not path.is_file():
        where = "" if path.is_absolute() else f" (looked for {path.resolve()})"
        raise FileNotFoundError(f"{path}: no such {what}{where}, from --tokenizer {spec}")
    return path.read_bytes()


def require(module: str, install: str, kind: str):
    """``import module``, or a one-line error saying what to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{kind} tokenizers need the {module} package: pip install {install}") from None


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
