"""Greedy and batched beam search over an incremental (key/value-cached) decoder.

The decoder is anything that implements :class:`Seq2SeqDecoder`: ``encode`` once, ``start`` a
state, then one ``step`` per target position for all rows at once. The prefix is never re-fed, so a
sentence of length T costs T steps, not T²/2 positions.

Beam search follows fairseq's ``SequenceGenerator`` (Ott et al. 2019): per sentence it takes the top
2·beam candidates over beam·V, so that at least ``beam`` of them do not end in EOS (each row has only
one EOS candidate); EOS candidates among the top ``beam`` become finished hypotheses, the best
``beam`` non-EOS candidates continue. Finished hypotheses are ranked by the GNMT length-normalised
score (Wu et al. 2016, "Google's Neural Machine Translation System", Eq. 14, without coverage):

    score(y) = log P(y | x) / lp(y),    lp(y) = ((5 + |y|) / 6) ** alpha

where |y| counts the generated tokens including the final EOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from ..models.incremental import IncrementalDecoder

PAD, UNK, BOS, EOS = 0, 1, 2, 3

# Never proposed: a PAD or BOS in the output would be read back as padding / a new sentence.
_BANNED = (PAD, BOS)


@runtime_checkable
class Seq2SeqDecoder(IncrementalDecoder, Protocol):
    """What the searches decode with: the shared incremental interface (:mod:`skiplab.models.incremental`;
    ``start`` takes the memory ``encode`` returns, the first ``step`` feeds BOS) and ``encode``. The encoder-
    decoder families implement exactly this."""

    def encode(self, src: Tensor) -> Any:
        """Encode ``src`` int64 (B, S), right-padded with PAD; returns an opaque memory."""


@dataclass
class Hypothesis:
    """One translation: ``tokens`` without BOS/EOS, length-normalised ``score``, summed ``log_prob``.

    ``log_prob`` sums the token log-probabilities including the EOS one (none when the hypothesis was
    cut at the maximum length); ``score = log_prob / length_penalty(len, alpha)``.
    """

    tokens: list[int]
    score: float
    log_prob: float


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty lp(y) = ((5 + |y|) / 6) ** alpha (Wu et al. 2016, Eq. 14).

    lp(1) = 1 for every alpha; alpha = 0 gives raw log-probabilities, larger alpha favours longer output.
    """
    return ((5.0 + length) / 6.0) ** alpha


def max_lengths(src: Tensor, max_len_a: float, max_len_b: int) -> Tensor:
    """Per-sentence cap on generated tokens (EOS included): ``int(a * |x| + b)``, |x| = non-PAD source tokens.

    Same rule as fairseq's ``--max-len-a/--max-len-b``; int() truncates, e.g. a=1.5, |x|=3, b=0 gives 4.
    A source that is not a (B, S) tensor of token ids (images, features: a captioner's) has no length: the
    cap is ``b`` alone, and ``a`` must be 0.
    """
    if max_len_a < 0 or max_len_b < 0:
        raise ValueError(f"max_len_a and max_len_b must be >= 0, got {max_len_a} and {max_len_b}")
    if src.dim() != 2 or src.is_floating_point():
        if max_len_a:
            raise ValueError(f"a source of shape {tuple(src.shape)} is not token ids: give max_len_a = 0 "
                             f"(the cap is max_len_b alone), got {max_len_a}")
        return torch.full((src.shape[0],), max_len_b, dtype=torch.long)
    src_len = (src != PAD).sum(dim=1).double()
    return (max_len_a * src_len + max_len_b).floor().long()


def _next_log_probs(model: Seq2SeqDecoder, tokens: Tensor, state: Any) -> Tensor:
    """One decoding step, in float32 (half-precision sums drift over long outputs), PAD/BOS banned."""
    log_probs = model.step(tokens, state).float()
    banned = torch.tensor(_BANNED, device=log_probs.device)
    return log_probs.index_fill(1, banned, float("-inf"))


