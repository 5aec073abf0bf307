"""Token shards: a split tokenised once, read through ``np.memmap`` without scanning it.

A shard is llm.c's data file (``dev/data/data_common.py``, ``write_datafile``), which modded-nanogpt reads too:

    header   256 int32, little-endian: [0] magic, [1] version, [2] token count, the rest 0
    tokens   that many ids, uint16 (magic 20240520, version 1: GPT-2) or uint32 (magic 20240801, version 7: LLaMA-3)

A prepared folder (``skiplab prepare lm``) holds the shards of each split, ``SPLIT_000000.bin`` ..., the
tokenizer's stored form (``tokenizer.bin``) and a sidecar ``prepared.json`` saying what they are::

    {"format": "skiplab-prepared-lm", "version": 1,
     "corpus": "pydocs", "files": {},              the named corpus, or the files read (corpus "")
     "tokenizer": "bytes", "tokenizer_file": "tokenizer.bin", "tokenizer_sha256": "...",
     "vocab_size": 257, "eot": 256, "dtype": "uint16",
     "splits": {"train": {"name": "pydocs/train", "tokens": N, "bytes": B, "words": W, "documents": D, "max_id": M,
                          "shards": [{"file": "train_000000.bin", "tokens": N}],
                          "index": "valid.docs.npy"}, ...}}    (index: valid and test only, see below)

A split's stream is its shards' tokens one after another, the stream :func:`skiplab.corpora.windows.token_stream`
makes from the text (each document's tokens, then end of text), so training on a prepared folder draws the
windows a run on the text draws. Bytes and words are the text's (:class:`skiplab.corpora.documents.Documents`,
:func:`skiplab.corpora.windows.count_words`), for bits per byte and word perplexity. ``SPLIT.docs.npy`` holds, per
document, the cumulative tokens, UTF-8 bytes and words at its end (int64, shape (documents, 3)), so that the
first documents holding ``--valid-tokens`` are cut where the text would be cut, with their bytes and words.

Nothing is tokenised when a prepared folder is read: each shard's header and size are checked against the
sidecar, and its tokens are scanned once a process for their largest id (a max over the memmap: a sequential read,
no copy), which must not pass the largest id the sidecar gives its split. Shards without a sidecar (llm.c's, a glob
of them) are scanned once for an id past the vocabulary. A bad header, an id past the vocabulary or the sidecar's
largest, shards of two token types, a sidecar that does not match its shards or whose fields are not what they
should be (``splits`` not an object, say), or a document index that is not one, is a one-line error naming the
file.
"""

from __future__ import annotations

import glob as globbing
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..tokenization.pretrained import PretrainedSpec, parse_pretrained
from ..tokenization.pretrained.tiktoken_encoding import ENDOFTEXT
from ..tokenization.subwords import MODEL_TYPES

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
# (magic, version) -> token type, as llm.c writes them
FORMATS = {(20240520, 1): np.dtype(np.uint16), (20240801, 7): np.dtype(np.uint32)}
MAGIC_OF = {np.dtype(np.uint16): (20240520, 1), np.dtype(np.uint32): (20240801, 7)}
SIDECAR = "prepared.json"
TOKENIZER_FILE = "tokenizer.bin"
FORMAT_NAME, FORMAT_VERSION = "skiplab-prepared-lm", 1
MAX_SHARD_TOKENS = 2**31 - 1  # llm.c's limit: the count is an int32
_SCANNED: set[tuple[str, int, int, int]] = set()  # (shard, size, mtime, largest id allowed) scanned by this process


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 where every id fits, else uint32 (as :func:`skiplab.corpora.windows.token_stream`)."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def write_shard(path: str | Path, tokens: np.ndarray) -> None:
    """``tokens`` (uint16 or uint32) as an llm.c data file."""
    dtype = np.dtype(tokens.dtype)
    if dtype not in MAGIC_OF:
        raise ValueError(f"{path}: shards hold uint16 or uint32 tokens, not {dtype}")
    if len(tokens) > MAX_SHARD_TOKENS:
        raise ValueError(f"{path}: {len(tokens)} tokens, more than a shard's {MAX_SHARD_TOKENS}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1] = MAGIC_OF[dtype]
    header[2] = len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.ascontiguousarray(tokens, dtype=dtype.newbyteorder("<")).tobytes())


def is_shard(path: str | Path) -> bool:
    """Whether ``path`` starts with a magic number of :data:`FORMATS`."""
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8:
        return False
    return tuple(int(v) for v in np.frombuffer(head, dtype="<i4")) in FORMATS


