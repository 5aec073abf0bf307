"""Language-model data: documents in three layouts, named corpora from their official files, tokenizers that
round-trip, token streams, .bin memmaps, windows, and bits per byte."""

import dataclasses
import gzip
import json
import math
import zipfile

import numpy as np
import pytest
import torch

from skiplab.cli import main
from skiplab.data.download import DownloadError
from skiplab.corpora.documents import LM_CORPORA, load_documents, read_documents
from skiplab.tokenization.lm import ByteTokenizer, load_lm_tokenizer, train_lm_tokenizer
from skiplab.corpora.windows import bits_per_byte, eval_windows, read_bin, sample_windows, token_stream, unigram_nats

TEXTS = ["The cat sat.\n  Indented   code:\tx = 1\n", "Zweite Geschichte: grüße, naïve café — ok", "中文 text 🙂"]


def test_jsonl_txt_and_folder_layouts(tmp_path):
    jsonl = tmp_path / "a.jsonl.gz"
    with gzip.open(jsonl, "wt", encoding="utf-8") as f:
        for t in TEXTS:
            f.write(json.dumps({"id": 1, "text": t}) + "\n")
    assert read_documents(jsonl).texts == TEXTS
    txt = tmp_path / "b.txt"
    txt.write_text("first doc line one\nline two\n\n\nsecond doc\n")
    assert read_documents(txt).texts == ["first doc line one\nline two", "second doc"]
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "1.txt").write_text("one\n\nstill one\n")
    with gzip.open(folder / "2.txt.gz", "wt") as f:
        f.write("two")
    (folder / "ignored.csv").write_text("x")
    assert read_documents(folder).texts == ["one\n\nstill one", "two"]


def test_bad_documents_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nstill fine\n\xff\xfe broken\n")
    with pytest.raises(ValueError, match=r"bad.txt: line 3 is not valid UTF-8"):
        read_documents(bad)
    js = tmp_path / "bad.jsonl"
    js.write_text('{"text": "ok"}\n{"txt": "no text key"}\n')
    with pytest.raises(ValueError, match=r'bad.jsonl, line 2: not a JSON object with a "text" string'):
        read_documents(js)
    # JSON's escape of half a surrogate pair is no character: an error naming the line, not the encoder's
    # "surrogates not allowed" mid-run, nor \udcff turned into the raw byte 0xff
    for half in ("\\ud800", "\\udcff"):
        lone = tmp_path / "lone.jsonl"
        lone.write_text('{"text": "fine \\u00e9"}\n{"text": "lone ' + half + ' surrogate"}\n')
        with pytest.raises(ValueError, match=r'lone.jsonl, line 2: its "text" holds .*, half of a UTF-16 surrogate '
                                             r'pair without its other half'):
            read_documents(lone)
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": ""}\n\n')
    with pytest.raises(ValueError, match="empty.jsonl: empty corpus"):
        read_documents(empty)


def test_named_corpora_read_their_official_files_and_name_the_download_offline(tmp_path, monkeypatch):
    data = (bytes(range(256)) * 40)[:9998] + "ü".encode()  # enwik8 is bytes, kept exactly even where not UTF-8
    with zipfile.ZipFile(tmp_path / "enwik8.zip", "w") as z:
        z.writestr("enwik8", data)
    miniature = dataclasses.replace(LM_CORPORA["enwik8"], cuts=(9000, 500, 500))  # of the 90M / 5M / 5M cut
    monkeypatch.setitem(LM_CORPORA, "enwik8", miniature)
    train = load_documents("enwik8", tmp_path, "train")
    assert ByteTokenizer().encode(train.texts[0]) == list(data[:9000]) and train.n_bytes == 9000
    assert ByteTokenizer().encode(load_documents("enwik8", tmp_path, "test").texts[0]) == list(data[9500:10000])
    stories = tmp_path / "tiny"
    stories.mkdir()
    (stories / "TinyStoriesV2-GPT4-valid.txt").write_text("Once upon a time.\nThe end.\n<|endoftext|>\nA dog.\n<|endoftext|>\n")
    assert load_documents("tinystories", stories, "test").texts == ["Once upon a time.\nThe end.", "A dog."]

    def offline(url, dest, timeout=30):
        raise DownloadError(f"could not download {url} (no network); fetch that file elsewhere and put it at {dest}")

    monkeypatch.setattr("skiplab.corpora.documents.fetch", offline)
    with pytest.raises(DownloadError, match="text8.zip"):
        load_documents("text8", tmp_path / "none", "train")
    with pytest.raises(FileNotFoundError, match="pydocs is not downloadable"):
        load_documents("pydocs", tmp_path / "none", "train")
    with pytest.raises(ValueError, match="unknown language-model corpus 'wiki'; known: pydocs, enwik8"):
        load_documents("wiki", tmp_path, "train")


