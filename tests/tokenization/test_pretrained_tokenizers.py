"""Pretrained tokenizers from their files (sentencepiece .model, Hugging Face tokenizer.json, tiktoken ranks):
tiny files of the official formats made here, round trips of text, end of text as the file says, the stored form,
training runs with each, and bad input as one line before anything is written."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from skiplab.cli import main
from skiplab.tokenization.lm import ByteTokenizer, SubwordTokenizer, load_lm_tokenizer, train_lm_tokenizer
from skiplab.tokenization.pretrained import PretrainedSpec, parse_pretrained, read_pretrained
from skiplab.tokenization.pretrained.tiktoken_encoding import ENCODINGS, gpt2_stand_ins
from skiplab.train.lm import LMTrainConfig
from skiplab.train.lm_data import checkpoint_tokenizer
from tests.train.test_distributed import one_thread
from tests.train.test_lm import STORY, args, text  # noqa: F401 - text is a fixture
from tests.train.test_mt import interrupt_after_step

TEXT = "Grüße, café — naïve 中文 text 🙂\n\tindented  two spaces, then the end\n"
LINES = ["the cat sat on the mat.", "Grüße aus dem Café, naïve résumé.", "中文 text and 🙂 emoji", STORY] * 4
PAIRS = [(b"t", b"h"), (b"th", b"e"), (b" ", b"the"), (b"a", b"t"), (b" ", b"c"), (b" c", b"at")]  # GPT-2's vocab.bpe
MERGES = [a + b for a, b in PAIRS]  # tokens 256, 257, ...


def write_sentencepiece(path: Path, **ids) -> Path:
    """A tiny lossless sentencepiece model with the special ids given (T5's: pad 0, eos 1, unk 2, no bos)."""
    spm = pytest.importorskip("sentencepiece")
    path.parent.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(LINES), model_prefix=str(path.with_suffix("")), vocab_size=320, model_type="bpe",
        normalization_rule_name="identity", remove_extra_whitespaces=False, byte_fallback=True,
        hard_vocab_limit=False, minloglevel=2, num_threads=1, **ids)
    return path


def write_hf(path: Path, specials: list[str]) -> Path:
    """A tiny byte-level BPE (GPT-2's design) trained with tokenizers and saved as tokenizer.json."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(LINES, trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def ranks() -> dict[bytes, int]:
    """GPT-2's ordering of the single bytes (encoder.py's bytes_to_unicode: 33-126, 161-172, 174-255, then the
    rest), then a few merges."""
    shown = [*range(33, 127), *range(161, 173), *range(174, 256)]
    order = shown + [b for b in range(256) if b not in shown]
    return {**{bytes([b]): i for i, b in enumerate(order)}, **{t: 256 + i for i, t in enumerate(MERGES)}}


def write_tiktoken(path: Path) -> Path:
    """tiktoken's ranks format, by hand: base64 of the token's bytes, a space, the rank."""
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks().items()))
    return path


def write_gpt2_folder(folder: Path) -> Path:
    """GPT-2's release form of the same ranks: encoder.json (tokens in printable stand-ins) and vocab.bpe."""
    folder.mkdir(parents=True, exist_ok=True)
    shown = {b: c for c, b in gpt2_stand_ins().items()}
    written = {"".join(shown[b] for b in t): r for t, r in ranks().items()}
    (folder / "encoder.json").write_text(json.dumps({**written, "<|endoftext|>": 50256}))
    merges = "".join(" ".join("".join(shown[b] for b in part) for part in pair) + "\n" for pair in PAIRS)
    (folder / "vocab.bpe").write_text("#version: 0.2\n" + merges)  # " the" is "Ġ the" there
    return folder


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pretrained")
    return {"t5": write_sentencepiece(root / "t5" / "spiece.model", pad_id=0, eos_id=1, unk_id=2, bos_id=-1),
            "llama2": write_sentencepiece(root / "llama2" / "tokenizer.model", unk_id=0, bos_id=1, eos_id=2, pad_id=-1),
            "hf": write_hf(root / "gpt2" / "tokenizer.json", ["<|endoftext|>"]),
            "tiktoken": write_tiktoken(root / "tiny.tiktoken"),
            "gpt2": write_gpt2_folder(root / "gpt-2")}


