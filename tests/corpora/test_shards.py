"""Token shards: llm.c's data files read and written, a corpus prepared once giving the streams and training
windows the text gives (bytes, a trained subword model, pretrained tokenizers; uint16 and uint32), a run trained
and scored on a prepared folder as on the text, and every bad folder a one-line error naming its file."""

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from skiplab.cli import main
from skiplab.tokenization.lm import ByteTokenizer, load_lm_tokenizer
from skiplab.corpora.prepare import PrepareConfig, prepare
from skiplab.corpora.shards import SIDECAR, ShardedTokens, open_shard, read_prepared, write_shard
from skiplab.corpora.windows import read_bin, window_starts, windows_at
from skiplab.train.lm import LMTrainConfig, evaluate_checkpoint
from skiplab.train.lm_data import stream
from tests.tokenization.test_pretrained_tokenizers import write_hf, write_tiktoken
from tests.train.test_distributed import one_thread
from tests.train.test_lm import STORY, TINY

DOCS = {"train": [STORY * (1 + i % 3) + f"document {i}, café 中文\n\n  indented" for i in range(30)],
        "valid": [STORY + f"valid {i} ü" for i in range(5)], "test": [STORY * 2 + f"test {i}" for i in range(4)]}


@pytest.fixture(scope="module")
def pydocs(tmp_path_factory) -> Path:
    """A corpus in pydocs' layout (train/valid/test.jsonl.gz, one document a line)."""
    root = tmp_path_factory.mktemp("pydocs")
    for split, texts in DOCS.items():
        with gzip.open(root / f"{split}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    return root


def run(argv) -> int:
    return main([str(a) for a in argv])


def prepared(pydocs, out, tokenizer="bytes", shard_tokens=1000, **extra) -> Path:
    prepare(PrepareConfig(corpus="pydocs", data_dir=str(pydocs), tokenizer=tokenizer, shard_tokens=shard_tokens,
                          out=str(out), **extra), progress=False)
    return out


def test_a_shard_is_llm_cs_data_file(tmp_path):
    tokens = np.array([5, 1, 65535, 0, 9], dtype=np.uint16)
    write_shard(tmp_path / "a.bin", tokens)
    raw = (tmp_path / "a.bin").read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert header[:3].tolist() == [20240520, 1, 5] and not header[3:].any() and len(raw) == 1024 + 2 * 5
    got = open_shard(tmp_path / "a.bin")
    assert isinstance(got, np.memmap) and got.dtype == np.uint16 and got.tolist() == tokens.tolist()
    write_shard(tmp_path / "b.bin", np.array([70000, 3], dtype=np.uint32))  # llm.c's LLaMA-3 header
    assert np.fromfile(tmp_path / "b.bin", dtype="<i4", count=3).tolist() == [20240801, 7, 2]
    assert open_shard(tmp_path / "b.bin").tolist() == [70000, 3]


def test_a_glob_of_llm_c_shards_is_one_stream(tmp_path):
    write_shard(tmp_path / "fineweb_train_000001.bin", np.array([1, 2, 3], dtype=np.uint16))
    write_shard(tmp_path / "fineweb_train_000002.bin", np.array([4, 5], dtype=np.uint16))
    (tmp_path / "fineweb_val_000000.bin").write_bytes(b"not this one")
    s = read_bin(str(tmp_path / "fineweb_train_*.bin"), "uint16", 6)
    assert isinstance(s.tokens, ShardedTokens) and len(s) == 5 and np.asarray(s.tokens).tolist() == [1, 2, 3, 4, 5]
    assert s.tokens[2:4].tolist() == [3, 4] and s.tokens[1:3].tolist() == [2, 3] and s.tokens[4] == 5
    assert windows_at(s, [1], 3)[0].tolist() == [[2, 3, 4]]
    with pytest.raises(ValueError, match="fineweb_train_000002.bin: token id 5 is not below the vocabulary size 5"):
        read_bin(str(tmp_path / "fineweb_train_*.bin"), "uint16", 5)
    with pytest.raises(FileNotFoundError, match="no such file matches"):
        read_bin(str(tmp_path / "nothing_*.bin"), "uint16", 6)


def test_bad_shards_are_one_line_naming_the_file(tmp_path):
    good = tmp_path / "good.bin"
    write_shard(good, np.array([1, 2, 3], dtype=np.uint16))
    raw = bytearray(good.read_bytes())
    cases = {"magic.bin": (0, 20240521, "not a token shard \\(magic 20240521, version 1"),
             "version.bin": (1, 2, "not a token shard \\(magic 20240520, version 2"),
             "count.bin": (2, 4, "the header says 4 uint16 tokens \\(8 bytes after the header\\), the file holds 3$")}
    for name, (field, value, message) in cases.items():
        bad = bytearray(raw)
        bad[4 * field : 4 * field + 4] = np.array([value], dtype="<i4").tobytes()
        (tmp_path / name).write_bytes(bytes(bad))
        with pytest.raises(ValueError, match=f"{name}: {message}"):
            open_shard(tmp_path / name)
    # a byte short of 1,170,085 tokens: the exact count (it read "the file holds 1.17008e+06")
    big = tmp_path / "big.bin"
    write_shard(big, np.zeros(1_170_085, dtype=np.uint16))
    big.write_bytes(big.read_bytes()[:-1])
    with pytest.raises(ValueError, match=r"big.bin: the header says 1170085 uint16 tokens \(2340170 bytes after the "
                                         r"header\), the file holds 2340169 bytes \(1170084 tokens and 1 byte more\)$"):
        open_shard(big)
    (tmp_path / "short.bin").write_bytes(raw[:100])
    with pytest.raises(ValueError, match="short.bin: 100 bytes, shorter than the 1024-byte header"):
        open_shard(tmp_path / "short.bin")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    write_shard(mixed / "a_0.bin", np.array([1, 2], dtype=np.uint16))
    write_shard(mixed / "a_1.bin", np.array([1, 2], dtype=np.uint32))
    with pytest.raises(ValueError, match="a_1.bin: uint32 tokens, where the files before it hold uint16"):
        read_bin(str(mixed / "a_*.bin"), "uint16", 10)


def same_stream(text_cfg: LMTrainConfig, prepared_cfg: LMTrainConfig, tok, split: str, tokens: int = 0):
    a, b = stream(text_cfg, split, tok, tokens), stream(prepared_cfg, split, tok, tokens)
    assert np.asarray(b.tokens).dtype == a.tokens.dtype
    assert np.array_equal(np.asarray(b.tokens), a.tokens)
    assert (b.n_bytes, b.n_words, b.name) == (a.n_bytes, a.n_words, a.name) and a.n_words > 0
    return a, b


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_a_prepared_corpus_gives_the_texts_streams_and_windows(pydocs, tmp_path, tokenizer):
    out = prepared(pydocs, tmp_path / "prep", tokenizer, shard_tokens=97, vocab_size=300)  # documents span shards
    meta = json.loads((out / SIDECAR).read_text())
    assert {s["tokens"] for s in meta["splits"]["train"]["shards"][:-1]} == {97}
    text_cfg = LMTrainConfig(model=TINY, data_dir=str(pydocs), tokenizer=tokenizer, vocab_size=300)
    prep_cfg = LMTrainConfig(model=TINY, data_dir=str(out), tokenizer=tokenizer, vocab_size=300)
    tok = load_lm_tokenizer((out / "tokenizer.bin").read_bytes())
    if tokenizer == "bytes":
        assert isinstance(tok, ByteTokenizer)
    else:  # the model prepare trains is the one train lm trains from the same text
        from skiplab.tokenization.lm import train_lm_tokenizer

        again = train_lm_tokenizer("bpe", DOCS["train"], tmp_path / "spm", 300)  # its bytes name its own path
        assert all(again.encode(t) == tok.encode(t) for texts in DOCS.values() for t in texts)
    for split in ("train", "valid", "test"):
        a, b = same_stream(text_cfg, prep_cfg, tok, split)
        info = meta["splits"][split]
        assert info["tokens"] == len(a) and info["bytes"] == a.n_bytes and info["documents"] == len(DOCS[split])
        assert info["words"] == a.n_words
        assert info["max_id"] == int(a.tokens.max()) and sum(s["tokens"] for s in info["shards"]) == len(a)
    assert len(meta["splits"]["train"]["shards"]) > 2  # several shards: windows cross their ends
    for cut in (1, 150, 400, 10**6):  # --valid-tokens: the first documents holding them, with their bytes
        same_stream(text_cfg, prep_cfg, tok, "valid", cut)
    train_text, train_prep = stream(text_cfg, "train", tok), stream(prep_cfg, "train", tok)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    for _ in range(20):
        s1, s2 = window_starts(train_text, 32, 8, g1), window_starts(train_prep, 32, 8, g2)
        assert s1 == s2
        for x1, x2 in zip(windows_at(train_text, s1, 32), windows_at(train_prep, s2, 32)):
            assert torch.equal(x1, x2)
    assert meta["vocab_size"] == tok.vocab_size and meta["eot"] == tok.eot and meta["dtype"] == "uint16"
    assert meta["corpus"] == "pydocs" and meta["tokenizer"] == tokenizer


@pytest.mark.parametrize("form", ["hf", "tiktoken"])
def test_pretrained_tokenizers_are_carried_in_the_folder(pydocs, tmp_path, form):
    if form == "tiktoken":
        pytest.importorskip("tiktoken")
    (tmp_path / "t").mkdir()
    path = write_hf(tmp_path / "t" / "tokenizer.json", ["<|endoftext|>"]) if form == "hf" else \
        write_tiktoken(tmp_path / "t" / "tiny.tiktoken")
    spec = f"hf:{path}" if form == "hf" else f"tiktoken:cl100k_base:{path}"
    out = prepared(pydocs, tmp_path / "prep", spec, shard_tokens=500)
    meta = json.loads((out / SIDECAR).read_text())
    assert meta["dtype"] == ("uint16" if form == "hf" else "uint32")  # cl100k_base: 100,277 ids
    tok = load_lm_tokenizer((out / "tokenizer.bin").read_bytes())
    text_cfg = LMTrainConfig(model=TINY, data_dir=str(pydocs), tokenizer=spec)
    moved = spec.replace(str(path), "elsewhere/" + path.name)  # the file need not be where it was
    path.unlink()
    same_stream(text_cfg, LMTrainConfig(model=TINY, data_dir=str(out), tokenizer=moved), tok, "test")
    with pytest.raises(ValueError, match=f"prepared with --tokenizer {form}"):
        stream(LMTrainConfig(model=TINY, data_dir=str(out), tokenizer="bytes"), "test", None)
    if form == "tiktoken":  # the encoding's own end of text, named or not, is one tokenizer
        named = moved.replace("tiktoken:", "tiktoken(eot=<|endoftext|>):")
        same_stream(text_cfg, LMTrainConfig(model=TINY, data_dir=str(out), tokenizer=named), tok, "test")
        other = moved.replace("tiktoken:", "tiktoken(eot=<|endofprompt|>):")
        with pytest.raises(ValueError, match=re.escape(f"prepared with --tokenizer {spec}, not {other}")):
            stream(LMTrainConfig(model=TINY, data_dir=str(out), tokenizer=other), "test", None)


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_a_run_on_a_prepared_folder_trains_and_scores_as_on_the_text(pydocs, tmp_path, capsys, tokenizer):
    out = tmp_path / "prep"
    words = ["--tokenizer", tokenizer, "--vocab-size", "300"]
    assert run(["prepare", "lm", "--corpus", "pydocs", "--data-dir", pydocs, "--shard-tokens", "700", *words,
                "--out", out]) == 0
    assert "train" in capsys.readouterr().out and (out / "train_000001.bin").is_file()
    common = ["--model", TINY, "--batch-size", "4", "--max-steps", "3", "--eval-every", "3", "--warmup", "1",
              "--valid-tokens", "300", "--device", "cpu", *words]
    with one_thread():
        assert run(["train", "lm", "--data-dir", pydocs, *common, "--out", tmp_path / "text"]) == 0
        assert run(["train", "lm", "--data-dir", out, *common, "--out", tmp_path / "prepared"]) == 0
    records = [[json.loads(x) for x in (tmp_path / r / "metrics.jsonl").read_text().splitlines()]
               for r in ("text", "prepared")]
    keys = ("step", "train_loss", "valid_loss", "valid_bpb")
    assert [[r[k] for k in keys] for r in records[0]] == [[r[k] for k in keys] for r in records[1]]
    configs = [json.loads((tmp_path / r / "config.json").read_text())["data"] for r in ("text", "prepared")]
    assert configs[0] == configs[1]
    a = evaluate_checkpoint(tmp_path / "text", "test", progress=False)
    b = evaluate_checkpoint(tmp_path / "text", "test", data_dir=str(out), progress=False)
    keys = ("loss", "bpb", "token_ppl", "word_ppl", "tokens", "bytes", "words")
    assert [a[k] for k in keys] == [b[k] for k in keys] and a["word_ppl"]
    assert (tmp_path / "prepared" / "spm.model").is_file() == (tokenizer == "bpe")


def test_bad_folders_are_one_line_naming_the_file(pydocs, tmp_path):
    out = prepared(pydocs, tmp_path / "prep")
    cfg = LMTrainConfig(model=TINY, data_dir=str(out))
    assert len(stream(cfg, "valid", None)) > 0

    def broken(edit) -> LMTrainConfig:
        copy = tmp_path / f"broken{len(list(tmp_path.iterdir()))}"
        copy.mkdir()
        for f in out.iterdir():
            (copy / f.name).write_bytes(f.read_bytes())
        meta = json.loads((copy / SIDECAR).read_text())
        edit(copy, meta)
        (copy / SIDECAR).write_text(json.dumps(meta))
        return LMTrainConfig(model=TINY, data_dir=str(copy))

    def shard(meta, split="valid"):
        return meta["splits"][split]["shards"][0]

    cases = [
        (lambda c, m: shard(m).update(tokens=shard(m)["tokens"] - 1), "valid_000000.bin: .* tokens, where .* says"),
        (lambda c, m: m["splits"]["valid"].update(tokens=1), "prepared.json: the valid shards hold"),
        (lambda c, m: m["splits"]["valid"].update(max_id=257), "the valid split's largest id 257 is not below"),
        (lambda c, m: m.update(dtype="uint32"), "prepared.json: token type uint32 for a vocabulary of 257"),
        (lambda c, m: (c / shard(m)["file"]).unlink(), "valid_000000.bin: no such shard"),
        (lambda c, m: write_shard(c / shard(m)["file"], np.zeros(shard(m)["tokens"], np.uint32)),
         "valid_000000.bin: uint32 tokens, where .*prepared.json says uint16"),
        (lambda c, m: (c / "tokenizer.bin").write_bytes(b"other"), "tokenizer.bin: not the tokenizer"),
        (lambda c, m: m.update(version=2), "prepared.json: sidecar version 2"),
        (lambda c, m: m.pop("eot"), "prepared.json: a sidecar missing or mangling a field"),
        (lambda c, m: m.update(corpus="enwik8"), "prepared from enwik8, not pydocs; a training run gives --corpus enwik8; an evaluation, a --data-dir prepared"),
    ]
    for edit, message in cases:
        bad = broken(edit)
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            tok = ByteTokenizer() if "tokenizer.bin" in message else None
            stream(bad, "valid", tok)
    with pytest.raises(ValueError, match="prepared with --tokenizer bytes, not bpe; a training run gives --tokenizer bytes; an evaluation, a "
                                         "--data-dir prepared for its run"):
        stream(LMTrainConfig(model=TINY, data_dir=str(out), tokenizer="bpe"), "valid", None)
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / SIDECAR).write_text("{")
    with pytest.raises(ValueError, match="j/prepared.json: not JSON"):
        read_prepared(tmp_path / "j")