def test_byte_tokenizer_round_trips_any_text():
    tok = ByteTokenizer()
    for t in TEXTS:
        ids = tok.encode(t)
        assert len(ids) == len(t.encode()) and max(ids) < 256 and tok.decode(ids + [tok.eot]) == t
    assert load_lm_tokenizer(tok.to_bytes()).vocab_size == 257


def test_bpe_round_trips_exactly_spaces_newlines_and_unseen_characters(tmp_path):
    train = [("The quick brown fox jumps over the lazy dog.\n    def f(x):\n        return x  # two  spaces\n") * 3
             for _ in range(20)]
    tok = train_lm_tokenizer("bpe", train, tmp_path / "spm", 300)
    for t in TEXTS + train[:1] + ["\n\n\n   \t"]:
        assert tok.decode(tok.encode(t)) == t  # 中, 🙂 and ü were never seen: byte fallback
    again = load_lm_tokenizer(tok.to_bytes())
    assert again.encode(TEXTS[0]) == tok.encode(TEXTS[0]) and again.eot == 3


def test_stream_joins_documents_with_end_of_text_and_counts_their_bytes():
    tok = ByteTokenizer()
    s = token_stream([tok.encode(t) for t in ["ab", "ü"]], tok.eot, tok.vocab_size, 4, "x")
    assert s.tokens.tolist() == [97, 98, 256, 0xC3, 0xBC, 256] and s.tokens.dtype == np.uint16


def test_bin_files_are_memory_mapped_and_checked(tmp_path):
    tokens = np.array([5, 1, 7, 2, 9], dtype=np.uint16)
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    (tmp_path / "train.bin.json").write_text('{"bytes": 12}')
    s = read_bin(path, "uint16", 10)
    assert isinstance(s.tokens, np.memmap) and s.tokens.tolist() == [5, 1, 7, 2, 9] and s.n_bytes == 12
    with pytest.raises(ValueError, match="token id 9 is not below the vocabulary size 8"):
        read_bin(path, "uint16", 8)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    with pytest.raises(ValueError, match="odd.bin: 3 bytes is not a whole number of uint16 tokens"):
        read_bin(odd, "uint16", 10)
    with pytest.raises(ValueError, match="odd.bin: 3 bytes is not a whole number of uint32 tokens"):
        read_bin(odd, "uint32", 10)


def test_windows_resume_from_the_generator_state():
    s = token_stream([list(range(100))], 100, 101, 100, "x")
    gen = torch.Generator().manual_seed(3)
    first = sample_windows(s, 8, 4, gen)
    state = gen.get_state()
    a = sample_windows(s, 8, 4, gen)
    gen2 = torch.Generator()
    gen2.set_state(state)
    b = sample_windows(s, 8, 4, gen2)
    assert torch.equal(a[0], b[0]) and torch.equal(first[1][:, :-1], first[0][:, 1:])  # targets: inputs shifted


@pytest.mark.parametrize("stride", [0, 3, 1, 8])
def test_evaluation_scores_every_target_once_with_enough_context(stride):
    s = token_stream([list(range(50))], 50, 51, 50, "x")  # 51 tokens: 50 targets
    seen, n = [], 8
    for w in eval_windows(s, n, stride, batch=3):
        for row, scored, x in zip(w.targets, w.scored, w.inputs):
            for pos in scored.nonzero().flatten().tolist():
                seen.append(int(row[pos]))
                context = pos + 1  # tokens the target sees
                assert context >= (n - stride if stride and row[0] != 1 else 1)
    assert sorted(seen) == seen == list(range(1, 51))


def test_bits_per_byte_by_hand():
    """A uniform model over 4 symbols on 6 bytes of text, 7 targets (one end of text): 7 · ln 4 nats."""
    nats = 7 * math.log(4)
    assert bits_per_byte(nats, 6) == pytest.approx(7 * 2 / 6)
    assert bits_per_byte(nats, 0) is None


