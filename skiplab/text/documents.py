"""Documents for language modelling: files in the common layouts, and the named corpora :data:`LM_CORPORA`.

A split is a list of documents (strings). Where they come from:

    FILE.jsonl[.gz]     one JSON object a line with a "text" string (TinyStories, FineWeb, most hub corpora)
    FILE.txt[.gz]       plain text, documents separated by blank lines
    FOLDER/             every .txt / .txt.gz / .jsonl[.gz] file in it, in name order; a text file is one document

Text is UTF-8 (a leading byte-order mark dropped); a bad byte is an error naming the file and line, as is a
line of a JSON Lines file that is not an object with a "text" string. A split with no text is an error.

Named corpora (``--corpus NAME``) are read from ``data_dir`` (default ``$SKIPLAB_DATA/<name>`` or
``~/.cache/skiplab/<name>``); the downloadable ones are fetched there when absent, through the project's
download rules (nothing partial left behind, a present file never replaced, offline: an error saying which
file to put where). enwik8 and text8 are one stream each, split 90M / 5M / 5M in order (the split of
awd-lstm-lm's ``prep_enwik8.py`` and transformer-xl's ``prep_text8.py``); enwik8 is bytes, kept exactly
(bytes that are not UTF-8 survive as surrogate escapes, so the byte tokenizer sees the original bytes).

A sharded corpus (``c4-en``) is read from the shards of a split that are present in ``data_dir`` (or in its
``en/`` folder, the layout of the allenai/c4 repository), in shard order: a user may hold any subset of them,
and nothing is downloaded. C4 publishes train and validation only; its test split is the validation shards,
the split on which the papers report C4 perplexity.
"""

from __future__ import annotations

import gzip
import json
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from .corpus import decode_lines, default_data_dir, fetch

LM_SPLITS = ("train", "valid", "test")
EOT_SEPARATOR = "<|endoftext|>"  # TinyStories' document separator line
_GZIP_MAGIC = b"\x1f\x8b"
_M = 1_000_000
_FOLDER_FILES = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz")
C4_TRAIN, C4_VALID = "c4-train.?????-of-01024.json.gz", "c4-validation.?????-of-00008.json.gz"


@dataclass(frozen=True)
class LMCorpus:
    """Where a named corpus's splits are: ``files`` (split -> file in data_dir) or one ``stream`` cut in
    ``cuts`` (train, valid, test byte counts), from ``url`` (an archive when ``member`` names its file)."""

    name: str
    files: dict[str, str] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)  # file -> where to download it
    archive: str = ""  # a zip holding the files (or the stream), downloaded from urls[archive]
    stream: str = ""  # the one file the splits are cut from
    cuts: tuple[int, int, int] = (0, 0, 0)
    binary: bool = False  # bytes kept as they are (enwik8)
    separator: str = ""  # the line between two documents of a text file ("": a blank line)
    shards: dict[str, str] = field(default_factory=dict)  # split -> glob of its shards (read: those present)
    about: str = ""


LM_CORPORA: dict[str, LMCorpus] = {
    "pydocs": LMCorpus("pydocs", files={s: f"{s}.jsonl.gz" for s in LM_SPLITS},
                       about="the Python 3.11 documentation's reStructuredText sources, one document a file "
                             "(no download: give --data-dir)"),
    "enwik8": LMCorpus("enwik8", urls={"enwik8.zip": "http://mattmahoney.net/dc/enwik8.zip"}, archive="enwik8.zip",
                       stream="enwik8", cuts=(90 * _M, 5 * _M, 5 * _M), binary=True,
                       about="the first 10^8 bytes of an English Wikipedia XML dump (Hutter prize)"),
    "text8": LMCorpus("text8", urls={"text8.zip": "http://mattmahoney.net/dc/text8.zip"}, archive="text8.zip",
                      stream="text8", cuts=(90 * _M, 5 * _M, 5 * _M),
                      about="enwik8 cleaned to lower-case letters and spaces"),
    "wikitext-103-raw": LMCorpus(
        "wikitext-103-raw", files={s: f"wikitext-103-raw/wiki.{s}.raw" for s in LM_SPLITS},
        urls={"wikitext-103-raw-v1.zip": "https://wikitext.smerity.com/wikitext-103-raw-v1.zip"},
        archive="wikitext-103-raw-v1.zip", about="WikiText-103, raw characters (Merity et al. 2016)"),
    "tinystories": LMCorpus(
        "tinystories", files={"train": "TinyStoriesV2-GPT4-train.txt", "valid": "TinyStoriesV2-GPT4-valid.txt",
                              "test": "TinyStoriesV2-GPT4-valid.txt"}, separator=EOT_SEPARATOR,
        urls={f"TinyStoriesV2-GPT4-{s}.txt": f"https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/"
                                              f"TinyStoriesV2-GPT4-{s}.txt" for s in ("train", "valid")},
        about="short stories (Eldan and Li 2023), GPT-4 version; it publishes no test split: test is valid"),
    # allenai/c4, configuration "en" (Raffel et al. 2020, the Colossal Clean Crawled Corpus as the Hugging Face
    # hub publishes it): en/c4-train.00000-of-01024.json.gz ... 01023 and en/c4-validation.00000-of-00008.json.gz
    # ... 00007, JSON lines with "text", "timestamp" and "url"
    "c4-en": LMCorpus(
        "c4-en", shards={"train": C4_TRAIN, "valid": C4_VALID, "test": C4_VALID},
        about="C4 English (allenai/c4 'en' shards, c4-train.NNNNN-of-01024.json.gz and "
              "c4-validation.NNNNN-of-00008.json.gz; the shards present are read, none downloaded); it publishes "
              "no test split: test is validation"),
}


