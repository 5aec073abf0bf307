"""``skiplab prepare lm``: a language-model corpus tokenised once, into shards per split and a sidecar
(:mod:`skiplab.corpora.shards` describes both), so that training and evaluation start without tokenising or
scanning anything.

The corpus and tokenizer options are those of ``skiplab train lm``: a named corpus (``--corpus``,
``--data-dir``) or files (``--corpus '' --train-file ... --valid-file ... [--test-file ...]``), and
``--tokenizer`` bytes, bpe / unigram (trained here on the training split, ``--vocab-size``) or a pretrained one
from its file. A split's tokens are exactly :func:`skiplab.train.lm_data.stream`'s: each document encoded, then end
of text. The folder is written beside itself (``OUT.partial``, marked as this command's by a file
``.skiplab-prepare`` inside) and renamed when complete: nothing partial is left under ``OUT``, and an existing
``OUT`` is never replaced. An ``OUT.partial`` that an interrupted run of this command left (it holds the mark) is
removed by the next; one without the mark is not this command's, and is left as it is (a one-line error).

The text is streamed (:func:`skiplab.corpora.documents.iter_documents`): a split is read a document at a time and
written a shard at a time, so memory holds one document, one shard's tokens and, for valid and test, the
document index, whatever the corpus's size (enwik8 and text8, one document a split, are the exception).
Training a bpe / unigram tokenizer here holds the train split's text (sentencepiece trains on it in memory);
``--tokenizer bytes`` and pretrained tokenizers do not.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from .documents import (LM_SPLITS, Documents, DocumentStream, iter_documents, iter_read_documents, load_documents,
                        read_documents)
from ..tokenization.lm import LM_TOKENIZERS, LMTokenizer, check_lm_tokenizer, load_lm_tokenizer, train_lm_tokenizer
from ..tokenization.pretrained import read_pretrained
from .shards import (FORMAT_NAME, FORMAT_VERSION, MAX_SHARD_TOKENS, SIDECAR, TOKENIZER_FILE, token_dtype,
                     write_shard)
from .windows import count_words
from .work import write_beside

INDEXED = ("valid", "test")  # splits whose document ends are kept (--valid-tokens cuts at one)


@dataclass(frozen=True)
class PrepareConfig:
    """What ``skiplab prepare lm`` tokenises, with what, and where the shards go."""

    corpus: str = field(default="pydocs", metadata={
        "help": "pydocs, enwik8, text8, wikitext-103-raw, tinystories, c4-en or debdocs; "
                "'' = the --train-file etc. given"})
    data_dir: str = field(default="", metadata={"help": "where the corpus is ('' = its default place)"})
    train_file: str = field(default="", metadata={"help": "with --corpus '': a .jsonl[.gz], .txt[.gz] or folder"})
    valid_file: str = field(default="", metadata={"help": "with --corpus '': the validation split, likewise"})
    test_file: str = field(default="", metadata={"help": "with --corpus '': the test split, likewise (optional)"})
    tokenizer: str = field(default="bytes", metadata={
        "help": "as train lm's --tokenizer: bytes, bpe, unigram, sentencepiece:FILE, hf:FILE, tiktoken:NAME:FILE"})
    vocab_size: int = field(default=4096, metadata={"min": 2, "help": "subword vocabulary (bpe, unigram)"})
    shard_tokens: int = field(default=100_000_000, metadata={
        "min": 1, "help": "tokens per shard (llm.c writes 10^8; at most 2^31 - 1)"})
    out: str = field(default="data/prepared", metadata={"help": "the folder to write (must not exist)"})

    def __post_init__(self):
        check_lm_tokenizer(self.tokenizer)
        if self.shard_tokens > MAX_SHARD_TOKENS:
            raise ValueError(f"--shard-tokens must be at most {MAX_SHARD_TOKENS}, got {self.shard_tokens}")
        files = [f"--{s}-file" for s in ("train", "valid", "test") if getattr(self, f"{s}_file")]
        if self.corpus and files:  # the named corpus's splits are read: the files would be ignored, silently
            raise ValueError(f"{', '.join(files)} name{'s a file' if len(files) == 1 else ' files'}, which --corpus "
                             f"{self.corpus} does not read: give --corpus '' to read files")
        if not self.corpus and not (self.train_file and self.valid_file):
            raise ValueError("with --corpus '' give --train-file and --valid-file")
        ids = [f"--{s}-file" for s in LM_SPLITS if getattr(self, f"{s}_file").endswith(".bin")]
        if ids and not self.corpus:
            raise ValueError(f"{', '.join(ids)}: .bin files are token ids already, which train lm reads as they are "
                             "(--train-file X.bin ...); prepare lm tokenises text")

    def splits(self) -> tuple[str, ...]:
        return LM_SPLITS if self.corpus else tuple(s for s in LM_SPLITS if getattr(self, f"{s}_file"))

    def documents(self, split: str) -> Documents:
        """A split's documents, all in memory (what a tokenizer trains on)."""
        if self.corpus:
            return load_documents(self.corpus, self.data_dir or None, split)
        return read_documents(getattr(self, f"{split}_file"))

    def stream(self, split: str) -> DocumentStream:
        """:meth:`documents`, read a document at a time (what is tokenised)."""
        if self.corpus:
            return iter_documents(self.corpus, self.data_dir or None, split)
        return iter_read_documents(getattr(self, f"{split}_file"))


