"""Tokenizers of the language models: UTF-8 bytes, sentencepiece subwords trained on the training split, or a
pretrained tokenizer read from its file.

Bytes and the trained subwords are lossless: decoding the encoding of any text gives it back exactly (bytes
trivially; the subword model keeps every space and newline and falls back to bytes for characters it has not
seen, see :meth:`skiplab.tokenization.Tokenizer.train`'s ``lossless``), so that the loss of a model is the loss of the
text itself and bits per byte compare across tokenizers. A pretrained tokenizer is lossless where its format is
(byte-level BPE is; T5's sentencepiece model normalises). Documents are joined with an end-of-text token, ``eot``.

    bytes                  ids 0-255 the bytes, 256 end of text: 257 ids
    bpe                    sentencepiece BPE (unigram: ``unigram``); end of text is its EOS id (3)
    sentencepiece:FILE     a sentencepiece .model of any id layout; end of text is the model's EOS id
    hf:FILE                a Hugging Face tokenizer.json; end of text its <|endoftext|>, <|end_of_text|>, </s>, ...
    tiktoken:NAME:FILE     tiktoken's encoding NAME (gpt2, cl100k_base, ...) from its local ranks file
    KIND(eot=TOKEN):...    a pretrained kind with its end-of-text token named

(the pretrained forms: :mod:`skiplab.tokenization.pretrained`). A tokenizer is stored in its run and every checkpoint as
bytes (:meth:`to_bytes`, :func:`load_lm_tokenizer`): the sentencepiece model trained, or a pretrained tokenizer's
file with a one-line header, so that eval, generate and resume need nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from .pretrained import FORMS, PretrainedTokenizer, is_pretrained, load_pretrained, parse_pretrained
from .pretrained.base import require
from .pretrained.hf_tokenizer import INSTALL as HF_INSTALL
from .pretrained.tiktoken_encoding import gpt2_stand_ins
from .subwords import MODEL_TYPES, Tokenizer

LM_TOKENIZERS = ("bytes", *MODEL_TYPES)  # the kinds made here; the pretrained ones are read from a file
_BYTES_MARK = b"skiplab:bytes"


class ByteTokenizer:
    """UTF-8 bytes as ids (a text's lone surrogate escapes, from bytes that were not UTF-8, as those bytes)."""

    eot = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8", "surrogateescape"))

    def encode_array(self, text: str) -> np.ndarray:
        """:meth:`encode` as a uint8 array, without a Python int per byte (enwik8 is 10⁸ of them)."""
        return np.frombuffer(text.encode("utf-8", "surrogateescape"), dtype=np.uint8)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``; end of text is skipped, and a cut multi-byte character becomes U+FFFD."""
        return bytes(i for i in map(int, ids) if i != self.eot).decode("utf-8", "replace")

    def to_bytes(self) -> bytes:
        return _BYTES_MARK

    EOT_TEXT = "<|endoftext|>"  # end of text's name in a Hugging Face file (no text of a document reads as it)

    def tokenizer_json(self) -> bytes:
        """These ids as a Hugging Face ``tokenizer.json``: each byte its own token, its id the byte's value, end of
        text :data:`EOT_TEXT` at 256::

            model          BPE, vocab: byte b written as GPT-2's stand-in for b (:func:`gpt2_stand_ins`) -> b;
                           no merges, so every byte stays a token of its own
            pre-tokenizer  ByteLevel(add_prefix_space=False, use_regex=False): the text's UTF-8 bytes in stand-ins
            decoder        ByteLevel: stand-ins back to bytes, then UTF-8
            added tokens   end of text, special, at 256

        A document holding end of text's text reads it as bytes here; a Hugging Face tokenizer reads it as the token
        unless told to split special tokens (transformers ``split_special_tokens=True``)."""
        tokenizers = require("tokenizers", HF_INSTALL, "Hugging Face")
        from tokenizers import AddedToken, decoders, models, pre_tokenizers

        vocab = {**gpt2_stand_ins(), self.EOT_TEXT: self.eot}
        tok = tokenizers.Tokenizer(models.BPE(vocab, [], fuse_unk=False))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(self.EOT_TEXT, special=True, normalized=False)])
        return tok.to_str().encode("utf-8")


class SubwordTokenizer:
    """A sentencepiece model trained losslessly on the training documents; end of text is EOS."""

    eot = Tokenizer.EOS

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok

    @property
    def vocab_size(self) -> int:
        return self.tok.vocab_size

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text)

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text), dtype=np.uint32)

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(ids)

    def to_bytes(self) -> bytes:
        return self.tok.to_bytes()


LMTokenizer = ByteTokenizer | SubwordTokenizer | PretrainedTokenizer


def check_lm_tokenizer(spec: str) -> None:
    """A one-line ValueError unless ``spec`` is a tokenizer of the grammar above (a pretrained one's file is not
    read: a stored config must load where the file is not)."""
    if spec not in LM_TOKENIZERS and parse_pretrained(spec) is None:
        raise ValueError(f"unknown tokenizer {spec!r}; known: {', '.join(LM_TOKENIZERS + FORMS)}")


def train_lm_tokenizer(kind: str, documents: list[str], prefix: str | Path, vocab_size: int) -> LMTokenizer:
    """A tokenizer of ``kind``; a subword one is trained on the documents' lines (files ``prefix.model``/``.vocab``)."""
    if kind not in LM_TOKENIZERS:
        raise ValueError(f"unknown tokenizer {kind!r}; known: {', '.join(LM_TOKENIZERS)}")
    if kind == "bytes":
        return ByteTokenizer()
    lines = (line for doc in documents for line in doc.split("\n"))
    return SubwordTokenizer(Tokenizer.train(lines, prefix, vocab_size, kind, lossless=True))


def load_lm_tokenizer(data: bytes) -> LMTokenizer:
    """The tokenizer :meth:`to_bytes` gave."""
    if data == _BYTES_MARK:
        return ByteTokenizer()
    if is_pretrained(data):
        return load_pretrained(data)
    return SubwordTokenizer(Tokenizer.from_bytes(data))