# spec -> the end-of-text id its file says
KINDS = {"sentencepiece:{t5}": 1, "sentencepiece:{llama2}": 2, "hf:{hf}": 0,
         "tiktoken:cl100k_base:{tiktoken}": 100257, "tiktoken:gpt2:{tiktoken}": 50256, "tiktoken:gpt2:{gpt2}": 50256}


def spec_of(form: str, files: dict[str, Path]) -> str:
    return form.format(**{k: str(v) for k, v in files.items()})


def copied(files: dict[str, Path], folder: Path) -> dict[str, Path]:
    """A copy of every file (and GPT-2's folder) in ``folder``, to be removed by the test."""
    out = {}
    for k, path in files.items():
        out[k] = folder / k / path.name
        out[k].parent.mkdir(parents=True)
        if path.is_dir():
            shutil.copytree(path, out[k])
        else:
            shutil.copyfile(path, out[k])
    return out


@pytest.mark.parametrize("form", KINDS)
def test_text_round_trips_and_end_of_text_is_the_files(form, files):
    tok = read_pretrained(spec_of(form, files))
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT  # byte-exact: é, 中文, emoji, tabs, double spaces, newlines
    assert tok.eot == KINDS[form] and tok.eot not in ids and max(ids) < tok.vocab_size
    assert tok.decode([*ids, tok.eot]) == TEXT  # end of text is skipped
    assert tok.encode_array(TEXT).tolist() == ids
    assert "\ufffd" in tok.decode(tok.encode("a\udcffb"))  # a byte that was not UTF-8 reads as U+FFFD


def test_the_files_ids_are_kept(files):
    import sentencepiece as spm

    for name in ("t5", "llama2"):
        sp = spm.SentencePieceProcessor(model_file=str(files[name]))
        tok = read_pretrained(f"sentencepiece:{files[name]}")
        assert tok.encode(TEXT) == sp.encode(TEXT) and tok.vocab_size == sp.get_piece_size()
    tiktoken = pytest.importorskip("tiktoken")
    enc = tiktoken.Encoding("gpt2", pat_str=ENCODINGS["gpt2"][0], mergeable_ranks=ranks(),
                            special_tokens={"<|endoftext|>": 50256})
    tok = read_pretrained(f"tiktoken:gpt2:{files['tiktoken']}")
    assert tok.encode(TEXT) == enc.encode_ordinary(TEXT) and tok.vocab_size == 50257
    assert tok.encode(" the cat") == [256 + MERGES.index(b" the"), 256 + MERGES.index(b" cat")]
    assert tok.decode([1000]) == "\ufffd"  # an id below the specials that no token has


def test_gpt2s_release_folder_gives_tiktokens_ranks(files, monkeypatch):
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # tiktoken's reader: no cache written
    theirs = data_gym_to_mergeable_bpe_ranks(str(files["gpt2"] / "vocab.bpe"), str(files["gpt2"] / "encoder.json"))
    assert theirs == ranks()
    folder, file = (read_pretrained(f"tiktoken:gpt2:{files[k]}") for k in ("gpt2", "tiktoken"))
    assert folder.encode(TEXT) == file.encode(TEXT) and folder.payload == file.payload


@pytest.mark.parametrize("name", ENCODINGS)
def test_patterns_and_special_tokens_are_tiktokens(name, monkeypatch):
    openai_public = pytest.importorskip("tiktoken_ext.openai_public")

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *a, **k: {})  # nothing downloaded
    monkeypatch.setattr(openai_public, "data_gym_to_mergeable_bpe_ranks", lambda *a, **k: {})
    theirs = openai_public.ENCODING_CONSTRUCTORS[name]()
    assert ENCODINGS[name] == (theirs["pat_str"], theirs["special_tokens"])