def test_prepare_writes_nothing_on_an_error_and_never_replaces_a_folder(pydocs, tmp_path, capsys):
    argv = ["prepare", "lm", "--corpus", "", "--train-file", pydocs / "train.jsonl.gz", "--valid-file",
            tmp_path / "absent.jsonl", "--out", tmp_path / "out"]
    assert run(argv) == 2
    assert "absent.jsonl: no such file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    argv[argv.index(tmp_path / "absent.jsonl")] = pydocs / "valid.jsonl.gz"
    assert run(argv) == 0
    meta = json.loads((tmp_path / "out" / SIDECAR).read_text())
    assert set(meta["splits"]) == {"train", "valid"} and meta["corpus"] == ""
    assert run(argv) == 2 and "out: already exists" in capsys.readouterr().err
    cfg = LMTrainConfig(model=TINY, corpus="", data_dir=str(tmp_path / "out"))
    assert len(stream(cfg, "train", None)) == meta["splits"]["train"]["tokens"]


def test_training_on_a_bad_folder_writes_nothing(pydocs, tmp_path, capsys):
    out = prepared(pydocs, tmp_path / "prep")
    (out / "train_000001.bin").write_bytes(b"\0" * 2000)
    argv = ["train", "lm", "--data-dir", out, "--model", TINY, "--max-steps", "1", "--device", "cpu",
            "--out", tmp_path / "run"]
    assert run(argv) == 2
    assert "train_000001.bin: not a token shard (magic 0, version 0" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    # the test split, which the finished run is scored on: a missing shard is found before anything is written too
    # (the run finished, and `eval lm --split test` failed afterwards)
    missing = copy_folder(prepared(pydocs, tmp_path / "prep2"), tmp_path / "missing")
    (missing / "test_000000.bin").unlink()
    argv[argv.index(out)] = missing
    assert run(argv) == 2
    assert "test_000000.bin: no such shard" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def one_line(capsys) -> str:
    """The one line of stderr a refused command leaves (no traceback)."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("skiplab: error: "), err
    return err


def copy_folder(source: Path, target: Path) -> Path:
    target.mkdir()
    for f in source.iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    return target


def test_a_shard_holding_an_id_its_sidecar_does_not_is_one_line_in_train_and_eval(pydocs, tmp_path, capsys):
    """prepared.json gives each split's largest id; a shard holding a larger one (here past the vocabulary too) is
    found by one max over its memmap, before a run writes anything, and where eval lm --data-dir reads it."""
    out = prepared(pydocs, tmp_path / "prep")
    bad = copy_folder(out, tmp_path / "bad")
    meta = json.loads((bad / SIDECAR).read_text())
    shards = {split: bad / meta["splits"][split]["shards"][-1]["file"] for split in ("train", "test")}
    for shard in shards.values():
        tokens = np.array(open_shard(shard))
        tokens[len(tokens) // 2] = 300  # the vocabulary is 257; the sidecar says 256
        write_shard(shard, tokens)
    argv = ["train", "lm", "--data-dir", bad, "--model", TINY, "--batch-size", "2", "--max-steps", "1",
            "--device", "cpu", "--out", tmp_path / "run"]
    with one_thread():
        assert run(argv) == 2
        err = one_line(capsys)
        assert f"{shards['train']}: holds token id 300, where {bad / SIDECAR} gives the train split's " \
               "largest as 256 (vocabulary 257)" in err, err
        assert not (tmp_path / "run").exists()
        argv[argv.index(bad)] = out  # the same command on the good folder trains
        assert run(argv) == 0
        before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
        capsys.readouterr()
        assert run(["eval", "lm", "--checkpoint", tmp_path / "run", "--data-dir", bad, "--device", "cpu"]) == 2
        assert f"{shards['test']}: holds token id 300" in one_line(capsys)
        assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before


@pytest.mark.parametrize("splits, said", [([], "splits is a list, not an object"), (None, "splits is null"),
                                          ({"train": [1]}, "splits.train is a list, not an object")])
def test_a_sidecar_whose_splits_are_not_an_object_is_one_line(pydocs, tmp_path, capsys, splits, said):
    bad = copy_folder(prepared(pydocs, tmp_path / "prep"), tmp_path / "bad")
    meta = json.loads((bad / SIDECAR).read_text())
    (bad / SIDECAR).write_text(json.dumps({**meta, "splits": splits}))
    assert run(["train", "lm", "--data-dir", bad, "--model", TINY, "--max-steps", "1", "--device", "cpu",
                "--out", tmp_path / "run"]) == 2
    err = one_line(capsys)
    assert f"{bad / SIDECAR}: a sidecar missing or mangling a field ({said}" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("garbage", ["objects", "bytes", "npz"])
def test_a_garbage_document_index_is_one_line_naming_it(pydocs, tmp_path, capsys, garbage):
    """--valid-tokens reads valid.docs.npy (NumPy's format, never unpickled): one that is not an index is one
    line naming the file, before the run writes anything."""
    bad = copy_folder(prepared(pydocs, tmp_path / "prep"), tmp_path / "bad")
    index = bad / "valid.docs.npy"
    if garbage == "objects":
        np.save(index, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif garbage == "bytes":
        index.write_bytes(b"not an array at all")
    else:
        with open(index, "wb") as f:
            np.savez(f, ends=np.zeros((5, 3), dtype=np.int64))
    assert run(["train", "lm", "--data-dir", bad, "--model", TINY, "--valid-tokens", "100", "--max-steps", "1",
                "--device", "cpu", "--out", tmp_path / "run"]) == 2
    assert f"skiplab: error: {index}: not " in one_line(capsys)
    assert not (tmp_path / "run").exists()


def test_prepare_never_removes_a_partial_folder_it_did_not_make(pydocs, tmp_path, capsys):
    """OUT.partial is this command's work folder; one without its mark is someone else's and is kept (one line),
    one an interrupted run left (marked) is removed and the folder made."""
    argv = ["prepare", "lm", "--corpus", "", "--train-file", pydocs / "train.jsonl.gz", "--valid-file",
            pydocs / "valid.jsonl.gz", "--out", tmp_path / "out"]
    mine = tmp_path / "out.partial"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert run(argv) == 2
    assert f"{mine}: already exists and is not what an interrupted skiplab prepare lm leaves" in one_line(capsys)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and not (tmp_path / "out").exists()
    (mine / ".skiplab-prepare").write_text("")  # as an interrupted run leaves it
    assert run(argv) == 0
    assert not mine.exists() and sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")) == []


def test_prepare_refuses_token_files_naming_them(tmp_path, capsys):
    """A .bin split is token ids already (train lm reads it as it is): it was read as text, "line 1 is not valid
    UTF-8"."""
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "t.bin")
    (tmp_path / "v.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    argv = ["prepare", "lm", "--corpus", "", "--train-file", str(tmp_path / "t.bin"), "--valid-file",
            str(tmp_path / "v.jsonl"), "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--train-file: .bin files are token ids already, which train lm reads as they are" \
        in err, err
    assert not (tmp_path / "out").exists()
