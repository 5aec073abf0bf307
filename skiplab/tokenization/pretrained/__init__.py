"""Pretrained tokenizers, read from local files in their own formats; each format's library is imported only
when a tokenizer of it is read or rebuilt.

How ``--tokenizer`` names one (:func:`parse_pretrained`)::

    sentencepiece:FILE             a sentencepiece .model (T5's spiece.model, LLaMA-2's tokenizer.model)
    hf:FILE                        a Hugging Face tokenizer.json (or a folder holding one)
    tiktoken:NAME:FILE             tiktoken encoding NAME (gpt2, r50k_base, p50k_base, cl100k_base, o200k_base)
                                   with its ranks from FILE (NAME.tiktoken; for gpt2 also the folder of GPT-2's
                                   encoder.json and vocab.bpe)
    KIND(eot=TOKEN):...            the end-of-text token named, where the file names none, or several

e.g. ``sentencepiece:t5/spiece.model``, ``hf:gpt2/tokenizer.json``, ``hf(eot=<|im_end|>):qwen``,
``tiktoken:cl100k_base:cl100k_base.tiktoken``. What each reads, and how it finds end of text:
:mod:`.sentencepiece_model`, :mod:`.hf_tokenizer`, :mod:`.tiktoken_encoding`. The stored form, which
:func:`load_pretrained` rebuilds with no file access: :mod:`.base`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .base import MARK, PretrainedTokenizer, one_line
from .hf_tokenizer import HFTokenizer
from .sentencepiece_model import SentencepieceModel
from .tiktoken_encoding import ENCODINGS, TiktokenEncoding

KINDS: dict[str, type[PretrainedTokenizer]] = {"sentencepiece": SentencepieceModel, "hf": HFTokenizer,
                                               "tiktoken": TiktokenEncoding}
FORMS = ("sentencepiece:FILE", "hf:FILE", "tiktoken:NAME:FILE")
_SPEC = re.compile(r"(?P<kind>[a-z]+)(?:\((?P<options>[^)]*)\))?:(?P<rest>.*)", re.DOTALL)


@dataclass(frozen=True)
class PretrainedSpec:
    """A parsed ``--tokenizer`` of a pretrained kind."""

    kind: str
    path: str
    encoding: str = ""  # tiktoken's encoding name
    eot: str = ""  # the end-of-text token, where named


def parse_pretrained(spec: str) -> PretrainedSpec | None:
    """``spec`` parsed (the grammar of the module docstring); None where it names no pretrained kind, a one-line
    ValueError where it names one badly. The file is not read."""
    m = _SPEC.fullmatch(spec)
    if not m or m["kind"] not in KINDS:
        return None
    kind, rest, options = m["kind"], m["rest"], m["options"]
    eot = options.removeprefix("eot=") if options is not None else ""
    if options is not None and (eot == options or not eot):
        raise ValueError(f"--tokenizer {spec}: unknown option {options!r}; {kind}(eot=TOKEN):... is the one option")
    encoding = ""
    if kind == "tiktoken":
        encoding, colon, rest = rest.partition(":")
        if encoding not in ENCODINGS:
            raise ValueError(f"--tokenizer {spec}: unknown tiktoken encoding {encoding!r}; known: "
                             f"{', '.join(ENCODINGS)} (tiktoken:NAME:FILE)")
        if not colon:
            rest = ""
    if not rest:
        form = next(f for f in FORMS if f.startswith(kind))
        raise ValueError(f"--tokenizer {spec}: no file given ({form})")
    return PretrainedSpec(kind, rest, encoding, eot)


def read_pretrained(spec: str) -> PretrainedTokenizer:
    """The tokenizer ``spec`` names, read from its file (a one-line FileNotFoundError or ValueError naming the
    file where it is absent or is not what the kind reads)."""
    parsed = parse_pretrained(spec)
    if parsed is None:
        raise ValueError(f"--tokenizer {spec}: not a pretrained tokenizer; known forms: {', '.join(FORMS)}")
    if parsed.kind == "tiktoken":
        return TiktokenEncoding.read(parsed.encoding, parsed.path, parsed.eot, spec)
    return KINDS[parsed.kind].read(parsed.path, parsed.eot, spec)


def is_pretrained(data: bytes) -> bool:
    """Whether ``data`` is a pretrained tokenizer's stored form."""
    return data.startswith(MARK)


def load_pretrained(data: bytes, where: str = "tokenizer bytes") -> PretrainedTokenizer:
    """The tokenizer whose stored form (:meth:`PretrainedTokenizer.to_bytes`) ``data`` is."""
    if not is_pretrained(data):
        raise ValueError(f"{where}: not a stored pretrained tokenizer")
    line, _, payload = data[len(MARK):].partition(b"\n")
    try:
        header = json.loads(line)
        cls = KINDS[header["kind"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{where}: a stored pretrained tokenizer with a bad header ({one_line(exc)})") from None
    return cls(payload, header, f"{where} ({header['kind']})")


__all__ = ["FORMS", "KINDS", "PretrainedSpec", "PretrainedTokenizer", "is_pretrained", "load_pretrained",
           "parse_pretrained", "read_pretrained"]