def prepare(cfg: PrepareConfig, progress: bool = True) -> dict[str, Any]:
    """Tokenise ``cfg``'s corpus into ``cfg.out``; return the sidecar written."""
    out = Path(cfg.out).expanduser()
    if out.exists():
        raise FileExistsError(f"{out}: already exists; give another --out or remove it")
    tokenizer = read_pretrained(cfg.tokenizer).to_bytes() if cfg.tokenizer not in LM_TOKENIZERS else b""

    def fill(work: Path) -> dict[str, Any]:
        nonlocal tokenizer
        if not tokenizer:  # bpe / unigram train on the whole train split, held in memory; bytes needs no text
            train_texts = cfg.documents("train").texts if cfg.tokenizer != "bytes" else []
            tokenizer = train_lm_tokenizer(cfg.tokenizer, train_texts, work / "spm", cfg.vocab_size).to_bytes()
            for leftover in work.glob("spm.*"):
                leftover.unlink()
        tok = load_lm_tokenizer(tokenizer)
        (work / TOKENIZER_FILE).write_bytes(tokenizer)
        meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "corpus": cfg.corpus,
                "files": {s: getattr(cfg, f"{s}_file") for s in cfg.splits()} if not cfg.corpus else {},
                "data_dir": cfg.data_dir, "tokenizer": cfg.tokenizer, "tokenizer_file": TOKENIZER_FILE,
                "tokenizer_sha256": hashlib.sha256(tokenizer).hexdigest(), "vocab_size": tok.vocab_size,
                "eot": tok.eot, "dtype": token_dtype(tok.vocab_size).name, "shard_tokens": cfg.shard_tokens,
                "splits": {}}
        for split in cfg.splits():
            meta["splits"][split] = _write_split(cfg, split, tok, work, progress)
        (work / SIDECAR).write_text(json.dumps(meta, indent=2) + "\n")
        return meta

    return write_beside(out, "prepare lm", fill)


def _write_split(cfg: PrepareConfig, split: str, tok: LMTokenizer, folder: Path, progress: bool) -> dict[str, Any]:
    """One split's shards (and document index), written into ``folder``; its entry of the sidecar. The documents
    are read one at a time; an error in them (the split's emptiness included, found at its end) is raised after
    some shards may have been written into ``folder``, which :func:`prepare` then removes."""
    docs = cfg.stream(split)
    dtype = token_dtype(tok.vocab_size)
    eot = np.array([tok.eot], dtype=dtype)
    shards: list[dict[str, Any]] = []
    pending: list[np.ndarray] = []
    held = total = n_bytes = n_words = top = n_docs = 0
    indexed = split in INDEXED
    ends = array("q")  # (tokens, bytes, words) at each document's end, flat: 24 bytes a document

    def flush(final: bool) -> None:  # every whole shard held (and, at the end, the rest)
        nonlocal pending, held
        whole, start = np.concatenate(pending), 0
        while len(whole) - start >= cfg.shard_tokens or (final and start < len(whole)):
            size = min(cfg.shard_tokens, len(whole) - start)
            name = f"{split}_{len(shards):06d}.bin"
            write_shard(folder / name, whole[start : start + size])
            shards.append({"file": name, "tokens": size})
            start += size
        pending, held = ([whole[start:]] if start < len(whole) else []), len(whole) - start

    for text in tqdm(docs, desc=f"prepare {docs.name}", unit="doc", disable=not progress):  # no total: streamed
        ids = tok.encode_array(text)
        if len(ids):
            top = max(top, int(ids.max()))
        if top >= tok.vocab_size:  # a tokenizer's own bug, but never written
            raise ValueError(f"{docs.name}: the tokenizer gave id {top}, past its vocabulary of {tok.vocab_size}")
        pending += [ids.astype(dtype, copy=False), eot]
        held += len(ids) + 1
        total += len(ids) + 1
        n_bytes += len(text.encode("utf-8", "surrogateescape"))
        n_words += count_words([text])
        n_docs += 1
        if indexed:
            ends.extend((total, n_bytes, n_words))
        if held >= cfg.shard_tokens:
            flush(False)
    if held:
        flush(True)
    entry = {"name": docs.name, "tokens": total, "bytes": n_bytes, "words": n_words, "documents": n_docs,
             "max_id": max(top, tok.eot), "shards": shards}
    if indexed:
        np.save(folder / f"{split}.docs.npy", np.frombuffer(ends, dtype=np.int64).reshape(-1, 3), allow_pickle=False)
        entry["index"] = f"{split}.docs.npy"
    return entry