@pytest.mark.parametrize("form", KINDS)
def test_the_stored_form_rebuilds_it_without_the_file(form, files, tmp_path):
    original = read_pretrained(spec_of(form, copied(files, tmp_path / "source")))
    path = tmp_path / "last.pt"
    torch.save({"tokenizer": original.to_bytes()}, path)  # as a checkpoint holds it
    shutil.rmtree(tmp_path / "source")  # no file where the spec pointed
    tok = checkpoint_tokenizer(torch.load(path, weights_only=True))
    assert type(tok) is type(original) and (tok.eot, tok.vocab_size) == (original.eot, original.vocab_size)
    assert tok.encode(TEXT) == original.encode(TEXT) and tok.decode(tok.encode(TEXT)) == TEXT
    assert load_lm_tokenizer(tok.to_bytes()).to_bytes() == original.to_bytes()


def test_stored_tokenizers_of_before_still_load(tmp_path):
    assert isinstance(load_lm_tokenizer(ByteTokenizer().to_bytes()), ByteTokenizer)
    trained = train_lm_tokenizer("bpe", LINES, tmp_path / "spm", 300)
    back = load_lm_tokenizer(trained.to_bytes())  # a bare sentencepiece model, as checkpoints held it
    assert isinstance(back, SubwordTokenizer) and back.eot == 3 and back.encode(TEXT) == trained.encode(TEXT)


def test_end_of_text_named_or_missing(files, tmp_path):
    both = write_hf(tmp_path / "both" / "tokenizer.json", ["</s>", "<|endoftext|>"])
    with pytest.raises(ValueError, match=r"several end-of-text tokens \(</s>, <\|endoftext\|>\); name it: "
                                         r"--tokenizer 'hf\(eot=TOKEN\):"):
        read_pretrained(f"hf:{both}")
    assert read_pretrained(f"hf(eot=</s>):{both.parent}").eot == 0  # a folder holding tokenizer.json
    assert read_pretrained(f"hf(eot=<|endoftext|>):{both}").eot == 1
    none = write_hf(tmp_path / "none" / "tokenizer.json", [])
    with pytest.raises(ValueError, match=r"none/tokenizer.json: no end-of-text token .*name it"):
        read_pretrained(f"hf:{none}")
    with pytest.raises(ValueError, match=r"'<\|nope\|>' is not a token of the tokenizer"):
        read_pretrained(f"hf(eot=<|nope|>):{files['hf']}")
    no_eos = write_sentencepiece(tmp_path / "noeos.model", eos_id=-1, user_defined_symbols=["<|endoftext|>"])
    with pytest.raises(ValueError, match=r"noeos.model: the model has no EOS id; name the end-of-text piece"):
        read_pretrained(f"sentencepiece:{no_eos}")
    named = read_pretrained(f"sentencepiece(eot=<|endoftext|>):{no_eos}")
    assert named.eot == named._sp.piece_to_id("<|endoftext|>") > 0 and named.decode(named.encode(TEXT)) == TEXT
    assert read_pretrained(f"tiktoken(eot=<|endofprompt|>):cl100k_base:{files['tiktoken']}").eot == 100276
    with pytest.raises(ValueError, match=r"'</s>' is not a special token of cl100k_base"):
        read_pretrained(f"tiktoken(eot=</s>):cl100k_base:{files['tiktoken']}")