def test_unigram_nats_by_hand():
    """Training stream 0 0 0 1 e (e = 2, the end of text; N = 5) over V = 3 ids: p = (count + 1) / 8, add-one.
    Scored stream e 0 1 e: its first token has no context, so the targets are 0, 1, e."""
    train = token_stream([[0, 0, 0, 1]], 2, 3, 4, "train")
    counts = {0: 3, 1: 1, 2: 1}
    p = {t: (c + 1) / (5 + 3) for t, c in counts.items()}
    scored = token_stream([[2, 0, 1]], 2, 3, 3, "test")  # 2 0 1 2: targets 0, 1, 2
    assert unigram_nats(train, scored, 3) == pytest.approx(-(math.log(p[0]) + math.log(p[1]) + math.log(p[2])))
    uniform = token_stream([[]], 2, 3, 0, "empty")  # one end-of-text token: every id about equally likely
    assert unigram_nats(uniform, scored, 3) == pytest.approx(-(2 * math.log(1 / 4) + math.log(2 / 4)))
    with pytest.raises(ValueError, match="id 2, outside the vocabulary of 2"):
        unigram_nats(train, scored, 2)


@pytest.mark.parametrize("sidecar, said", [("[1, 2]", "a list, not an object"),
                                           ('{"bytes": null}', '"bytes" is null, not the text\'s UTF-8 bytes'),
                                           ('{"bytes": -4}', '"bytes" is -4'), ('{"bytes": ', "not JSON")])
def test_a_bad_token_file_sidecar_is_one_line_naming_it(tmp_path, capsys, sidecar, said):
    """FILE.bin.json gives the text's bytes; one that is not {"bytes": N} is one line naming it, before a run
    writes anything."""
    for split in ("train", "valid"):
        np.arange(200, dtype=np.uint16).tofile(tmp_path / f"{split}.bin")
        (tmp_path / f"{split}.bin.json").write_text('{"bytes": 400}')
    (tmp_path / "valid.bin.json").write_text(sidecar)
    out = tmp_path / "run"
    assert main(["train", "lm", "--corpus", "", "--train-file", str(tmp_path / "train.bin"), "--valid-file",
                 str(tmp_path / "valid.bin"), "--vocab-size", "256", "--model",
                 "gpt-mini(d_model=16,heads=2,layers=1,ffn_dim=32,context=16)", "--max-steps", "1", "--device", "cpu",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"skiplab: error: {tmp_path / 'valid.bin.json'}: {said}"), err
    assert not out.exists()


def test_what_an_evaluation_covers_says_what_the_split_is():
    """A text split is documents joined by the end-of-text token; a .bin split is its ids as the file holds them (it
    read as documents, which a token file does not know)."""
    from skiplab.corpora.windows import Stream
    from skiplab.train.lm import coverage

    text = coverage(Stream(np.zeros(10, dtype=np.uint16), 40, "test.jsonl", n_words=7), 8)
    ids = coverage(Stream(np.zeros(10, dtype=np.uint16), 40, "test.bin"), 8)
    assert text.startswith("test.jsonl: its documents, each followed by the end-of-text token, in one stream of 10")
    assert ids.startswith("test.bin: its token ids as the file holds them, one stream of 10 tokens")
    assert "documents" not in ids and "words unknown" in ids


def test_a_run_on_token_files_without_their_sidecars_records_its_bytes_and_tokenizer_as_unknown(tmp_path, capsys):
    """It recorded data.tokenizer "bytes" and 0 bytes, and eval lm reported "bytes": 0, where the docs say null."""
    for split in ("train", "valid", "test"):
        np.arange(300, dtype=np.uint16).tofile(tmp_path / f"{split}.bin")
    out = tmp_path / "run"
    assert main(["train", "lm", "--corpus", "", *(x for s in ("train", "valid", "test") for x in
                                                  (f"--{s}-file", str(tmp_path / f"{s}.bin"))),
                 "--vocab-size", "300", "--model", "gpt-mini(d_model=16,heads=2,layers=1,ffn_dim=32,context=16)",
                 "--max-steps", "1", "--eval-every", "1", "--warmup", "1", "--device", "cpu", "--out", str(out)]) == 0
    data = json.loads((out / "config.json").read_text())["data"]
    assert data["train_bytes"] is None and data["valid_bytes"] is None and data["tokenizer"] is None
    capsys.readouterr()
    assert main(["eval", "lm", "--checkpoint", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["bytes"] is None and result["bpb"] is None and result["tokens"] > 0