@dataclass
class Documents:
    """One split: its documents and a name saying where they came from."""

    texts: list[str]
    name: str

    @property
    def n_bytes(self) -> int:
        """UTF-8 bytes of the text, separators aside: the denominator of bits per byte."""
        return sum(len(t.encode("utf-8", "surrogateescape")) for t in self.texts)

    def __len__(self) -> int:
        return len(self.texts)


def read_documents(path: str | Path) -> Documents:
    """The documents of a file or folder in one of the layouts above."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.lower().endswith(_FOLDER_FILES))
        if not files:
            raise ValueError(f"{path}: no .txt, .txt.gz, .jsonl or .jsonl.gz files in this folder")
        texts: list[str] = []
        for f in files:
            texts += _jsonl(f) if _kind(f) == "jsonl" else ["\n".join(_lines(f))]
        return _checked(Documents(texts, path.name), path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file or folder")
    texts = _jsonl(path) if _kind(path) == "jsonl" else _split(_lines(path))
    return _checked(Documents(texts, path.name), path)


def load_documents(corpus: str, data_dir: str | Path | None, split: str, download: bool = True) -> Documents:
    """``split`` of the named ``corpus``, from ``data_dir`` (see the module docstring)."""
    info = lm_corpus(corpus)
    if split not in LM_SPLITS:
        raise ValueError(f"{info.name}: unknown split {split!r}; known: {', '.join(LM_SPLITS)}")
    root = Path(data_dir).expanduser() if data_dir else default_data_dir(info.name)
    if info.shards:
        return _sharded(root, info, split)
    if info.stream:
        data = _member(root, info, info.stream, download)
        start = sum(info.cuts[: LM_SPLITS.index(split)])
        part = data[start : start + info.cuts[LM_SPLITS.index(split)]]
        if not part:
            raise ValueError(f"{root / info.stream}: {len(data)} bytes, too short for its {split} split")
        text = part.decode("utf-8", "surrogateescape") if info.binary else decode_lines(part, info.stream)
        texts = [text] if info.binary else ["\n".join(text)]
        return _checked(Documents(texts, f"{info.name}/{split}"), root / info.stream)
    name = info.files[split]
    path = root / name
    if not path.is_file() and not info.urls:
        raise FileNotFoundError(f"{path}: no such file ({info.name} is not downloadable: {info.about})")
    if _kind(path) == "jsonl":
        return Documents(read_documents(path).texts, f"{info.name}/{split}")
    lines = decode_lines(_member(root, info, name, download), name)
    return _checked(Documents(_split(lines, info.separator), f"{info.name}/{split}"), path)


def lm_corpus(name: str) -> LMCorpus:
    key = name.strip().lower().replace("_", "-")
    if key not in LM_CORPORA:
        raise ValueError(f"unknown language-model corpus {name!r}; known: {', '.join(LM_CORPORA)}")
    return LM_CORPORA[key]


def _member(root: Path, info: LMCorpus, name: str, download: bool) -> bytes:
    """The bytes of ``name``: the file in ``root``, else from the corpus's archive (downloaded if absent)."""
    if (root / name).is_file():
        return (root / name).read_bytes()
    source = info.archive or name
    dest = root / source
    if not dest.is_file():
        if not download:
            raise FileNotFoundError(f"{dest} not found; download {info.urls[source]} into {root}")
        fetch(info.urls[source], dest)
    if not info.archive:
        return dest.read_bytes()
    try:
        with zipfile.ZipFile(dest) as z:
            return z.read(name)
    except KeyError:
        raise ValueError(f"{dest}: the archive has no {name}") from None
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{dest}: corrupt zip archive ({exc})") from None


def _sharded(root: Path, info: LMCorpus, split: str) -> Documents:
    """The documents of every shard of ``split`` present in ``root`` (or ``root/en``), in shard order."""
    pattern = info.shards[split]
    files = sorted(root.glob(pattern)) or sorted((root / "en").glob(pattern))
    if not files:
        raise FileNotFoundError(f"{root}: no {info.name} shards for the {split} split ({pattern}); put some of "
                                f"them there (in the folder or its en/) or give the folder holding them")
    texts: list[str] = []
    for f in files:
        texts += _jsonl(f)
    total = pattern.split("-of-")[1].split(".")[0].lstrip("0")
    return _checked(Documents(texts, f"{info.name}/{split} ({len(files)} of {total} shards)"), files[0].parent)


def _kind(path: Path) -> str:
    name = path.name.lower().removesuffix(".gz")
    return "jsonl" if name.endswith((".jsonl", ".json")) else "bin" if name.endswith(".bin") else "text"


def _read(path: Path) -> bytes:
    data = path.read_bytes()
    if data.startswith(_GZIP_MAGIC):
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(f"{path}: corrupt gzip file ({' '.join(str(exc).split())})") from None
    return data


def _lines(path: Path) -> list[str]:
    return decode_lines(_read(path), str(path))


def _jsonl(path: Path) -> list[str]:
    texts = []
    for i, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ValueError(f"{path}, line {i}: not a JSON object with a \"text\" string")
        texts.append(record["text"])
    return texts


def _split(lines: list[str], separator: str = "") -> list[str]:
    """Documents separated by lines that are ``separator`` (TinyStories' ``<|endoftext|>``), or blank."""
    docs, current = [], []
    for line in lines + [separator]:
        if line.strip() == separator:
            text = "\n".join(current).strip("\n")
            if text.strip():
                docs.append(text)
            current = []
        else:
            current.append(line)
    return docs


def _checked(docs: Documents, where: Path) -> Documents:
    docs.texts = [t for t in docs.texts if t]
    if not docs.texts or not any(t.strip() for t in docs.texts):
        raise ValueError(f"{where}: empty corpus (no text)")
    return docs