def test_the_grammar():
    assert parse_pretrained("bytes") is None and parse_pretrained("bpe") is None
    assert parse_pretrained("hf:a/b:c.json") == PretrainedSpec("hf", "a/b:c.json")
    assert parse_pretrained("tiktoken(eot=<|endoftext|>):gpt2:x/y") == PretrainedSpec("tiktoken", "x/y", "gpt2",
                                                                                     "<|endoftext|>")
    for tokenizer in ("bytes", "bpe", "unigram", "sentencepiece:x.model", "hf:x", "tiktoken:o200k_base:x"):
        assert LMTrainConfig(tokenizer=tokenizer).tokenizer == tokenizer  # the file is not read here
    bad = {"hf": "unknown tokenizer 'hf'; known: bytes, bpe, unigram, sentencepiece:FILE, hf:FILE, tiktoken:NAME:FILE",
           "hf:": r"--tokenizer hf:: no file given \(hf:FILE\)",
           "tiktoken:cl100k_base": r"no file given \(tiktoken:NAME:FILE\)",
           "tiktoken:p99k_base:x.tiktoken": r"unknown tiktoken encoding 'p99k_base'; known: gpt2, r50k_base",
           "hf(bos=<s>):x": r"unknown option 'bos=<s>'; hf\(eot=TOKEN\):... is the one option"}
    for tokenizer, message in bad.items():
        with pytest.raises(ValueError, match=message):
            LMTrainConfig(tokenizer=tokenizer)


def train_args(text, out, spec):  # noqa: F811
    return args(text, out, "--tokenizer", spec, "--batch-size", "2", "--max-steps", "2", "--eval-every", "2")


def cli(argv) -> int:
    return main([str(a) for a in argv])


@pytest.mark.parametrize("form,copy", [("sentencepiece:{t5}", "tokenizer.model"), ("hf:{hf}", "tokenizer.json"),
                                       ("tiktoken:gpt2:{tiktoken}", "gpt2.tiktoken")])