def open_shard(path: str | Path) -> np.ndarray:
    """The tokens of an llm.c data file, memory-mapped; its magic, version and token count checked."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such shard")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise ValueError(f"{path}: {size} bytes, shorter than the {HEADER_BYTES}-byte header of a token shard")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, count = (int(v) for v in header[:3])
    dtype = FORMATS.get((magic, version))
    if dtype is None:
        known = ", ".join(f"magic {m} version {v} ({d})" for (m, v), d in FORMATS.items())
        raise ValueError(f"{path}: not a token shard (magic {magic}, version {version}; known: {known})")
    if count < 0 or size != HEADER_BYTES + count * dtype.itemsize:
        body, itemsize = size - HEADER_BYTES, dtype.itemsize
        holds = f"{body // itemsize}" if body % itemsize == 0 else f"{body} bytes ({body // itemsize} tokens and " \
                f"{body % itemsize} byte{'s' if body % itemsize > 1 else ''} more)"
        raise ValueError(f"{path}: the header says {count} {dtype} tokens ({count * itemsize} bytes after the header), "
                         f"the file holds {holds}")
    if not count:
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=dtype.newbyteorder("<"), mode="r", offset=HEADER_BYTES, shape=(count,))


class ShardedTokens:
    """Shards' tokens as one read-only sequence: ``len``, slices (copied where they cross a shard's end) and
    ``np.asarray`` (the whole, in memory: for the small splits)."""

    def __init__(self, parts: list[np.ndarray]) -> None:
        self.parts = [p for p in parts if len(p)]
        self.ends = np.cumsum([len(p) for p in self.parts]).tolist()
        self.dtype = self.parts[0].dtype if self.parts else np.dtype(np.uint16)

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return np.asarray(self)[key]
            out, begin = [], 0
            for part, end in zip(self.parts, self.ends):
                lo, hi = max(start, begin), min(stop, end)
                if lo < hi:
                    out.append(part[lo - begin : hi - begin])
                begin = end
            return out[0] if len(out) == 1 else np.concatenate(out) if out else np.empty(0, dtype=self.dtype)
        i = int(key) + (len(self) if int(key) < 0 else 0)
        k = int(np.searchsorted(self.ends, i, side="right"))
        return self.parts[k][i - (self.ends[k - 1] if k else 0)]

    def __array__(self, dtype=None, copy=None):
        whole = np.concatenate(self.parts) if self.parts else np.empty(0, dtype=self.dtype)
        return whole if dtype is None else whole.astype(dtype)


def joined(parts: list[np.ndarray]) -> np.ndarray | ShardedTokens:
    """One shard's memmap as it is, several as :class:`ShardedTokens`."""
    return parts[0] if len(parts) == 1 else ShardedTokens(parts)


def expand(pattern: str | Path) -> list[Path]:
    """The files a path or glob names, in name order (a one-line error where none)."""
    pattern = str(Path(pattern).expanduser())
    files = sorted(Path(p) for p in globbing.glob(pattern)) if globbing.has_magic(pattern) else [Path(pattern)]
    if not files or not files[0].is_file():
        raise FileNotFoundError(f"{pattern}: no such file" + (" matches" if globbing.has_magic(pattern) else ""))
    return files


def read_token_files(pattern: str | Path, raw_dtype: str, vocab_size: int) -> tuple[np.ndarray | ShardedTokens, str]:
    """The tokens of the files ``pattern`` names (a glob, or one file): llm.c shards (told by their magic), or
    headerless arrays of ``raw_dtype`` (nanoGPT's ``.bin``); each scanned once for an id past ``vocab_size``.
    Returns the tokens and their token type's name."""
    parts, dtype = [], None
    for path in expand(pattern):
        if is_shard(path):
            tokens = open_shard(path)
        else:
            width = np.dtype(raw_dtype).itemsize
            size = path.stat().st_size
            if size % width:
                raise ValueError(f"{path}: {size} bytes is not a whole number of {raw_dtype} tokens "
                                 f"({width} bytes each)")
            tokens = np.memmap(path, dtype=raw_dtype, mode="r") if size else np.empty(0, dtype=raw_dtype)
        if not len(tokens):
            raise ValueError(f"{path}: empty token file")
        if dtype is not None and tokens.dtype != dtype:
            raise ValueError(f"{path}: {tokens.dtype} tokens, where the files before it hold {dtype}")
        dtype = tokens.dtype
        top = int(tokens.max())
        if top >= vocab_size:
            raise ValueError(f"{path}: token id {top} is not below the vocabulary size {vocab_size}")
        parts.append(tokens)
    return joined(parts), str(dtype)


