"""Token-count batching of sentence pairs, as in fairseq: batches hold a budget of tokens, not of sentences.

Pairs are sorted by length and cut into consecutive runs, so each batch holds sentences of similar
length and little of it is padding; a batch of short sentences holds many, one of long sentences few.
The budget counts padding: a batch of ``n`` pairs whose longest side (source or target, with its
EOS/BOS) has ``m`` tokens costs ``n * m``, since that is the size of the tensors the model processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .parallel import Parallel
from ..tokenization import Tokenizer

PAD, BOS, EOS = Tokenizer.PAD, Tokenizer.BOS, Tokenizer.EOS


@dataclass(frozen=True, eq=False)  # eq=False: comparing tensors field by field has no single truth value
class Batch:
    """Padded id tensors for a batch of sentence pairs (B pairs)."""

    src: torch.Tensor  # int64 (B, S): source ids + EOS, right-padded with PAD
    tgt_in: torch.Tensor  # int64 (B, T): BOS + target ids, right-padded with PAD (the decoder's input)
    tgt_out: torch.Tensor  # int64 (B, T): target ids + EOS, right-padded with PAD (what it must predict)
    index: torch.Tensor  # int64 (B,): positions of these pairs in the encoded dataset (to restore order)

    @property
    def ntokens(self) -> int:
        """The number of non-PAD target tokens: what a per-token loss is averaged over."""
        return int((self.tgt_out != PAD).sum())

    def __len__(self) -> int:
        return self.src.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch with every tensor on ``device``."""
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Batch(move(self.src), move(self.tgt_in), move(self.tgt_out), move(self.index))


def encode_parallel(tok: Tokenizer, data: Parallel) -> tuple[list[list[int]], list[list[int]]]:
    """The subword ids of both sides of ``data`` (no BOS/EOS: :func:`collate` adds them)."""
    return tok.encode_batch(data.src), tok.encode_batch(data.tgt)


def filter_long(
    src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]] | None, max_len: int
) -> tuple[list[int], int]:
    """The indices of pairs whose sides both fit in ``max_len`` tokens with EOS/BOS, and how many were dropped.

    ``tgt_ids`` None checks the sources only (translating raw input).
    """
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1, got {max_len}")
    _check_aligned(src_ids, tgt_ids)
    kept = [
        i
        for i in range(len(src_ids))
        if len(src_ids[i]) + 1 <= max_len and (tgt_ids is None or len(tgt_ids[i]) + 1 <= max_len)
    ]
    return kept, len(src_ids) - len(kept)


def make_batches(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]] | None,
    max_tokens: int = 4096,
    indices: Sequence[int] | None = None,
    shuffle: bool = False,
    generator: torch.Generator | None = None,
) -> list[Batch]:
    """Cut the pairs at ``indices`` (default: all) into length-sorted batches of at most ``max_tokens``.

    Pairs are sorted (stably) by source then target length and cut greedily: a batch ends where one
    more pair would take ``n * max(longest source, longest target)`` over ``max_tokens``. With
    ``shuffle`` the order of the batches is permuted with ``generator`` (their contents are not),
    deterministically for a given generator state. ``tgt_ids`` None gives target tensors of shape (B, 0).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    _check_aligned(src_ids, tgt_ids)
    n = len(src_ids)
    order = list(range(n)) if indices is None else [int(i) for i in indices]
    for i in order:
        if not 0 <= i < n:
            raise ValueError(f"index {i} is out of range for {n} pairs")
    # +1: the EOS after the source; BOS + target and target + EOS are both one longer than the target.
    src_len = [len(s) + 1 for s in src_ids]
    tgt_len = [len(t) + 1 for t in tgt_ids] if tgt_ids is not None else [0] * n
    order.sort(key=lambda i: (src_len[i], tgt_len[i]))

    runs: list[list[int]] = []
    run: list[int] = []
    width = 0  # the longest side in the current run
    for i in order:
        w = max(src_len[i], tgt_len[i])
        if w > max_tokens:
            raise ValueError(
                f"pair {i} has {src_len[i]} source and {tgt_len[i]} target tokens (with EOS/BOS), more than "
                f"max_tokens={max_tokens}; drop long pairs first with filter_long"
            )
        if run and max(width, w) * (len(run) + 1) > max_tokens:
            runs.append(run)
            run, width = [], 0
        run.append(i)
        width = max(width, w)
    if run:
        runs.append(run)

    if shuffle:
        perm = torch.randperm(len(runs), generator=generator).tolist()
        runs = [runs[p] for p in perm]
    return [
        collate([src_ids[i] for i in r], None if tgt_ids is None else [tgt_ids[i] for i in r], r) for r in runs
    ]


def collate(
    src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]] | None, index: Sequence[int]
) -> Batch:
    """One :class:`Batch` from the raw ids of its pairs: adds EOS/BOS and right-pads with PAD."""
    _check_aligned(src, tgt)
    if len(index) != len(src):
        raise ValueError(f"collate: {len(src)} pairs but {len(index)} indices")
    src_t = _pad([[*s, EOS] for s in src])
    if tgt is None:
        tgt_in = tgt_out = torch.zeros((len(src), 0), dtype=torch.int64)
    else:
        tgt_in, tgt_out = _pad([[BOS, *t] for t in tgt]), _pad([[*t, EOS] for t in tgt])
    return Batch(src_t, tgt_in, tgt_out, torch.tensor(list(index), dtype=torch.int64))


def _pad(rows: list[list[int]]) -> torch.Tensor:
    # One torch.tensor call on padded Python lists: much faster than filling row by row.
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows], dtype=torch.int64).reshape(len(rows), width)


def _check_aligned(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]] | None) -> None:
    if tgt is not None and len(src) != len(tgt):
        raise ValueError(f"{len(src)} source sequences but {len(tgt)} target sequences")
