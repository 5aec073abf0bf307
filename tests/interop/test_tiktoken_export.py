"""A tiktoken encoding as a Hugging Face ``tokenizer.json`` (``TiktokenEncoding.tokenizer_json``) and through
``skiplab export hf``: tiktoken's ids and the text back, on made-up ranks (a few hundred merges learnt here, as
BPE learns them, under each of tiktoken's patterns; nothing is downloaded), and runs trained with such an encoding
exported to folders that AutoTokenizer and the model classes load with the run's ids, end of text and logits."""

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from skiplab.cli import main
from skiplab.tasks.hf_run import export_hf, tokenizer_files
from skiplab.tokenization.pretrained import read_pretrained
from skiplab.tokenization.pretrained.tiktoken_encoding import ENCODINGS, TiktokenEncoding, bpe_merges, dump_ranks, parse_ranks
from skiplab.train.lm import load_run
from tests.tokenization.test_pretrained_tokenizers import write_hf, write_sentencepiece
from tests.train.test_distributed import one_thread
from tests.train.test_lm import text  # noqa: F401 - a fixture: train, valid and test.jsonl of a short story

tiktoken = pytest.importorskip("tiktoken")
tokenizers = pytest.importorskip("tokenizers")
regex = pytest.importorskip("regex")  # tiktoken's own dependency: its patterns cut the text the ranks are learnt on

TEXTS = [
    "the cat sat on the mat. the dog sat on the log. they were happy.",
    "It's the cat's mat; we'll see, they're here, I'd say, you've done it, I'm IT'S DON'T WE'LL 's 't",
    "Grüße aus dem Café — naïve résumé, façade, Ærøskøbing, Ελληνικά, русский текст, العربية",
    "中文文本和日本語のテキスト, 한국어 텍스트 and emoji 🙂🙂 👍🏽 👨‍👩‍👧 ✨",
    "\tindented\twith tabs\n\t\tand two\n    four spaces,  two,   three   and trailing   \n",
    "numbers 12345 678 9 0 1234567890 3.14159 1,000,000 2024-01-01 v1.2.3 0x1F",
    "34 34 34 56 56 56 78 78 78, so that runs of digits cut in threes differ from whole runs: 12345678 9012345",
    "lines\n\nblank\n\n\nthree\r\nwindows\r\n  \n  spaces then newline  \n\n",
    "def f(x):\n    return x ** 2  # a comment\n\nif __name__ == '__main__':\n    print(f(3))\n",
    "non-breaking\u00a0space, ideographic\u3000space, thin\u2009space, e\u0301 combining, \u200bzero width",
    "other spaces:\x0b\x0c\x1c\x85\u1680\u2028\u2029\u202f\u205f\ufeff|\x00\x7f end",
    "a special token's text <|endoftext|> inside a document, and <|fim_prefix|> <|endofprompt|> too",
    "   leading spaces",
    "trailing spaces   ",
    "\n",
    " ",
    "x",
    "",
]
UNREACHED = " naïveté"  # a token no merge makes: a piece that is it whole is that token (ignore_merges)
GPT2 = "gpt2-small(d_model=32,heads=4,layers=2,ffn_dim=64,context=32)"
LLAMA = "llama-71m(d_model=32,heads=4,layers=2,ffn_dim=48,context=32)"
T = 32


def learnt_ranks(pattern: str, merges: int = 300) -> dict[bytes, int]:
    """Ranks as BPE learns them: the 256 bytes, then, ``merges`` times, the join of the most frequent adjacent
    pair inside the pattern's pieces of :data:`TEXTS` (a join some earlier pair made keeps its rank); and
    :data:`UNREACHED` last."""
    pieces = Counter(p.encode() for t in TEXTS for p in regex.findall(pattern, t))
    words = {p: [bytes([b]) for b in p] for p in pieces}
    ranks = {bytes([b]): b for b in range(256)}
    for _ in range(merges):
        pairs: Counter = Counter()
        for p, parts in words.items():
            for pair in zip(parts, parts[1:]):
                pairs[pair] += pieces[p]
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        ranks.setdefault(a + b, len(ranks))
        for parts in words.values():
            i = 0
            while i < len(parts) - 1:
                if (parts[i], parts[i + 1]) == (a, b):
                    parts[i:i + 2] = [a + b]
                i += 1
    ranks.setdefault(UNREACHED.encode(), len(ranks))
    return ranks


def write_ranks(name: str, folder: Path) -> Path:
    path = folder / f"{name}.tiktoken"
    path.write_bytes(dump_ranks(learnt_ranks(ENCODINGS[name][0])))
    return path


def tiktokens_own(name: str, ranks: dict[bytes, int], monkeypatch):
    """tiktoken's Encoding with the pattern and special tokens its ``openai_public`` gives ``name`` (read with no
    download: its ranks loaders are stubbed) and ``ranks``."""
    from tiktoken_ext import openai_public

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *a, **k: {})
    monkeypatch.setattr(openai_public, "data_gym_to_mergeable_bpe_ranks", lambda *a, **k: {})
    own = openai_public.ENCODING_CONSTRUCTORS[name]()
    return tiktoken.Encoding(name, pat_str=own["pat_str"], mergeable_ranks=ranks, special_tokens=own["special_tokens"])


def test_the_merges_are_every_split_in_rank_order():
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"bc": 3, b"ab": 4, b"abc": 5, b"xyz": 6}
    assert bpe_merges(ranks) == [(b"b", b"c"), (b"a", b"b"), (b"a", b"bc"), (b"ab", b"c")]