@dataclass
class Prepared:
    """A prepared folder: its sidecar, checked against the files beside it."""

    root: Path
    meta: dict

    @property
    def sidecar(self) -> Path:
        return self.root / SIDECAR

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def tokenizer_spec(self) -> str:
        return str(self.meta["tokenizer"])

    def tokenizer_bytes(self) -> bytes:
        """The tokenizer's stored form, checked against the sidecar's digest."""
        path = self.root / self.meta["tokenizer_file"]
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file, named by {self.sidecar}")
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != self.meta["tokenizer_sha256"]:
            raise ValueError(f"{path}: not the tokenizer {self.sidecar} names (its sha256 differs)")
        return data

    def split(self, split: str) -> dict:
        if split not in self.meta["splits"]:
            raise ValueError(f"{self.sidecar}: no {split} split (it has {', '.join(self.meta['splits'])})")
        return self.meta["splits"][split]

    def shards(self, split: str) -> list[tuple[Path, np.ndarray]]:
        """The split's shards, memory-mapped, each checked against the sidecar (its type and count: their headers
        and sizes read, no token), with their paths; a missing one is the error naming it."""
        info, dtype = self.split(split), np.dtype(self.meta["dtype"])
        parts = []
        for shard in info["shards"]:
            path = self.root / shard["file"]
            tokens = open_shard(path)
            if tokens.dtype != dtype:
                raise ValueError(f"{path}: {tokens.dtype} tokens, where {self.sidecar} says {dtype}")
            if len(tokens) != shard["tokens"]:
                raise ValueError(f"{path}: {len(tokens)} tokens, where {self.sidecar} says {shard['tokens']}")
            parts.append((path, tokens))
        if sum(len(p) for _, p in parts) != info["tokens"] or not parts:
            raise ValueError(f"{self.sidecar}: the {split} shards hold {sum(len(p) for _, p in parts)} tokens, "
                             f"the sidecar says {info['tokens']}")
        return parts

    def tokens(self, split: str) -> np.ndarray | ShardedTokens:
        """The split's shards (:meth:`shards`), their largest id checked too (each shard scanned once a process,
        :func:`_check_ids`)."""
        info = self.split(split)
        parts = self.shards(split)
        for path, tokens in parts:
            _check_ids(path, tokens, int(info["max_id"]),
                       f"where {self.sidecar} gives the {split} split's largest as {int(info['max_id'])} "
                       f"(vocabulary {self.vocab_size})")
        return joined([tokens for _, tokens in parts])

    def first_documents(self, split: str, tokens: int) -> tuple[int, int, int]:
        """(tokens, bytes, words) of the first documents holding ``tokens`` tokens (all of them where fewer), as
        :func:`skiplab.train.lm_data.stream` cuts the text."""
        info = self.split(split)
        if not info.get("index"):
            raise ValueError(f"{self.sidecar}: the {split} split has no document index; --valid-tokens needs one")
        path = self.root / info["index"]
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file, named by {self.sidecar}")
        try:
            ends = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:  # pickled objects, not NumPy's format, truncated
            raise ValueError(f"{path}: not a document index, an .npy of int64 ({' '.join(str(exc).split())})") \
                from None
        if isinstance(ends, np.lib.npyio.NpzFile):  # an archive of arrays, not one
            ends.close()
        if (not isinstance(ends, np.ndarray) or ends.dtype != np.int64 or ends.shape != (info["documents"], 3)
                or not len(ends) or int(ends[-1, 0]) != info["tokens"]):
            raise ValueError(f"{path}: not the document index of the {split} split {self.sidecar} describes")
        k = min(int(np.searchsorted(ends[:, 0], tokens, side="left")), len(ends) - 1)
        return int(ends[k, 0]), int(ends[k, 1]), int(ends[k, 2])


def _kind(value: object) -> str:
    """What a JSON value is, in words ("a list", "null", ...)."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _object(value: object, where: str) -> dict:
    """``value`` where it is a JSON object; else a TypeError saying what ``where`` is instead."""
    if not isinstance(value, dict):
        raise TypeError(f"{where} is {_kind(value)}, not an object")
    return value


def _check_ids(path: Path, tokens: np.ndarray, largest: int, where: str) -> None:
    """A one-line error unless no id of ``tokens`` (a shard's memmap) passes ``largest``; ``where`` says where that
    bound comes from. Scanned once a process a shard (as long as its size and modification time stay)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, largest)
    if key in _SCANNED:
        return
    top = int(tokens.max()) if len(tokens) else -1
    if top > largest:
        raise ValueError(f"{path}: holds token id {top}, {where}")
    _SCANNED.add(key)


