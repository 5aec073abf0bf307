"""Tokenizer: sentencepiece training on test-made sentences, special ids, round trips, serialization, errors."""

from __future__ import annotations

import pickle
import random

import pytest
import torch

from skiplab.tokenization import Tokenizer

WORDS = (
    "the a man woman dog child street park blue red shirt runs sits reads looks at in on with "
    "der die das Mann Frau Hund Kind Straße Park blaues rotes Hemd läuft sitzt liest schaut groß weiß "
    "một người đàn ông đang đọc sách ở công viên chó chạy trên đường "
    "ﬁnal"  # the ligature "ﬁ": NFKC normalisation would turn it into "fi" and break the round trip
).split()


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + rng.choice([".", "!", ""]) for _ in range(n)
    ]


TRAIN = sentences(300, seed=0)


def pieces(tok: Tokenizer) -> list[str]:
    return [tok.piece(i) for i in range(tok.vocab_size)]


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_the_same_text_gives_the_same_model_in_any_folder(tmp_path, model_type):
    """sentencepiece keeps the path it writes under in the model: two runs (or prepared folders) of the same text and
    options held tokenizers of other bytes, and other digests, by the name of their folder."""
    a = Tokenizer.train(TRAIN, tmp_path / "a" / "spm", vocab_size=200, model_type=model_type)
    b = Tokenizer.train(TRAIN, tmp_path / "elsewhere" / "deeper" / "spm", vocab_size=200, model_type=model_type)
    assert a.to_bytes() == b.to_bytes() and str(tmp_path).encode() not in a.to_bytes()
    vocab = (tmp_path / "a" / "spm.vocab").read_text().splitlines()
    assert len(vocab) == a.vocab_size and vocab[0].split("\t")[0] == a.piece(0)


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def tok(request, tmp_path_factory) -> Tokenizer:
    prefix = tmp_path_factory.mktemp("spm") / "sub" / "spm"  # a folder that does not exist yet
    t = Tokenizer.train(TRAIN, prefix, vocab_size=200, model_type=request.param)
    assert prefix.with_suffix(".model").is_file() and prefix.with_suffix(".vocab").is_file()
    return t


def test_special_ids(tok):
    assert (Tokenizer.PAD, Tokenizer.UNK, Tokenizer.BOS, Tokenizer.EOS) == (0, 1, 2, 3)
    assert [tok.piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert 4 < tok.vocab_size <= 200


def test_round_trip_exact(tok):
    for s in TRAIN[:50] + sentences(50, seed=1) + ["Straße groß weiß.", "đọc sách ở công viên!"]:
        ids = tok.encode(s)
        assert all(4 <= i < tok.vocab_size for i in ids)  # no specials, no UNK for seen characters
        assert tok.decode(ids) == s


def test_subwords_are_used(tok):
    # A vocabulary of 200 is far below the number of characters in a sentence: pieces merge characters.
    s = TRAIN[0]
    assert len(tok.encode(s)) < len(s)


def test_decode_skips_pad_bos_eos_and_takes_tensors(tok):
    ids = tok.encode("der Hund läuft")
    padded = [Tokenizer.BOS, *ids, Tokenizer.EOS, Tokenizer.PAD, Tokenizer.PAD]
    assert tok.decode(padded) == "der Hund läuft"
    assert tok.decode(torch.tensor(padded)) == "der Hund läuft"


def test_unseen_character_is_unk(tok):
    assert Tokenizer.UNK in tok.encode("the 漢 dog")


def test_encode_batch_matches_encode(tok):
    batch = sentences(20, seed=2)
    assert tok.encode_batch(batch) == [tok.encode(s) for s in batch]


def test_bytes_round_trip(tok):
    again = Tokenizer.from_bytes(tok.to_bytes())
    test = sentences(30, seed=3)
    assert again.vocab_size == tok.vocab_size
    assert again.encode_batch(test) == tok.encode_batch(test)
    assert pickle.loads(pickle.dumps(tok)).encode_batch(test) == tok.encode_batch(test)


def test_load_the_written_model(tok, tmp_path):
    path = tmp_path / "copy.model"
    path.write_bytes(tok.to_bytes())
    assert Tokenizer.load(path).encode(TRAIN[5]) == tok.encode(TRAIN[5])


def test_training_is_deterministic(tmp_path):
    a = Tokenizer.train(TRAIN, tmp_path / "a", vocab_size=150)
    b = Tokenizer.train(TRAIN, tmp_path / "b", vocab_size=150)
    # Not the bytes: the model records its training options, the output prefix included.
    assert pieces(a) == pieces(b)


def test_bpe_and_unigram_differ(tmp_path):
    bpe = Tokenizer.train(TRAIN, tmp_path / "bpe", vocab_size=150, model_type="bpe")
    uni = Tokenizer.train(TRAIN, tmp_path / "uni", vocab_size=150, model_type="unigram")
    assert pieces(bpe) != pieces(uni)


def test_bad_model_type(tmp_path):
    with pytest.raises(ValueError, match="unknown model_type 'word'; known: bpe, unigram"):
        Tokenizer.train(TRAIN, tmp_path / "x", model_type="word")


def test_vocab_too_small_for_the_characters(tmp_path):
    with pytest.raises(ValueError, match="vocab size 20 is too small.*--vocab-size") as info:
        Tokenizer.train(TRAIN, tmp_path / "x", vocab_size=20)
    assert "\n" not in str(info.value)


def test_no_text(tmp_path):
    with pytest.raises(ValueError, match="no text"):
        Tokenizer.train(["", "  "], tmp_path / "x", vocab_size=100)


def test_load_absent(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.model"):
        Tokenizer.load(tmp_path / "nope.model")


@pytest.mark.parametrize("data", [b"this is not a sentencepiece model", b"\x00" * 64, b""])
def test_load_corrupt(tmp_path, data):
    path = tmp_path / "bad.model"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=r"bad\.model: not a sentencepiece model") as info:
        Tokenizer.load(path)
    assert "\n" not in str(info.value)


def test_truncated_model_bytes(tok):
    with pytest.raises(ValueError, match="not a sentencepiece model"):
        Tokenizer.from_bytes(tok.to_bytes()[:100])


def test_out_of_range_ids(tok):
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([5, tok.vocab_size])
    with pytest.raises(ValueError, match="out of range"):
        tok.piece(-1)
