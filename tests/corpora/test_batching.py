"""Token-count batching: budgets, coverage, BOS/EOS layout, length sorting, shuffling, filtering."""

from __future__ import annotations

import random

import pytest
import torch

from skiplab.tokenization import Tokenizer
from skiplab.corpora import Batch, Parallel, collate, encode_parallel, filter_long, make_batches

PAD, BOS, EOS = Tokenizer.PAD, Tokenizer.BOS, Tokenizer.EOS


def random_pairs(n: int = 300, seed: int = 0, max_len: int = 40) -> tuple[list[list[int]], list[list[int]]]:
    """Id sequences of varied lengths (some empty), with ids >= 4 so no special id occurs inside."""
    rng = random.Random(seed)
    src = [[rng.randint(4, 99) for _ in range(rng.randint(0, max_len))] for _ in range(n)]
    tgt = [[rng.randint(4, 99) for _ in range(rng.randint(0, max_len))] for _ in range(n)]
    return src, tgt


def lengths(t: torch.Tensor) -> list[int]:
    return (t != PAD).sum(1).tolist()


@pytest.mark.parametrize("max_tokens", [41, 64, 200, 4096])
def test_budget_and_coverage(max_tokens):
    src, tgt = random_pairs()
    batches = make_batches(src, tgt, max_tokens=max_tokens)
    for b in batches:
        assert b.src.dtype == b.tgt_in.dtype == b.tgt_out.dtype == b.index.dtype == torch.int64
        n = len(b)
        assert b.src.shape[0] == b.tgt_in.shape[0] == b.tgt_out.shape[0] == b.index.shape[0] == n >= 1
        assert n * max(b.src.shape[1], b.tgt_in.shape[1]) <= max_tokens
        # No column of padding only: the tensors are as narrow as their longest row.
        assert max(lengths(b.src)) == b.src.shape[1] and max(lengths(b.tgt_out)) == b.tgt_out.shape[1]
    seen = torch.cat([b.index for b in batches]).tolist()
    assert sorted(seen) == list(range(len(src)))  # every pair exactly once
    if max_tokens == 4096:
        assert len(batches) <= 4  # greedy packing fills batches rather than cutting early


def test_layout_matches_the_pairs():
    src, tgt = random_pairs(seed=1)
    for b in make_batches(src, tgt, max_tokens=300):
        for row, i in enumerate(b.index.tolist()):
            s, t = len(src[i]), len(tgt[i])
            assert b.src[row, : s + 1].tolist() == src[i] + [EOS]
            assert b.tgt_in[row, : t + 1].tolist() == [BOS] + tgt[i]
            assert b.tgt_out[row, : t + 1].tolist() == tgt[i] + [EOS]
            assert torch.equal(b.tgt_in[row, 1 : t + 1], b.tgt_out[row, :t])  # teacher forcing: shifted by one
            assert (b.src[row, s + 1 :] == PAD).all() and (b.tgt_in[row, t + 1 :] == PAD).all()
            assert (b.tgt_out[row, t + 1 :] == PAD).all()
        assert b.ntokens == sum(len(tgt[i]) + 1 for i in b.index.tolist())


def test_batches_are_length_sorted():
    src, tgt = random_pairs(seed=2)
    batches = make_batches(src, tgt, max_tokens=200)
    keys = [(len(src[i]), len(tgt[i])) for b in batches for i in b.index.tolist()]
    assert keys == sorted(keys)  # unshuffled: batches in order, each holding a consecutive sorted run
    widths = [b.src.shape[1] for b in batches]
    assert widths == sorted(widths) and len(set(widths)) > 3


def test_sort_is_stable():
    src = [[5, 6]] * 10
    tgt = [[7]] * 10
    assert torch.cat([b.index for b in make_batches(src, tgt, max_tokens=9)]).tolist() == list(range(10))


