"""``prepare lm`` streams its text: :func:`iter_documents` / :func:`iter_read_documents` give the documents
:func:`load_documents` / :func:`read_documents` give, in order and a document at a time, for every layout and named
corpus; the folder prepare writes is, byte for byte, the one the split's list of documents gives; its memory is
bounded by a document and a shard, not by the split (a 50 MB file prepared in a few MB); and an empty split is
still a one-line error that leaves nothing behind."""

import dataclasses
import gzip
import hashlib
import io
import json
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from skiplab.cli import main
from skiplab.corpora.documents import (LM_CORPORA, DocumentStream, iter_documents, iter_read_documents, load_documents,
                                    read_documents)
from skiplab.tokenization.lm import ByteTokenizer, load_lm_tokenizer
from skiplab.corpora.prepare import PrepareConfig, prepare
from skiplab.corpora.shards import (FORMAT_NAME, FORMAT_VERSION, SIDECAR, TOKENIZER_FILE, open_shard, token_dtype,
                                 write_shard)
from skiplab.corpora.windows import count_words

TEXTS = ["The cat sat.\n  Indented   code:\tx = 1\n", "Zweite Geschichte: grüße, naïve café — ok", "中文 text 🙂",
         "line\u2028separator and \x85 next-line stay inside", " "]


def jsonl_bytes(texts, **extra) -> bytes:
    return "".join(json.dumps({"text": t, **extra}) + "\n" for t in texts).encode()


# ---- every source kind: the stream is the list --------------------------------------------------------------
def jsonl_file(tmp, mp):
    path = tmp / "a.jsonl"  # a byte-order mark, CRLF, blank lines, an empty document (dropped), no final newline
    path.write_bytes(b"\xef\xbb\xbf" + jsonl_bytes(TEXTS[:2], id=1).replace(b"\n", b"\r\n") + b"\n  \n"
                     + jsonl_bytes(["", *TEXTS[2:]]).rstrip(b"\n"))
    return path, TEXTS, "a.jsonl"


def jsonl_gz_file(tmp, mp):
    path = tmp / "a.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl_bytes(TEXTS)))
    return path, TEXTS, "a.jsonl.gz"


def txt_file(tmp, mp):
    path = tmp / "b.txt"  # blank lines (spaces, tabs, \x85) separate documents; \r\n is a line end
    path.write_bytes("\ufefffirst doc\r\nline two\r\n\r\n  \n\t\n second, indented\n\n\n\x85\nthird \x85 kept\n\n"
                     .encode() + "中文 last".encode())
    return path, ["first doc\nline two", " second, indented", "third \x85 kept", "中文 last"], "b.txt"


def txt_gz_file(tmp, mp):
    path = tmp / "b.data"  # gzip is known by its magic bytes, whatever the name
    path.write_bytes(gzip.compress(b"one\ntwo\n\nthree\n"))
    return path, ["one\ntwo", "three"], "b.data"