@torch.no_grad()
def greedy_search(
    model: Seq2SeqDecoder, src: Tensor, max_len_a: float = 1.0, max_len_b: int = 50
) -> list[list[int]]:
    """Per sentence the argmax token (PAD and BOS excluded) at each position, until EOS or ``max_lengths`` tokens.

    Returns token ids without BOS and EOS. All B rows are stepped together; a finished row is fed PAD
    and its outputs ignored, so every call to ``model.step`` covers exactly one position of B rows.
    """
    batch = src.size(0)
    device = src.device
    limit = max_lengths(src, max_len_a, max_len_b).to(device)
    state = model.start(model.encode(src))
    done = limit <= 0
    tokens = torch.full((batch,), BOS, dtype=torch.long, device=device)
    out = torch.empty(batch, 0, dtype=torch.long, device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    for t in range(int(limit.max()) if batch else 0):
        if bool(done.all()):
            break
        nxt = _next_log_probs(model, tokens, state).argmax(dim=1)
        emit = ~done & (nxt != EOS)
        out = torch.cat([out, nxt.masked_fill(~emit, PAD)[:, None]], dim=1)
        lengths += emit.long()
        done |= (nxt == EOS) | (t + 1 >= limit)
        tokens = nxt.masked_fill(done, PAD)
    return [out[i, : int(lengths[i])].tolist() for i in range(batch)]


@torch.no_grad()
def beam_search(
    model: Seq2SeqDecoder,
    src: Tensor,
    beam: int = 4,
    alpha: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    n_best: int = 1,
    max_len: int | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search: per sentence up to ``n_best`` hypotheses, best score first; at most
    ``int(a·|x| + b)`` tokens (:func:`max_lengths`), and at most ``max_len`` where given (the model's positions).

    B sentences × ``beam`` rows are stepped together, one ``model.step`` per position. At step t
    (generating token t+1):

    * cand = log_prob[row] + log p(v | prefix[row]) over the beam·V (row, v) pairs of a sentence;
      the top 2·beam are taken (ties between candidates are broken by ``torch.topk``).
    * EOS candidates among the top ``beam`` are finished with |y| = t + 1 (EOS included).
    * The best ``beam`` non-EOS candidates continue; the state is reordered with ``model.select``.
    * When a sentence reaches its maximum length, its live candidates are finished too, scored
      with |y| = max length (as if they ended there; no EOS probability is added).
    * Stopping rule (fairseq's): a sentence is done once it holds ``beam`` finished hypotheses.
      It is not exact for alpha > 0 (a live hypothesis' normalised score can still rise), but it
      bounds the work; with a beam as large as the search space the search is exhaustive.

    Rows of done sentences are kept (fed PAD, log_prob -inf) so the batch shape never changes.
    With beam = 1 this is exactly :func:`greedy_search`.
    """
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    if not 1 <= n_best <= beam:
        raise ValueError(f"n_best must be in [1, beam={beam}], got {n_best}")
    batch, device = src.size(0), src.device
    rows = batch * beam
    limit = max_lengths(src, max_len_a, max_len_b).to(device)
    if max_len is not None:
        limit = limit.clamp(max=max_len)
    sentence_of_row = torch.arange(batch, device=device).repeat_interleave(beam)
    # Encode once per sentence, then copy the state to its beam rows.
    state = model.select(model.start(model.encode(src)), sentence_of_row)

    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    for i in range(batch):
        if int(limit[i]) <= 0:  # nothing may be generated: the empty output ends there
            finished[i].append(Hypothesis([], 0.0, 0.0))
    done = limit <= 0
    # Step 0: only the first row of each sentence is live, so the first expansion isn't duplicated.
    log_prob = torch.full((batch, beam), float("-inf"), device=device)
    log_prob[:, 0] = 0.0
    log_prob[done] = float("-inf")
    tokens = torch.full((rows,), BOS, dtype=torch.long, device=device)
    prefix = torch.empty(rows, 0, dtype=torch.long, device=device)  # generated tokens per row
    first_row = (torch.arange(batch, device=device) * beam)[:, None]

    for t in range(int(limit.max()) if batch else 0):
        if bool(done.all()):
            break
        step_lp = _next_log_probs(model, tokens, state)  # (rows, V)
        vocab = step_lp.size(1)
        cand = (log_prob.reshape(rows, 1) + step_lp).reshape(batch, beam * vocab)
        width = min(2 * beam, beam * vocab)
        cand_lp, cand_idx = cand.topk(width, dim=1)  # sorted, best first
        cand_row = first_row + torch.div(cand_idx, vocab, rounding_mode="floor")
        cand_tok = cand_idx % vocab
        is_eos = cand_tok == EOS
        penalty = length_penalty(t + 1, alpha)
        at_limit = t + 1 >= limit

        # Finish EOS candidates among the top `beam` (fairseq: an EOS ranked below the beam is dropped).
        new_eos = is_eos[:, :beam] & torch.isfinite(cand_lp[:, :beam]) & ~done[:, None]
        for i, j in new_eos.nonzero().tolist():
            lp = float(cand_lp[i, j])
            finished[i].append(Hypothesis(prefix[cand_row[i, j]].tolist(), lp / penalty, lp))

        # The first `beam` non-EOS candidates, in score order: EOS ones are pushed behind by the key.
        key = is_eos.long() * width + torch.arange(width, device=device)
        keep = key.topk(beam, dim=1, largest=False).indices.sort(dim=1).values
        next_lp = cand_lp.gather(1, keep)
        next_row = cand_row.gather(1, keep)
        next_tok = cand_tok.gather(1, keep)

        # Sentences at their length cap: the live candidates are finished as they stand.
        for i in (at_limit & ~done).nonzero().flatten().tolist():
            for j in range(beam):
                lp = float(next_lp[i, j])
                if lp > float("-inf"):
                    tokens_ij = prefix[next_row[i, j]].tolist() + [int(next_tok[i, j])]
                    finished[i].append(Hypothesis(tokens_ij, lp / penalty, lp))

        n_finished = torch.tensor([len(f) for f in finished], device=device)
        done = done | at_limit | (n_finished >= beam)
        if bool(done.all()):
            break
        log_prob = next_lp.masked_fill(done[:, None], float("-inf"))
        parent = next_row.reshape(rows)
        prefix = torch.cat([prefix[parent], next_tok.reshape(rows, 1)], dim=1)
        state = model.select(state, parent)
        tokens = next_tok.reshape(rows).masked_fill(done[sentence_of_row], PAD)

    # sorted() is stable: equal scores keep the order they were found in.
    return [sorted(f, key=lambda h: -h.score)[:n_best] for f in finished]


@torch.no_grad()
def sample_search(model: Seq2SeqDecoder, src: Tensor, n: int = 1, max_len: int = 16,
                  generator: torch.Generator | None = None) -> tuple[list[list[int]], list[bool]]:
    """``n`` outputs per source row drawn token by token from the model's distribution (PAD and BOS excluded),
    each until EOS or ``max_len`` tokens: rows b·n .. b·n + n - 1 are source b's. Returns ``(tokens, ended)``:
    each output's ids without BOS and EOS, and whether it ended with EOS (what self-critical sequence training
    samples, Rennie et al. 2017). The source is encoded once and its state copied n times."""
    if n < 1 or max_len < 1:
        raise ValueError(f"n and max_len must be >= 1, got {n} and {max_len}")
    rows, device = src.size(0) * n, src.device
    state = model.select(model.start(model.encode(src)), torch.arange(src.size(0), device=device).repeat_interleave(n))
    tokens = torch.full((rows,), BOS, dtype=torch.long, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    ended = torch.zeros(rows, dtype=torch.bool, device=device)
    out = torch.empty(rows, 0, dtype=torch.long, device=device)
    for _ in range(max_len):
        probs = _next_log_probs(model, tokens, state).exp()
        nxt = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(1).to(device)
        ended |= ~done & (nxt == EOS)
        emit = ~done & (nxt != EOS)
        out = torch.cat([out, nxt.masked_fill(~emit, PAD)[:, None]], dim=1)
        done |= nxt == EOS
        if bool(done.all()):
            break
        tokens = nxt.masked_fill(done, PAD)
    return [out[i][out[i] != PAD].tolist() for i in range(rows)], ended.tolist()