def is_prepared(folder: str | Path | None) -> bool:
    """Whether ``folder`` holds a sidecar of :func:`read_prepared`."""
    return bool(folder) and (Path(folder).expanduser() / SIDECAR).is_file()


def read_prepared(folder: str | Path) -> Prepared:
    """The sidecar of a prepared folder, its fields checked (one line naming the file where it is not one)."""
    root = Path(folder).expanduser()
    path = root / SIDECAR
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file (not a folder of skiplab prepare lm)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not JSON ({' '.join(str(exc).split())})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise ValueError(f"{path}: not a sidecar of skiplab prepare lm (format {FORMAT_NAME!r})")
    if meta.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: sidecar version {meta.get('version')}, this skiplab reads {FORMAT_VERSION}")
    try:
        vocab, eot, dtype = int(meta["vocab_size"]), int(meta["eot"]), np.dtype(meta["dtype"])
        for key in ("tokenizer", "tokenizer_file", "tokenizer_sha256", "corpus"):
            str(meta[key])
        splits = _object(meta["splits"], "splits")
        tops = {s: int(_object(info, f"splits.{s}")["max_id"]) for s, info in splits.items()}
        for s, info in splits.items():
            int(info["tokens"]), int(info["bytes"]), int(info["words"]), int(info["documents"]), str(info["name"])
            if not isinstance(info["shards"], list):
                raise TypeError(f"splits.{s}.shards is {_kind(info['shards'])}, not a list")
            for k, x in enumerate(info["shards"]):
                str(_object(x, f"splits.{s}.shards[{k}]")["file"]), int(x["tokens"])
            if not isinstance(info.get("index", ""), str):
                raise TypeError(f"splits.{s}.index is {_kind(info['index'])}, not a file name")
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: a sidecar missing or mangling a field ({' '.join(str(exc).split())})") from None
    if dtype not in MAGIC_OF or dtype != token_dtype(vocab):
        raise ValueError(f"{path}: token type {dtype} for a vocabulary of {vocab} (expected {token_dtype(vocab)})")
    for split, top in tops.items():
        if not 0 <= top < vocab:
            raise ValueError(f"{path}: the {split} split's largest id {top} is not below the vocabulary size {vocab}")
    if not 0 <= eot < vocab:
        raise ValueError(f"{path}: end-of-text id {eot} is not below the vocabulary size {vocab}")
    return Prepared(root, meta)


def _eot(spec: PretrainedSpec) -> str:
    """The end-of-text token a pretrained ``--tokenizer`` names, where naming none means one (a tiktoken encoding's
    ``<|endoftext|>``): ``tiktoken:gpt2:F`` and ``tiktoken(eot=<|endoftext|>):gpt2:F`` are one tokenizer."""
    return spec.eot or (ENDOFTEXT if spec.kind == "tiktoken" else "")


def check_prepared(prep: Prepared, corpus: str, tokenizer: str, vocab_size: int) -> None:
    """A one-line error unless a run naming ``corpus`` and ``tokenizer`` (and ``vocab_size``, for a subword
    tokenizer trained at preparation) may read ``prep``: the run's config then says what it trained on. A
    pretrained tokenizer's file may have moved: its kind, encoding and end-of-text token must agree."""
    meta = prep.meta
    other = "a training run gives {}; an evaluation, a --data-dir prepared for its run"
    if meta["corpus"] != corpus:
        given = f"--corpus {meta['corpus']}" if meta["corpus"] else "--corpus ''"
        raise ValueError(f"{prep.sidecar}: prepared from {meta['corpus'] or 'files'}, not {corpus or 'files'}; "
                         f"{other.format(given)}")
    ours, theirs = parse_pretrained(tokenizer), parse_pretrained(meta["tokenizer"])
    same = tokenizer == meta["tokenizer"] or (ours and theirs and (ours.kind, ours.encoding, _eot(ours))
                                              == (theirs.kind, theirs.encoding, _eot(theirs)))
    if not same:
        raise ValueError(f"{prep.sidecar}: prepared with --tokenizer {meta['tokenizer']}, not {tokenizer}; "
                         f"{other.format('--tokenizer ' + meta['tokenizer'])}")
    if tokenizer in MODEL_TYPES and vocab_size != prep.vocab_size:
        raise ValueError(f"{prep.sidecar}: prepared with --vocab-size {prep.vocab_size}, not {vocab_size}; "
                         f"{other.format(f'--vocab-size {prep.vocab_size}')}")
