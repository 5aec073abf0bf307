r"""Token streams of a language model's splits, and the windows it trains and is evaluated on.

A split's stream is its documents' tokens, each document followed by the end-of-text token, in one flat
array (uint16 where the vocabulary fits, else uint32). Pre-tokenised ``.bin`` files (nanoGPT's layout: the
flat array of one split, no header; or llm.c / modded-nanogpt shards, a header then the tokens; a glob of
either) and the shards of a prepared folder (:mod:`skiplab.corpora.shards`) are read through ``np.memmap``
without loading them; a sidecar ``FILE.bin.json`` may give ``{"bytes": N}``, the UTF-8 bytes of the text they
hold, for bits per byte.

Training samples ``batch`` windows of ``n + 1`` tokens at uniformly random offsets (inputs the first n,
targets the last n), from a ``torch.Generator`` whose state a checkpoint keeps, so a resumed run draws the
windows an uninterrupted one would. Evaluation walks the stream in windows of n: with ``stride`` s < n
each window after the first starts s tokens after the previous one and scores only its last s targets
(each target once, with at least n − s tokens of context); without, windows do not overlap.

    bits per byte = Σ NLL (nats) / (ln 2 · UTF-8 bytes of the text)
    token perplexity = exp(Σ NLL / scored tokens)            (of the run's tokenizer)
    word perplexity = exp(Σ NLL / words),   words = Σ_doc len(re.split(r"\s+", doc))

the tokenizer-independent measure (every token's loss counts, end-of-text tokens included; the bytes are
the documents', separators aside). The three share one Σ NLL. Words are counted as lm-evaluation-harness
counts them for its ``word_perplexity`` (``Task.count_words``, ``lm_eval/api/task.py``; the wikitext task
counts its original documents the same way): the pieces of each document split on runs of whitespace, so a
document's leading or trailing whitespace adds one (empty) piece.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .shards import ShardedTokens, expand, read_token_files

BIN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


@dataclass
class Stream:
    """A split's tokens (an array or a memmap), the UTF-8 bytes and the words (:func:`count_words`) of its text
    (0 where unknown)."""

    tokens: np.ndarray | ShardedTokens  # ShardedTokens: several shards' memmaps as one
    n_bytes: int
    name: str
    n_words: int = 0

    def __len__(self) -> int:
        return len(self.tokens)


def token_stream(encoded: Iterable[Sequence[int] | np.ndarray], eot: int, vocab_size: int, n_bytes: int,
                 name: str, n_words: int = 0) -> Stream:
    """Documents' tokens joined, each followed by ``eot``; ``encoded`` may be a generator, so that only one
    document's token list exists at a time."""
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.uint32
    parts = [np.append(np.asarray(e, dtype=dtype), np.array([eot], dtype=dtype)) for e in encoded]
    tokens = np.concatenate(parts) if parts else np.empty(0, dtype=dtype)
    return Stream(tokens, n_bytes, name, n_words)


def read_bin(path: str | Path, dtype: str, vocab_size: int) -> Stream:
    """A pre-tokenised split: a ``.bin`` file or a glob of them, memory-mapped: llm.c / modded-nanogpt shards
    (told by their header, :mod:`skiplab.corpora.shards`) or headerless ``dtype`` tokens, each file scanned once
    for an id at or past ``vocab_size``. Where every file has a sidecar ``FILE.bin.json`` giving ``{"bytes": N}``,
    their sum is the text's bytes."""
    if dtype not in BIN_DTYPES:
        raise ValueError(f"unknown token dtype {dtype!r}; known: {', '.join(BIN_DTYPES)}")
    files = expand(path)
    tokens, _ = read_token_files(path, dtype, vocab_size)
    metas = [f.with_name(f.name + ".json") for f in files]
    n_bytes = sum(map(sidecar_bytes, metas)) if all(m.is_file() for m in metas) else 0
    return Stream(tokens, n_bytes, files[0].name if len(files) == 1 else Path(path).name)