def test_shuffle_permutes_batches_not_contents():
    src, tgt = random_pairs(seed=3)
    plain = make_batches(src, tgt, max_tokens=150)
    assert len(plain) > 5

    def order(seed: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(seed)
        return [b.index.tolist() for b in make_batches(src, tgt, max_tokens=150, shuffle=True, generator=g)]

    assert order(0) == order(0)
    assert order(0) != order(1)
    assert sorted(order(0)) == sorted(b.index.tolist() for b in plain)  # same batches, other order
    assert order(0) != [b.index.tolist() for b in plain]


def test_indices_select_a_subset():
    src, tgt = random_pairs(n=50, seed=4)
    keep = list(range(0, 50, 3))
    batches = make_batches(src, tgt, max_tokens=120, indices=keep)
    assert sorted(torch.cat([b.index for b in batches]).tolist()) == keep


def test_filter_long():
    src = [[4] * 3, [4] * 9, [4] * 2, [4] * 10, []]
    tgt = [[5] * 9, [5] * 2, [5] * 10, [5] * 1, []]
    # With EOS/BOS the lengths are src 4 10 3 11 1, tgt 10 3 11 2 1.
    assert filter_long(src, tgt, max_len=10) == ([0, 1, 4], 2)
    assert filter_long(src, tgt, max_len=11) == ([0, 1, 2, 3, 4], 0)
    assert filter_long(src, tgt, max_len=1) == ([4], 4)
    assert filter_long(src, None, max_len=10) == ([0, 1, 2, 4], 1)
    with pytest.raises(ValueError, match="5 source sequences but 4 target"):
        filter_long(src, tgt[:4], max_len=10)


def test_over_long_pair_is_an_error():
    src, tgt = [[4] * 3, [4] * 2], [[5] * 2, [5] * 12]
    with pytest.raises(ValueError, match=r"pair 1 has 3 source and 13 target tokens .* max_tokens=12") as info:
        make_batches(src, tgt, max_tokens=12)
    assert "\n" not in str(info.value)
    keep, dropped = filter_long(src, tgt, max_len=12)
    assert dropped == 1 and len(make_batches(src, tgt, max_tokens=12, indices=keep)) == 1


def test_without_targets():
    src, _ = random_pairs(n=40, seed=5)
    batches = make_batches(src, None, max_tokens=100)
    assert sorted(torch.cat([b.index for b in batches]).tolist()) == list(range(40))
    for b in batches:
        assert b.tgt_in.shape == b.tgt_out.shape == (len(b), 0) and b.ntokens == 0
        assert len(b) * b.src.shape[1] <= 100


def test_empty_input():
    assert make_batches([], [], max_tokens=10) == []


def test_collate_and_to():
    b = collate([[7, 8, 9], [6]], [[10], [11, 12]], [4, 2])
    assert b.src.tolist() == [[7, 8, 9, EOS], [6, EOS, PAD, PAD]]
    assert b.tgt_in.tolist() == [[BOS, 10, PAD], [BOS, 11, 12]]
    assert b.tgt_out.tolist() == [[10, EOS, PAD], [11, 12, EOS]]
    assert b.index.tolist() == [4, 2] and b.ntokens == 5
    moved = b.to("cpu")
    assert isinstance(moved, Batch) and torch.equal(moved.src, b.src)


def test_encode_parallel_with_a_tokenizer(tmp_path):
    words = "ein Hund läuft schnell über die Straße a dog runs fast across the street".split()
    rng = random.Random(0)
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 8))) for _ in range(200)]
    tok = Tokenizer.train(lines, tmp_path / "spm", vocab_size=80)
    data = Parallel(lines[:100], lines[100:], "t")
    src, tgt = encode_parallel(tok, data)
    assert src == tok.encode_batch(data.src) and tgt == tok.encode_batch(data.tgt)
    batch = make_batches(src, tgt, max_tokens=256)[0]
    i = int(batch.index[0])
    assert tok.decode(batch.src[0]) == data.src[i] and tok.decode(batch.tgt_out[0]) == data.tgt[i]
