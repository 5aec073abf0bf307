"""What a language-model run reads: a split's documents, a prepared folder's shards, token files, the token stream
the run's tokenizer makes of them, the vocabulary a fresh run gets, and the unigram model of the training split (the
level of a model that ignores context).

The training loop that reads them: :mod:`skiplab.train.lm`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from .. import run_dir
from ..corpora.documents import Documents, load_documents, read_documents
from ..corpora.shards import Prepared, check_prepared, is_prepared, read_prepared
from ..corpora.windows import Stream, bits_per_byte, count_words, read_bin, token_stream, unigram_nats
from ..tokenization.lm import ByteTokenizer, LMTokenizer, SubwordTokenizer, load_lm_tokenizer
from ..tokenization.pretrained import read_pretrained
from .lm_config import LMTrainConfig


def checkpoint_tokenizer(ckpt: dict[str, Any]) -> LMTokenizer | None:
    """The tokenizer a checkpoint holds (None: a run on pre-tokenised .bin files)."""
    data = ckpt.get("tokenizer")
    return load_lm_tokenizer(data) if data else None


def documents(cfg: LMTrainConfig | dict[str, Any], split: str) -> Documents:
    """The text of a split, as the config names it (a config or its stored dict)."""
    where = cfg if isinstance(cfg, dict) else dataclasses.asdict(cfg)
    if where["corpus"]:
        return load_documents(where["corpus"], where["data_dir"] or None, split)
    path = where.get(f"{split}_file", "")
    if not path:
        raise ValueError(f"no --{split}-file given")
    return read_documents(path)


def prepared(cfg: LMTrainConfig | dict[str, Any]) -> Prepared | None:
    """The prepared folder ``--data-dir`` names (checked against the config's corpus and tokenizer), or None."""
    where = cfg if isinstance(cfg, dict) else dataclasses.asdict(cfg)
    if not is_prepared(where["data_dir"]):
        return None
    prep = read_prepared(where["data_dir"])
    check_prepared(prep, where["corpus"], where["tokenizer"], where["vocab_size"])
    return prep


def prepared_stream(prep: Prepared, split: str, tok: LMTokenizer | None, tokens: int = 0) -> Stream:
    """A split of a prepared folder, memory-mapped (the first documents holding ``tokens``, where given); ``tok``,
    where given, must be the folder's tokenizer."""
    if tok is not None and not same_tokenizer(tok, load_lm_tokenizer(prep.tokenizer_bytes())):
        raise ValueError(f"{prep.sidecar}: prepared with another tokenizer than the run's ({prep.tokenizer_spec})")
    info = prep.split(split)
    data = prep.tokens(split)
    if tokens:
        end, n_bytes, n_words = prep.first_documents(split, tokens)
        return Stream(data[:end], n_bytes, info["name"], n_words)
    return Stream(data, int(info["bytes"]), info["name"], int(info["words"]))


def same_tokenizer(a: LMTokenizer, b: LMTokenizer) -> bool:
    """Whether two tokenizers are one: the same stored form, or sentencepiece models with the same pieces in the
    same order (a trained model's bytes also hold the path it was trained at)."""
    if a.to_bytes() == b.to_bytes():
        return True
    return (isinstance(a, SubwordTokenizer) and isinstance(b, SubwordTokenizer) and a.vocab_size == b.vocab_size
            and all(a.tok.piece(i) == b.tok.piece(i) for i in range(a.vocab_size)))


def stream(cfg: LMTrainConfig | dict[str, Any], split: str, tok: LMTokenizer, tokens: int = 0) -> Stream:
    """A split's tokens: its documents encoded and joined (the first holding ``tokens``, where given), a prepared
    folder's shards, or .bin files as they are."""
    where = cfg if isinstance(cfg, dict) else dataclasses.asdict(cfg)
    prep = prepared(where)
    if prep is not None:
        return prepared_stream(prep, split, tok, tokens)
    path = where.get(f"{split}_file", "")
    if not where["corpus"] and path.endswith(".bin"):
        return read_bin(path, where["bin_dtype"], where["vocab_size"])
    docs = documents(where, split)
    if not tokens:  # one document's tokens at a time
        return token_stream((tok.encode_array(t) for t in docs.texts), tok.eot, tok.vocab_size, docs.n_bytes, docs.name,
                            count_words(docs.texts))
    encoded, total = [], 0  # the first documents holding ``tokens``
    for text in docs.texts:
        encoded.append(tok.encode_array(text))
        total += len(encoded[-1]) + 1
        if total >= tokens:
            break
    kept = Documents(docs.texts[: len(encoded)], docs.name)
    return token_stream(encoded, tok.eot, tok.vocab_size, kept.n_bytes, kept.name, count_words(kept.texts))


def vocabulary(cfg: LMTrainConfig) -> int:
    """The vocabulary size a fresh run of ``cfg`` gets: its prepared folder's tokenizer, the byte tokenizer's, a
    pretrained tokenizer's, or ``vocab_size`` (token files; a tokenizer trained by the run, at most that size)."""
    prep = prepared(cfg)
    if prep is not None:
        return load_lm_tokenizer(prep.tokenizer_bytes()).vocab_size
    if cfg.binary or cfg.tokenizer in ("bpe", "unigram"):
        return cfg.vocab_size
    if cfg.tokenizer == "bytes":
        return ByteTokenizer.vocab_size
    return load_lm_tokenizer(read_pretrained(cfg.tokenizer).to_bytes()).vocab_size


def unigram_baseline(cfg: LMTrainConfig, split: str = "test") -> dict[str, Any] | None:
    """Loss and bits per byte on a split of ``cfg``'s corpus of the unigram model of its training split, in the
    tokens of ``cfg``'s finished run (:func:`skiplab.corpora.windows.unigram_nats`): the level of a model that
    ignores context, against which a run that trained can be told from one that stalled. Bytes and .bin files
    need no checkpoint; a subword tokenizer is read from the run's (None where it has none)."""
    prep = prepared(cfg)
    if cfg.binary:
        tok = None
    elif prep is not None:
        tok = load_lm_tokenizer(prep.tokenizer_bytes())
    elif cfg.tokenizer == "bytes":
        tok = ByteTokenizer()
    elif (Path(cfg.out) / "last.pt").is_file():
        tok = checkpoint_tokenizer(run_dir.load_checkpoint(cfg.out, kind="lm"))
    else:
        return None
    vocab = tok.vocab_size if tok else cfg.vocab_size
    train_data, data = stream(cfg, "train", tok), stream(cfg, split, tok)
    nats, targets = unigram_nats(train_data, data, vocab), max(0, len(data) - 1)
    return {"split": data.name, "loss": nats / targets if targets else math.nan,
            "bpb": bits_per_byte(nats, data.n_bytes), "tokens": targets, "bytes": data.n_bytes}
