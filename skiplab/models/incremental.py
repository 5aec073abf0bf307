"""The incremental decoding interface both generating families keep: a state, one cached position a step.

    state = model.start(context)        the rows' key/value caches, filled with what is known
    logp  = model.step(tokens, state)   feed one token per row (N,), caches extended in place;
                                        float log-probabilities (N, V) of the next token
    state = model.select(state, index)  rows ``index`` of the state (beam expansion and reordering)

What ``context`` is, is the family's: the encoder's memory for translation (:class:`~skiplab.models.seq2seq.
EncoderDecoder`, stepped from BOS), a prompt's tokens but the last for a language model (:class:`~skiplab.models.
gpt.GPT`, stepped from the prompt's last token). The searches (``skiplab.translate``) and sampling
(:mod:`~skiplab.models.generate`) are written against this interface, so a step costs one position's
computation whatever the family.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class IncrementalDecoder(Protocol):
    def start(self, context: Any) -> Any:
        """A decoding state for the rows of ``context``, its caches holding what ``context`` gives."""

    def step(self, tokens: Tensor, state: Any) -> Tensor:
        """Feed ``tokens`` (N,) at the current position, appending it to the caches in place.

        Returns float log-probabilities (N, V) of the next token.
        """

    def select(self, state: Any, index: Tensor) -> Any:
        """A state whose row i is row ``index[i]`` of ``state`` (rows may repeat)."""
