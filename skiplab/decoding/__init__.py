"""Decoding shared by the sequence-generating tasks (translation, captioning): greedy and batched beam search over
any :class:`Seq2SeqDecoder` (encode once, one cached ``step`` per position), and sampling, :mod:`skiplab.decoding.search`."""

from .search import (
    BOS,
    EOS,
    PAD,
    UNK,
    Hypothesis,
    IncrementalDecoder,
    Seq2SeqDecoder,
    beam_search,
    greedy_search,
    length_penalty,
    max_lengths,
    sample_search,
)

__all__ = ["BOS", "EOS", "PAD", "UNK", "Hypothesis", "IncrementalDecoder", "Seq2SeqDecoder", "beam_search",
           "greedy_search", "length_penalty", "max_lengths", "sample_search"]