def folder(tmp, mp):
    path = tmp / "docs"
    path.mkdir()
    (path / "1.txt").write_text("one\n\nstill one\n")  # a text file is one document
    (path / "2.txt.gz").write_bytes(gzip.compress("zwei ü".encode()))
    (path / "3.jsonl").write_bytes(jsonl_bytes(["j1", "", "j2"]))
    (path / "4.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(["g1"])))
    (path / "5.txt").write_text("")  # an empty document, dropped
    (path / "ignored.csv").write_text("x")
    (path / "sub").mkdir()
    (path / "sub" / "6.txt").write_text("not read")
    return path, ["one\n\nstill one", "zwei ü", "j1", "j2", "g1"], "docs"


def pydocs(tmp, mp):
    (tmp / "valid.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(TEXTS)))
    return ("pydocs", tmp, "valid"), TEXTS, "pydocs/valid"


def tinystories(tmp, mp):  # the test split is the valid file
    (tmp / "TinyStoriesV2-GPT4-valid.txt").write_text(
        "Once upon a time.\n\nThe end.\n<|endoftext|>\nA dog.\n  <|endoftext|>  \n\n<|endoftext|>\nLast one.")
    return ("tinystories", tmp, "test"), ["Once upon a time.\n\nThe end.", "A dog.", "Last one."], "tinystories/test"


WIKI = " \n = Title = \n \n Text of it , with @-@ marks . \n \n = = Section = = \n \n More . \n"
WIKI_DOCS = [" = Title = ", " Text of it , with @-@ marks . ", " = = Section = = ", " More . "]


def wikitext_archive(tmp, mp):  # read from the zip, not extracted
    with zipfile.ZipFile(tmp / "wikitext-103-raw-v1.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("wikitext-103-raw/wiki.valid.raw", WIKI)
    return ("wikitext-103-raw", tmp, "valid"), WIKI_DOCS, "wikitext-103-raw/valid"


def wikitext_extracted(tmp, mp):
    (tmp / "wikitext-103-raw").mkdir()
    (tmp / "wikitext-103-raw" / "wiki.test.raw").write_text(WIKI)
    return ("wikitext-103-raw", tmp, "test"), WIKI_DOCS, "wikitext-103-raw/test"


def c4(tmp, mp):  # the shards present, in shard order
    shards = {7: ["c", "", "d"], 2: ["a", "b"]}
    for k, texts in shards.items():
        (tmp / f"c4-train.{k:05d}-of-01024.json.gz").write_bytes(
            gzip.compress(jsonl_bytes(texts, timestamp="2019-04-25T12:57:54Z", url="https://example.org")))
    return ("c4-en", tmp, "train"), ["a", "b", "c", "d"], "c4-en/train (2 of 1024 shards)"


def enwik8(tmp, mp):  # one document of bytes, kept exactly
    data = bytes(range(256)) * 4
    with zipfile.ZipFile(tmp / "enwik8.zip", "w") as z:
        z.writestr("enwik8", data)
    mp.setitem(LM_CORPORA, "enwik8", dataclasses.replace(LM_CORPORA["enwik8"], cuts=(700, 100, 100)))
    return ("enwik8", tmp, "valid"), [data[700:800].decode("utf-8", "surrogateescape")], "enwik8/valid"


def text8(tmp, mp):
    (tmp / "text8").write_text(" anarchism originated as a term of abuse " * 5)
    mp.setitem(LM_CORPORA, "text8", dataclasses.replace(LM_CORPORA["text8"], cuts=(150, 20, 20)))
    return ("text8", tmp, "test"), [(" anarchism originated as a term of abuse " * 5)[170:190]], "text8/test"


SOURCES = [jsonl_file, jsonl_gz_file, txt_file, txt_gz_file, folder, pydocs, tinystories, wikitext_archive,
           wikitext_extracted, c4, enwik8, text8]


@pytest.mark.parametrize("source", SOURCES, ids=[s.__name__ for s in SOURCES])
def test_the_stream_gives_the_lists_documents_for_every_source(source, tmp_path, monkeypatch):
    where, expected, name = source(tmp_path, monkeypatch)
    if isinstance(where, tuple):
        stream, whole = iter_documents(*where, download=False), load_documents(*where, download=False)
    else:
        stream, whole = iter_read_documents(where), read_documents(where)
    assert isinstance(stream, DocumentStream) and stream.name == whole.name == name
    assert list(stream) == whole.texts == expected
    assert list(stream) == expected  # read again from the start


def test_the_stream_reads_a_document_at_a_time(tmp_path):
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl_bytes(["one", "two"]) + b'{"txt": "no text"}\n'))
    stream = iter_read_documents(path)  # nothing is read yet: the fault is met when the stream reaches it
    it = iter(stream)
    assert next(it) == "one" and next(it) == "two"
    with pytest.raises(ValueError, match=r'a.jsonl.gz, line 3: not a JSON object with a "text" string'):
        next(it)
    stories = tmp_path / "TinyStoriesV2-GPT4-train.txt"
    stories.write_bytes(b"A story.\n<|endoftext|>\nAnother.\n<|endoftext|>\nbroken \xff\n")
    it = iter(iter_documents("tinystories", tmp_path, "train"))
    assert next(it) == "A story." and next(it) == "Another."
    with pytest.raises(ValueError, match="TinyStoriesV2-GPT4-train.txt: line 5 is not valid UTF-8"):
        next(it)


@pytest.mark.parametrize("data, error", [
    (jsonl_bytes(["ok"]) + b"[1]\n" + b'{"text": "\xff"}\n', "line 3 is not valid UTF-8"),  # as read at once:
    (gzip.compress(b"[1]\n" + jsonl_bytes(["ok"]))[:-9], "corrupt gzip file"),  # the file's fault first
    (b"\xef\xbb\xbf" + b'{"text": ""}\n\n{"text": " \\n "}', "empty corpus"),
], ids=["bad-byte-after-bad-line", "corrupt-gzip-after-bad-line", "blank"])
def test_the_stream_names_the_error_the_list_names(tmp_path, data, error):
    path = tmp_path / "a.jsonl"
    path.write_bytes(data)
    for read in (lambda: list(iter_read_documents(path)), lambda: read_documents(path)):
        with pytest.raises(ValueError, match=error) as err:
            read()
        assert len(str(err.value).splitlines()) == 1 and str(path) in str(err.value)


# ---- prepare writes what the list of documents gives --------------------------------------------------------
def expected_folder(cfg: PrepareConfig, tokenizer: bytes) -> dict[str, bytes]:
    """Every file of the folder prepare wrote before it streamed, from each split's list of documents (the
    tokens of each document and end of text, cut into shards; the document index; the sidecar)."""
    tok = load_lm_tokenizer(tokenizer)
    dtype = token_dtype(tok.vocab_size)
    files: dict[str, bytes] = {TOKENIZER_FILE: tokenizer}
    splits = {}
    scratch = Path(cfg.out).with_name("expected-shard.bin")
    for split in cfg.splits():
        docs = cfg.documents(split)
        encoded = [tok.encode_array(t).astype(dtype) for t in docs.texts]
        tokens = np.concatenate([np.append(ids, np.array([tok.eot], dtype=dtype)) for ids in encoded])
        shards = []
        for k, start in enumerate(range(0, len(tokens), cfg.shard_tokens)):
            name = f"{split}_{k:06d}.bin"
            write_shard(scratch, tokens[start : start + cfg.shard_tokens])
            files[name] = scratch.read_bytes()
            shards.append({"file": name, "tokens": len(tokens[start : start + cfg.shard_tokens])})
        scratch.unlink()
        ends = np.stack([np.cumsum([len(ids) + 1 for ids in encoded]),
                         np.cumsum([len(t.encode("utf-8", "surrogateescape")) for t in docs.texts]),
                         np.cumsum([count_words([t]) for t in docs.texts])], axis=1)
        ends = np.ascontiguousarray(ends, dtype=np.int64)
        top = max([int(ids.max()) for ids in encoded if len(ids)] + [tok.eot])
        entry = {"name": docs.name, "tokens": int(ends[-1, 0]), "bytes": int(ends[-1, 1]), "words": int(ends[-1, 2]),
                 "documents": len(docs.texts), "max_id": top, "shards": shards}
        if split in ("valid", "test"):
            buffer = io.BytesIO()
            np.save(buffer, ends, allow_pickle=False)
            files[f"{split}.docs.npy"] = buffer.getvalue()
            entry["index"] = f"{split}.docs.npy"
        splits[split] = entry
    meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "corpus": cfg.corpus,
            "files": {s: getattr(cfg, f"{s}_file") for s in cfg.splits()} if not cfg.corpus else {},
            "data_dir": cfg.data_dir, "tokenizer": cfg.tokenizer, "tokenizer_file": TOKENIZER_FILE,
            "tokenizer_sha256": hashlib.sha256(tokenizer).hexdigest(), "vocab_size": tok.vocab_size, "eot": tok.eot,
            "dtype": dtype.name, "shard_tokens": cfg.shard_tokens, "splits": splits}
    files[SIDECAR] = (json.dumps(meta, indent=2) + "\n").encode()
    return files