@pytest.mark.parametrize("name", ["gpt2", "cl100k_base", "o200k_base"])
def test_the_tokenizer_json_gives_tiktokens_ids_and_the_text_back(name, tmp_path, monkeypatch):
    tok = read_pretrained(f"tiktoken:{name}:{write_ranks(name, tmp_path)}")
    ranks = parse_ranks(tok.payload, tok.where)
    merges = bpe_merges(ranks)
    assert len(merges) > len(ranks) - 256  # some tokens have several splits, each a merge
    assert UNREACHED.encode() not in {a + b for a, b in merges}
    theirs = tiktokens_own(name, ranks, monkeypatch)
    hf = tokenizers.Tokenizer.from_str(tok.tokenizer_json().decode("utf-8"))
    hf.encode_special_tokens = True  # a special token's text is text, as encode_ordinary reads it
    for t in [*TEXTS, "".join(TEXTS), " ".join(TEXTS), "\n".join(TEXTS)]:
        ids = hf.encode(t, add_special_tokens=False).ids
        assert ids == theirs.encode_ordinary(t) == tok.encode(t), t
        assert hf.decode(ids, skip_special_tokens=False) == t
    assert hf.encode(UNREACHED, add_special_tokens=False).ids == [ranks[UNREACHED.encode()]]
    for special, i in ENCODINGS[name][1].items():  # at their ids, over cl100k's gap at 100256 too
        assert hf.token_to_id(special) == i and hf.id_to_token(i) == special
        assert hf.decode([i], skip_special_tokens=False) == special
    hf.encode_special_tokens = False  # the library's default: the token, where its text is in a document
    assert hf.encode("a<|endoftext|>b", add_special_tokens=False).ids == [*tok.encode("a"), tok.eot, *tok.encode("b")]


def test_without_tokenizers_the_conversion_is_one_line(tmp_path, monkeypatch):
    tok = read_pretrained(f"tiktoken:gpt2:{write_ranks('gpt2', tmp_path)}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ImportError, match=r"^Hugging Face tokenizers need the tokenizers package: pip install "
                                          r"'skiplab\[hf\]' \(or tokenizers\)$"):
        tok.tokenizer_json()


def test_which_tokenizers_become_tokenizer_json(tmp_path):
    hf = read_pretrained(f"hf:{write_hf(tmp_path / 'hf' / 'tokenizer.json', ['<|endoftext|>'])}")
    files = tokenizer_files(hf)
    assert files["tokenizer.json"] == hf.payload  # its own file, as it is, special tokens read as such
    assert json.loads(files["tokenizer_config.json"]) == {
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "clean_up_tokenization_spaces": False}
    tik = read_pretrained(f"tiktoken(eot=<|endofprompt|>):cl100k_base:{write_ranks('cl100k_base', tmp_path)}")
    files = tokenizer_files(tik)
    assert files["tokenizer.json"] == tik.tokenizer_json()
    assert json.loads(files["tokenizer_config.json"]) == {
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endofprompt|>", "split_special_tokens": True,
        "clean_up_tokenization_spaces": False}
    model = write_sentencepiece(tmp_path / "sp" / "spiece.model", pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    spm = read_pretrained(f"sentencepiece:{model}")
    assert tokenizer_files(spm) == {} and tokenizer_files(None) == {}  # export prints its note, writes none


@pytest.mark.parametrize("model,name", [(GPT2, "cl100k_base"), (LLAMA, "o200k_base"), (LLAMA, "gpt2")])
def test_a_tiktoken_run_exports_a_tokenizer_autotokenizer_loads(model, name, text, tmp_path, capsys):  # noqa: F811
    transformers = pytest.importorskip("transformers", minversion="5.0")
    out, folder = tmp_path / "run", tmp_path / "hf"
    with one_thread():
        files = [f"--{split}-file={text / split}.jsonl" for split in ("train", "valid", "test")]
        tokenizer = f"tiktoken:{name}:{write_ranks(name, tmp_path)}"
        assert main(["train", "lm", "--corpus", "", *files, "--tokenizer", tokenizer, "--model", model,
                     "--batch-size", "2", "--max-steps", "2", "--eval-every", "2", "--warmup", "1", "--device", "cpu",
                     "--out", str(out)]) == 0
        capsys.readouterr()
        export_hf(out, folder)
    assert "none written" not in capsys.readouterr().out
    _, ours, tok = load_run(out)
    assert isinstance(tok, TiktokenEncoding)
    auto = transformers.AutoTokenizer.from_pretrained(folder)  # GPT-2's config alone would give GPT-2's pattern
    direct = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                                                  split_special_tokens=True)
    for t in [*TEXTS, "".join(TEXTS)]:
        ids = tok.encode(t)
        assert auto(t)["input_ids"] == auto.encode(t) == direct(t)["input_ids"] == ids, t
        assert auto.decode(ids) == direct.decode(ids) == t
    assert auto.eos_token == "<|endoftext|>" and auto.eos_token_id == tok.eot
    assert json.loads((folder / "config.json").read_text())["eos_token_id"] == tok.eot
    assert auto.decode([*auto.encode("the cat"), tok.eot], skip_special_tokens=True) == "the cat"
    cls = getattr(transformers, {GPT2: "GPT2LMHeadModel", LLAMA: "LlamaForCausalLM"}[model])
    theirs = cls.from_pretrained(folder).eval()
    x = torch.tensor([auto(TEXTS[0] + TEXTS[2])["input_ids"][:T]])
    with torch.no_grad():
        assert torch.allclose(ours(x), theirs(x).logits, atol=1e-4, rtol=0)
    again = read_pretrained(f"hf:{folder}")  # what import hf reads back: a Hugging Face tokenizer, end of text found
    assert again.eot == tok.eot and again.encode(TEXTS[3]) == tok.encode(TEXTS[3])
