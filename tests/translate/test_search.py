import copy
import itertools
import math
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from skiplab.translate import (
    BOS,
    EOS,
    PAD,
    Hypothesis,
    IncrementalDecoder,
    beam_search,
    greedy_search,
    length_penalty,
    max_lengths,
)
from tests.noise import FACTOR, assert_within_noise, noise

# ---------------------------------------------------------------- toy decoders implementing the protocol


@dataclass
class TableState:
    feat: torch.Tensor  # (N,) per-sentence source feature
    cache: torch.Tensor  # (N, t) the tokens fed so far


class TableModel:
    """log p(next | prefix, x) from a fixed random table indexed by (source feature, last token, prefix sum mod M).

    The prefix sum makes the distribution depend on the whole history, so a wrong reorder shows.
    """

    def __init__(self, vocab: int = 7, feats: int = 3, mod: int = 3, seed: int = 0, eos_shift: float = 0.0):
        g = torch.Generator().manual_seed(seed)
        logits = 2.0 * torch.randn(feats, vocab, mod, vocab, generator=g)
        logits[..., EOS] += eos_shift
        self.table, self.feats, self.mod = logits.log_softmax(-1), feats, mod

    def encode(self, src):
        return (src * (src != PAD)).sum(1) % self.feats

    def start(self, memory):
        return TableState(memory.clone(), torch.empty(memory.size(0), 0, dtype=torch.long))

    def step(self, tokens, state):
        state.cache = torch.cat([state.cache, tokens[:, None]], dim=1)
        return self.table[state.feat, tokens, state.cache.sum(1) % self.mod]

    def select(self, state, index):
        return TableState(state.feat[index], state.cache[index])

    @staticmethod
    def cache_length(state) -> int:
        return state.cache.size(1)


class AttentionModel(nn.Module):
    """A tiny randomly initialised decoder with a key/value cache, self- and (padding-masked) cross-attention."""

    def __init__(self, vocab: int = 9, dim: int = 8, seed: int = 0, eos_shift: float = 0.0):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.src_emb, self.tgt_emb = nn.Embedding(vocab, dim), nn.Embedding(vocab, dim)
            self.pos = nn.Parameter(torch.randn(64, dim))
            self.q, self.k, self.v, self.cq = (nn.Linear(dim, dim) for _ in range(4))
            self.out = nn.Linear(dim, vocab)
        with torch.no_grad():
            self.out.bias[EOS] += eos_shift
        self.requires_grad_(False)
        self.dim = dim

    def encode(self, src):
        return torch.tanh(self.src_emb(src)), src != PAD

    def start(self, memory):
        mem, mask = memory
        empty = mem.new_zeros(mem.size(0), 0, self.dim)
        return {"mem": mem, "mask": mask, "k": empty, "v": empty}

    def step(self, tokens, state):
        x = self.tgt_emb(tokens) + self.pos[state["k"].size(1)]
        state["k"] = torch.cat([state["k"], self.k(x)[:, None]], dim=1)
        state["v"] = torch.cat([state["v"], self.v(x)[:, None]], dim=1)
        w = ((self.q(x)[:, None] * state["k"]).sum(-1) / math.sqrt(self.dim)).softmax(-1)
        h = x + (w[..., None] * state["v"]).sum(1)
        s = (self.cq(h)[:, None] * state["mem"]).sum(-1).masked_fill(~state["mask"], float("-inf"))
        h = h + 3.0 * (s.softmax(-1)[..., None] * state["mem"]).sum(1)
        logits = 3.0 * self.out(torch.tanh(h))
        # EOS grows likelier past the source length, as a translation's length follows its source's.
        logits[:, EOS] += state["k"].size(1) - state["mask"].sum(1)
        return logits.log_softmax(-1)

    def select(self, state, index):
        return {key: value[index] for key, value in state.items()}

    @staticmethod
    def cache_length(state) -> int:
        return state["k"].size(1)


class Counting:
    """Wraps a toy model; records every step's row count and checks each step adds exactly one position."""

    def __init__(self, model):
        self.model, self.rows, self.encoded = model, [], 0

    def encode(self, src):
        self.encoded += 1
        return self.model.encode(src)

    def start(self, memory):
        return self.model.start(memory)

    def step(self, tokens, state):
        assert tokens.shape == (tokens.numel(),) and tokens.dtype == torch.long
        before = self.model.cache_length(state)
        out = self.model.step(tokens, state)
        assert self.model.cache_length(state) == before + 1 == len(self.rows) + 1  # no prefix re-fed
        self.rows.append(tokens.numel())
        assert out.shape[0] == tokens.numel()
        return out

    def select(self, state, index):
        return self.model.select(state, index)