def corpus_pydocs(tmp):
    for split, n in (("train", 12), ("valid", 5), ("test", 4)):
        texts = [f"{split} document {i}: " + " ".join(TEXTS[: 1 + i % len(TEXTS)]) * (1 + i % 3) for i in range(n)]
        (tmp / f"{split}.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(texts + [""])))
    return {"corpus": "pydocs", "data_dir": str(tmp)}


def corpus_files(tmp):
    (tmp / "train.txt.gz").write_bytes(gzip.compress("\n\n".join(TEXTS[:4] * 3).encode()))
    folder(tmp, None)
    (tmp / "test.jsonl").write_bytes(jsonl_bytes(TEXTS * 2))
    return {"corpus": "", "train_file": str(tmp / "train.txt.gz"), "valid_file": str(tmp / "docs"),
            "test_file": str(tmp / "test.jsonl")}


def corpus_tinystories(tmp):
    for split in ("train", "valid"):
        (tmp / f"TinyStoriesV2-GPT4-{split}.txt").write_text(
            "".join(f"{split} story {i}. {TEXTS[i % len(TEXTS)]}\n<|endoftext|>\n" for i in range(9)))
    return {"corpus": "tinystories", "data_dir": str(tmp)}


@pytest.mark.parametrize("corpus, tokenizer, shard_tokens", [
    (corpus_pydocs, "bytes", 97),  # documents span shards
    (corpus_files, "bytes", 7),
    (corpus_tinystories, "bytes", 100_000),  # one shard a split
    (corpus_pydocs, "bpe", 50),  # trained here, on the train split's list
], ids=["pydocs-bytes", "files-bytes", "tinystories-one-shard", "pydocs-bpe"])
def test_prepare_writes_the_folder_the_list_of_documents_gives(corpus, tokenizer, shard_tokens, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    cfg = PrepareConfig(**corpus(data), tokenizer=tokenizer, vocab_size=400, shard_tokens=shard_tokens,
                        out=str(tmp_path / "out"))
    meta = prepare(cfg, progress=False)
    got = {p.name: p.read_bytes() for p in Path(cfg.out).iterdir()}
    expected = expected_folder(cfg, got[TOKENIZER_FILE])
    assert sorted(got) == sorted(expected)
    assert got == expected
    assert json.loads(got[SIDECAR]) == meta
    assert len(meta["splits"]["train"]["shards"]) > 1 or shard_tokens == 100_000
    if tokenizer == "bytes":
        assert got[TOKENIZER_FILE] == ByteTokenizer().to_bytes()
        assert open_shard(Path(cfg.out) / "train_000000.bin").dtype == np.uint16


# ---- memory -------------------------------------------------------------------------------------------------
def test_preparing_50_mb_holds_a_document_and_a_shard_not_the_split(tmp_path):
    """The list-based prepare held every text of the split: its peak was about three times the file (163 MB
    traced for this 54 MB file: the bytes, the decoded text and its lines, the documents); the stream holds one
    document (17 KB here), one shard's tokens (2^18 uint16) and their concatenation."""
    body = " ".join([f"{w}{'x' * 30}" for w in ("alpha", "beta", "gamma", "delta", "café", "中文")] * 80)
    big = tmp_path / "big.jsonl"
    with open(big, "w", encoding="utf-8") as f:
        for i in range(3000):
            f.write(json.dumps({"text": f"document {i} {body}"}) + "\n")
    (tmp_path / "valid.jsonl").write_text('{"text": "valid"}\n')
    size = big.stat().st_size
    assert size > 50e6
    cfg = PrepareConfig(corpus="", train_file=str(big), valid_file=str(tmp_path / "valid.jsonl"), tokenizer="bytes",
                        shard_tokens=1 << 18, out=str(tmp_path / "out"))
    tracemalloc.start()
    try:
        meta = prepare(cfg, progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size / 5, f"prepare's peak traced memory {peak / 1e6:.1f} MB for a {size / 1e6:.1f} MB file"
    train = meta["splits"]["train"]
    assert train["documents"] == 3000 and train["tokens"] == train["bytes"] + 3000 and len(train["shards"]) > 100


# ---- an empty split -----------------------------------------------------------------------------------------
def test_an_empty_split_is_a_one_line_error_and_leaves_nothing(tmp_path, capsys):
    (tmp_path / "train.jsonl").write_bytes(jsonl_bytes(TEXTS))
    (tmp_path / "valid.jsonl").write_bytes(jsonl_bytes(["", " \n\t ", ""]))  # found blank only at its end
    argv = ["prepare", "lm", "--corpus", "", "--train-file", tmp_path / "train.jsonl", "--valid-file",
            tmp_path / "valid.jsonl", "--shard-tokens", "5", "--out", tmp_path / "out"]  # train's shards written first
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err  # the progress bars, then the error: one line
    assert err.endswith(f"\nskiplab: error: {tmp_path / 'valid.jsonl'}: empty corpus (no text)\n")
    assert sum(line.startswith("skiplab") for line in err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.jsonl", "valid.jsonl"]  # no out, no out.partial
    with pytest.raises(ValueError, match="valid.jsonl: empty corpus") as raised:
        prepare(PrepareConfig(corpus="", train_file=str(tmp_path / "train.jsonl"),
                              valid_file=str(tmp_path / "valid.jsonl"), shard_tokens=5, out=str(tmp_path / "o")),
                progress=False)
    assert len(str(raised.value).splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.jsonl", "valid.jsonl"]


def test_a_fault_late_in_a_split_leaves_nothing(tmp_path):
    (tmp_path / "train.jsonl").write_bytes(jsonl_bytes(TEXTS * 20) + b"not json\n")
    (tmp_path / "valid.jsonl").write_bytes(jsonl_bytes(TEXTS))
    cfg = PrepareConfig(corpus="", train_file=str(tmp_path / "train.jsonl"), valid_file=str(tmp_path / "valid.jsonl"),
                        shard_tokens=10, out=str(tmp_path / "out"))
    with pytest.raises(ValueError, match=f'train.jsonl, line {len(TEXTS) * 20 + 1}: not a JSON object'):
        prepare(cfg, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.jsonl", "valid.jsonl"]
