"""Machine translation decoding and scoring.

The searches are :mod:`skiplab.decoding`'s (greedy and batched beam search over any :class:`Seq2SeqDecoder`,
shared with captioning), re-exported here. :mod:`~skiplab.translate.metrics`: sacrebleu BLEU and
chrF with their signatures, tokenised BLEU as the papers report it, both forms of a test set, and Koehn's
paired bootstrap resampling.
"""

from .metrics import (
    BleuForms,
    bleu,
    bleu_forms,
    bleu_tok,
    chrf,
    paired_bootstrap,
    score_forms,
    score_from_stats,
    sentence_stats,
)
from ..decoding import (
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
)

__all__ = [
    "BOS",
    "EOS",
    "BleuForms",
    "PAD",
    "UNK",
    "Hypothesis",
    "IncrementalDecoder",
    "Seq2SeqDecoder",
    "beam_search",
    "bleu",
    "bleu_forms",
    "bleu_tok",
    "chrf",
    "greedy_search",
    "length_penalty",
    "max_lengths",
    "paired_bootstrap",
    "score_forms",
    "score_from_stats",
    "sentence_stats",
]