def test_training_runs_record_the_tokenizer_and_need_no_file_after(form, copy, files, text, tmp_path,  # noqa: F811
                                                                  capsys):
    spec, out = spec_of(form, copied(files, tmp_path / "source")), tmp_path / "run"
    with one_thread():
        assert cli(train_args(text, out, spec)) == 0
    tok = read_pretrained(spec)
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["tokenizer"] == config["data"]["tokenizer"] == spec
    assert (config["data"]["vocab_size"], config["data"]["eot"]) == (tok.vocab_size, tok.eot)
    assert config["model"]["vocab_size"] == tok.vocab_size
    assert (out / copy).read_bytes() == tok.payload
    assert torch.load(out / "last.pt", weights_only=True)["tokenizer"] == tok.to_bytes()
    shutil.rmtree(tmp_path / "source")  # eval and generate read the checkpoint's tokenizer alone
    capsys.readouterr()
    with one_thread():
        assert cli(["eval", "lm", "--checkpoint", out, "--split", "test"]) == 0
        assert json.loads(capsys.readouterr().out)["bytes"] == len(STORY.encode()) * (1 + 2 + 3 + 1)
        assert cli(["generate", "--checkpoint", out, "--prompt", "the café", "--max-new-tokens", "4",
                    "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("the café")


def test_a_resumed_run_needs_no_file(files, text, tmp_path, monkeypatch):  # noqa: F811
    local = tmp_path / "tokenizer.json"
    local.write_bytes(files["hf"].read_bytes())
    out = tmp_path / "run"
    with one_thread():
        undo = interrupt_after_step(monkeypatch, 2)
        assert cli(args(text, out, "--tokenizer", f"hf:{local}", "--batch-size", "2", "--max-steps", "4",
                        "--eval-every", "2")) == 130
        undo()
        local.unlink()
        assert cli(["train", "lm", "--resume", "--out", out]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 4


def test_bad_tokenizers_are_one_line_before_anything_is_written(files, text, tmp_path, capsys):  # noqa: F811
    corrupt = tmp_path / "corrupt"
    corrupt.write_bytes(b"\x00\xffnot a model at all")
    not_json = tmp_path / "bad.json"
    not_json.write_text('{"version": "1.0", "model": ')
    bad_ranks = tmp_path / "bad.tiktoken"
    bad_ranks.write_bytes(b"IQ== 0\nnot-base64!! 1\n")
    short = tmp_path / "short.tiktoken"
    short.write_bytes(b"".join(base64.b64encode(bytes([b])) + b" %d\n" % b for b in range(200)))
    clash = tmp_path / "clash.tiktoken"
    clash.write_bytes(files["tiktoken"].read_bytes() + base64.b64encode(b"cat") + b" 50256\n")
    no_eot = write_hf(tmp_path / "noeot" / "tokenizer.json", [])
    unordered = write_gpt2_folder(tmp_path / "unordered")
    lines = (unordered / "vocab.bpe").read_text().splitlines()
    (unordered / "vocab.bpe").write_text("\n".join([lines[0], lines[2], lines[1], *lines[3:]]) + "\n")
    cases = {f"sentencepiece:{tmp_path / 'missing.model'}": r"missing.model: no such sentencepiece model",
             "hf:missing-folder": r"missing-folder: no such Hugging Face tokenizer.json \(looked for /\S+/missing-fold",
             f"tiktoken:cl100k_base:{tmp_path / 'nope.tiktoken'}": r"nope.tiktoken: no such cl100k_base ranks file",
             f"tiktoken:gpt2:{tmp_path / 'gpt2.tiktoken'}": r"gpt2.tiktoken: no such gpt2 ranks file, from --tokenizer "
                                                           r"\S+ \(experiments/gpt2_tokenizer.sh DIR writes",
             f"tiktoken:gpt2:{tmp_path}": r"encoder.json: no such GPT-2 encoder.json",
             f"sentencepiece:{corrupt}": r"corrupt: not a sentencepiece model",
             f"hf:{corrupt}": r"corrupt: not a Hugging Face tokenizer.json",
             f"hf:{not_json}": r"bad.json: not a Hugging Face tokenizer.json",
             f"tiktoken:gpt2:{bad_ranks}": r"bad.tiktoken, line 2: not a tiktoken ranks line",
             f"tiktoken:gpt2:{short}": r"short.tiktoken: byte 0xc8 has no rank",
             f"tiktoken:gpt2:{clash}": r"clash.tiktoken: rank 50256 is the id of a special token of gpt2",
             f"hf:{no_eot}": r"noeot/tokenizer.json: no end-of-text token",
             f"tiktoken:gpt2:{unordered}": r"vocab.bpe, line 2: merge 'th e' is not token 256 of encoder.json",
             "tiktoken:gpt3:x.tiktoken": r"unknown tiktoken encoding 'gpt3'"}
    for k, (spec, message) in enumerate(cases.items()):
        out = tmp_path / f"run{k}"
        assert cli(train_args(text, out, spec)) == 2, spec
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("skiplab: error: "), err
        assert re.search(message, err), (message, err)
        assert not out.exists(), spec


@pytest.mark.parametrize("rank", [2**32 + 5, 2**32 - 1, 50257])
def test_a_rank_past_the_encodings_vocabulary_is_one_line(files, text, tmp_path, capsys, rank):  # noqa: F811
    """gpt2's ranks lie below its 50,257 ids: a rank at or past them (one past 2^32 overflowed tiktoken; 2^32 - 1
    made a vocabulary of 2^32 ids) is one line naming the file, in prepare lm and in train lm, nothing written."""
    ranks = tmp_path / "huge.tiktoken"
    ranks.write_bytes(files["tiktoken"].read_bytes() + base64.b64encode(b"cats") + b" %d\n" % rank)
    spec = f"tiktoken:gpt2:{ranks}"
    for argv in (["prepare", "lm", "--corpus", "", "--train-file", text / "train.jsonl", "--valid-file",
                  text / "valid.jsonl", "--tokenizer", spec, "--out", tmp_path / "prep"],
                 train_args(text, tmp_path / "run", spec)):
        assert cli(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"skiplab: error: {ranks}: rank {rank} is past gpt2's vocabulary of 50257 ids; is this " \
                      "gpt2's file?"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.tiktoken"]