def make_src(batch: int, vocab: int, seed: int, max_src: int = 6) -> torch.Tensor:
    """Right-padded sources of mixed lengths, each ending in EOS."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_src + 1, (batch,), generator=g)
    lengths[0] = max_src  # at least one full row, the others padded
    src = torch.full((batch, max_src), PAD, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        src[i, : n - 1] = torch.randint(4, vocab, (n - 1,), generator=g)
        src[i, n - 1] = EOS
    return src


MODELS = {"table": TableModel, "attention": AttentionModel}
MIXED_EOS_SHIFT = {"table": 0.0, "attention": 0.5}  # outputs of these toys mix EOS-ended and capped ones


def rescore(model, src_row: torch.Tensor, tokens: list[int], eos: bool) -> float:
    """log P(tokens [+ EOS] | src) for one sentence alone, decoded afresh."""
    state = model.start(model.encode(src_row[None]))
    total, prev = 0.0, BOS
    for tok in tokens + ([EOS] if eos else []):
        total += float(model.step(torch.tensor([prev]), state)[0, tok])
        prev = tok
    return total


def in_float64(model):
    """The toy computing in float64, to measure its float32 noise (tests/noise.py). A TableModel's table is
    cast, not recomputed: search and rescoring both read it as it is."""
    if isinstance(model, nn.Module):
        return copy.deepcopy(model).double()
    twin = copy.copy(model)
    twin.table = model.table.double()
    return twin


def check_hypothesis(model, src_row, hyp: Hypothesis, limit: int, alpha: float) -> None:
    """A hypothesis is cut at the limit or EOS-ended; its log_prob and score agree with the model."""
    assert not {PAD, BOS, EOS} & set(hyp.tokens)
    eos = len(hyp.tokens) < limit
    assert len(hyp.tokens) <= limit
    log_prob, log_prob64 = (rescore(m, src_row, hyp.tokens, eos) for m in (model, in_float64(model)))
    assert_within_noise(hyp.log_prob, log_prob, noise((log_prob, log_prob64)))  # one row against a batch
    length = len(hyp.tokens) + eos
    assert hyp.score == pytest.approx(hyp.log_prob / length_penalty(length, alpha), abs=1e-5)


# ---------------------------------------------------------------- tests


def test_toy_models_implement_the_protocol():
    assert isinstance(TableModel(), IncrementalDecoder)
    assert isinstance(AttentionModel(), IncrementalDecoder)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.3])
def test_length_penalty_formula(alpha):
    assert length_penalty(1, alpha) == pytest.approx(1.0)
    assert length_penalty(7, alpha) == pytest.approx(2.0**alpha)
    assert length_penalty(13, alpha) == pytest.approx(3.0**alpha)
    assert length_penalty(0, alpha) == pytest.approx((5 / 6) ** alpha)


def test_max_lengths_follow_a_times_source_length_plus_b():
    src = torch.tensor([[5, 6, 3, 0, 0], [5, 3, 0, 0, 0], [4, 5, 6, 7, 3]])
    assert max_lengths(src, 1.5, 2).tolist() == [6, 5, 9]  # int(1.5 * 3 + 2) = 6 (truncated)
    assert max_lengths(src, 0.0, 4).tolist() == [4, 4, 4]
    with pytest.raises(ValueError):
        max_lengths(src, -1.0, 2)


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_beam_one_equals_greedy(kind, seed):
    model = MODELS[kind](seed=seed, eos_shift=MIXED_EOS_SHIFT[kind])
    src = make_src(5, 7, seed=seed)
    greedy_model, beam_model = Counting(model), Counting(model)
    greedy = greedy_search(greedy_model, src, max_len_a=1.0, max_len_b=3)
    beams = beam_search(beam_model, src, beam=1, alpha=0.6, max_len_a=1.0, max_len_b=3)
    assert [h[0].tokens for h in beams] == greedy
    assert greedy_model.rows == beam_model.rows  # same positions, same batch
    limits = max_lengths(src, 1.0, 3).tolist()
    # Non-trivial outputs: some non-empty, some stopped by EOS before the cap.
    assert any(len(g) > 0 for g in greedy) and any(len(g) < n for g, n in zip(greedy, limits))
    for i, hyps in enumerate(beams):
        check_hypothesis(model, src[i], hyps[0], limits[i], 0.6)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_greedy_takes_the_argmax_at_each_position(kind):
    model = MODELS[kind](seed=5)
    src = make_src(3, 7, seed=5)
    limits = max_lengths(src, 1.0, 2).tolist()
    for i, out in enumerate(greedy_search(model, src, max_len_a=1.0, max_len_b=2)):
        state, prev, path = model.start(model.encode(src[i : i + 1])), BOS, []
        for _ in range(limits[i]):
            lp = model.step(torch.tensor([prev]), state)[0]
            lp[[PAD, BOS]] = float("-inf")
            prev = int(lp.argmax())
            if prev == EOS:
                break
            path.append(prev)
        assert out == path


def enumerate_outputs(allowed: list[int], limit: int):
    """Every output: EOS-ended with at most `limit` tokens (EOS included), or `limit` tokens cut off."""
    words = [t for t in allowed if t != EOS]
    for n in range(limit):
        for seq in itertools.product(words, repeat=n):
            yield list(seq), True
    for seq in itertools.product(words, repeat=limit):
        yield list(seq), False


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_large_beam_is_exhaustive(alpha, seed):
    # V = 7 with PAD and BOS banned: 5 choices per position, 4 of them non-EOS; 16 live prefixes at most
    # before the last position, so beam 25 keeps every one and must return the exact optimum.
    model = TableModel(vocab=7, seed=seed, eos_shift=1.5)
    model64 = in_float64(model)
    src = make_src(3, 7, seed=seed)
    limit = 3
    beams = beam_search(model, src, beam=25, alpha=alpha, max_len_a=0.0, max_len_b=limit, n_best=25)
    for i, hyps in enumerate(beams):
        scored = []
        for tokens, eos in enumerate_outputs([1, 3, 4, 5, 6], limit):
            log_prob = rescore(model, src[i], tokens, eos)
            scored.append((log_prob / length_penalty(len(tokens) + eos, alpha), tokens))
        scored.sort(key=lambda s: -s[0])
        best, tokens = scored[0]
        eos = len(tokens) < limit
        best64 = rescore(model64, src[i], tokens, eos) / length_penalty(len(tokens) + eos, alpha)
        level = noise((best, best64))
        assert hyps[0].tokens == tokens
        assert_within_noise(hyps[0].score, best, level)
        assert [h.tokens for h in hyps] == [s[1] for s in scored[:25]]  # the whole n-best list is exact
        for small in (1, 2, 4):  # no beam may beat the exhaustive optimum; the exact one attains it
            top = beam_search(model, src[i : i + 1], beam=small, alpha=alpha, max_len_a=0.0, max_len_b=limit)
            assert top[0][0].score <= best + FACTOR * level


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_step_once_per_position_for_all_rows(kind):
    model = Counting(MODELS[kind](seed=3, eos_shift=0.5))
    src = make_src(4, 7, seed=3)
    beams = beam_search(model, src, beam=3, max_len_a=1.0, max_len_b=2, n_best=3)
    assert model.encoded == 1
    assert model.rows and set(model.rows) == {4 * 3}
    assert len(model.rows) <= int(max_lengths(src, 1.0, 2).max())
    assert len(model.rows) >= max(len(h.tokens) for hyps in beams for h in hyps)


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_n_best_sorted_and_consistent_with_the_model(kind, alpha):
    model = MODELS[kind](seed=7, eos_shift=0.5)
    src = make_src(4, 7, seed=7)
    limits = max_lengths(src, 1.0, 2).tolist()
    beams = beam_search(model, src, beam=4, alpha=alpha, max_len_a=1.0, max_len_b=2, n_best=3)
    for i, hyps in enumerate(beams):
        assert len(hyps) == 3
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 3  # no duplicated expansion
        for hyp in hyps:
            check_hypothesis(model, src[i], hyp, limits[i], alpha)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_max_length_respected(kind):
    model = MODELS[kind](seed=4, eos_shift=-40.0)  # EOS (almost) never chosen: outputs run to the cap
    src = make_src(5, 7, seed=4)
    limits = max_lengths(src, 1.5, 1).tolist()
    assert len(set(limits)) > 1
    counted = Counting(model)
    greedy = greedy_search(counted, src, max_len_a=1.5, max_len_b=1)
    assert [len(g) for g in greedy] == limits
    assert len(counted.rows) == max(limits)
    counted = Counting(model)
    beams = beam_search(counted, src, beam=3, alpha=0.6, max_len_a=1.5, max_len_b=1, n_best=2)
    assert len(counted.rows) == max(limits)
    for i, hyps in enumerate(beams):
        for hyp in hyps:
            assert len(hyp.tokens) == limits[i]
            assert hyp.score == pytest.approx(hyp.log_prob / length_penalty(limits[i], 0.6))


def test_zero_max_length_gives_empty_outputs_without_stepping():
    model = Counting(TableModel())
    src = make_src(2, 7, seed=0)
    assert greedy_search(model, src, max_len_a=0.0, max_len_b=0) == [[], []]
    assert beam_search(model, src, beam=2, max_len_a=0.0, max_len_b=0) == [[Hypothesis([], 0.0, 0.0)]] * 2
    assert model.rows == []


def test_invalid_arguments():
    src = make_src(2, 7, seed=0)
    with pytest.raises(ValueError):
        beam_search(TableModel(), src, beam=0)
    with pytest.raises(ValueError):
        beam_search(TableModel(), src, beam=2, n_best=3)