def sidecar_bytes(path: Path) -> int:
    """The ``"bytes"`` of a token file's sidecar ``FILE.bin.json`` (0 where it gives none): a JSON object whose
    ``bytes``, where present, is a whole number >= 0; anything else is a one-line error naming the file."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not JSON ({' '.join(str(exc).split())}); a token file's sidecar is "
                         '{"bytes": N}') from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: a {type(meta).__name__}, not an object; a token file's sidecar is "
                         '{"bytes": N}')
    n_bytes = meta.get("bytes", 0)
    if not isinstance(n_bytes, int) or isinstance(n_bytes, bool) or n_bytes < 0:
        raise ValueError(f'{path}: "bytes" is {json.dumps(n_bytes)}, not the text\'s UTF-8 bytes (a whole number '
                         ">= 0)")
    return n_bytes


def window_starts(stream: Stream, n: int, batch: int, gen: torch.Generator) -> list[int]:
    """``batch`` uniformly random offsets of windows of ``n + 1`` tokens."""
    if len(stream) < n + 1:
        raise ValueError(f"{stream.name}: {len(stream)} tokens, fewer than a window of context + 1 = {n + 1}")
    return torch.randint(len(stream) - n, (batch,), generator=gen).tolist()


def windows_at(stream: Stream, starts: list[int], n: int) -> tuple[Tensor, Tensor]:
    """The windows at ``starts``: inputs (B, n) and targets (B, n), the inputs shifted by one."""
    rows = torch.from_numpy(np.stack([np.asarray(stream.tokens[s : s + n + 1], dtype=np.int64) for s in starts]))
    return rows[:, :-1], rows[:, 1:]


def sample_windows(stream: Stream, n: int, batch: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """``batch`` random windows (:func:`window_starts`, :func:`windows_at`)."""
    return windows_at(stream, window_starts(stream, n, batch, gen), n)


@dataclass
class Window:
    """Inputs (B, n), targets (B, n), and which targets count (B, n), of evaluation windows."""

    inputs: Tensor
    targets: Tensor
    scored: Tensor


def eval_windows(stream: Stream, n: int, stride: int = 0, batch: int = 16) -> Iterator[Window]:
    """Every target of the stream once (the first token has no context), in windows of at most n inputs;
    ``stride`` (0: n) as the module docstring says."""
    stride = stride or n
    if not 0 < stride <= n:
        raise ValueError(f"--stride must be in 1..context ({n}), got {stride}")
    total = len(stream) - 1  # targets
    if total < 1:
        raise ValueError(f"{stream.name}: fewer than two tokens")
    spans = []  # (start of inputs, first scored target, end)
    begin = 0
    while begin < total:
        end = min(begin + n, total)
        first = 0 if begin == 0 else n - stride
        spans.append((begin, begin + first, end))
        if end == total:
            break
        begin += stride
    for i in range(0, len(spans), batch):
        part = spans[i : i + batch]
        width = max(e - s for s, _, e in part)
        x = torch.zeros(len(part), width, dtype=torch.long)
        y = torch.zeros(len(part), width, dtype=torch.long)
        scored = torch.zeros(len(part), width, dtype=torch.bool)
        for r, (s, f, e) in enumerate(part):
            seg = torch.from_numpy(np.asarray(stream.tokens[s : e + 1], dtype=np.int64))
            x[r, : e - s], y[r, : e - s] = seg[:-1], seg[1:]
            scored[r, f - s : e - s] = True
        yield Window(x, y, scored)


def bits_per_byte(nats: float, n_bytes: int) -> float | None:
    """Σ NLL / (ln 2 · bytes); None where the bytes are unknown."""
    return nats / (math.log(2) * n_bytes) if n_bytes else None


def count_words(texts: Iterable[str]) -> int:
    """Words of documents as lm-evaluation-harness counts them: Σ len(re.split(r"\\s+", doc))."""
    return sum(len(re.split(r"\s+", t)) for t in texts)


def perplexity(nats: float, count: int) -> float | None:
    """exp(Σ NLL / count), inf past a float's range; None where the count is unknown."""
    if not count:
        return None
    try:
        return math.exp(nats / count)
    except OverflowError:
        return math.inf


def unigram_nats(train: Stream, scored: Stream, vocab_size: int) -> float:
    """Σ NLL (nats) of every target of ``scored`` (all its tokens but the first, as :func:`eval_windows`
    scores them) under the unigram model of ``train``, each token predicted from its training frequency alone,
    add-one smoothed so that no token has probability 0:

        p(t) = (c(t) + 1) / (N + V),   Σ NLL = − Σ_{i ≥ 1} ln p(x_i)

    c(t) the count of token t in ``train``, N its length, V the vocabulary size: the loss a model reaches
    without using any context, the level a run that learned nothing beyond token frequencies stalls at."""
    def counts(tokens: np.ndarray, what: str) -> np.ndarray:
        found = np.bincount(np.asarray(tokens), minlength=vocab_size)
        if len(found) > vocab_size:
            raise ValueError(f"the {what} tokens hold id {len(found) - 1}, outside the vocabulary of {vocab_size}")
        return found

    log_p = np.log(counts(train.tokens, "training") + 1.0) - math.log(len(train) + vocab_size)
    return float(-(counts(scored.tokens[1:], "scored") * log_p).sum())
