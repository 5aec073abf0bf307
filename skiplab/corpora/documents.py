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

:func:`load_documents` and :func:`read_documents` give a split's documents as a list; :func:`iter_documents`
and :func:`iter_read_documents` give the same documents in the same order, read as they are iterated (a JSON
Lines file a line at a time, a text file a document at a time), so that a corpus larger than memory can be
tokenised (``skiplab prepare lm``). The lists are the streams collected: the two cannot differ. enwik8 and
text8 are read whole either way (a split of them is one document).
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .parallel import decode_lines, default_data_dir, fetch

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
    "debdocs": LMCorpus("debdocs", files={s: f"{s}.jsonl.gz" for s in LM_SPLITS},
                        about="documentation Debian ships (the Linux kernel's, PostgreSQL's, Perl's, git's, ...), "
                              "one document a page; built from the installed packages: skiplab corpus debdocs "
                              "--out DIR, then give --data-dir DIR"),
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


@dataclass(frozen=True)
class DocumentStream:
    """One split's documents read as they are iterated: the texts :class:`Documents` would hold, in the same
    order, one at a time. Each iteration reads the files afresh.

    The check that a split has some text can only end an iteration (the error :func:`load_documents` raises
    before returning); a consumer that must leave nothing behind on an error (``prepare lm``) writes aside
    and keeps what it wrote only once the iteration has ended.
    """

    name: str
    where: Path  # what the empty-split error names
    read: Callable[[], Iterable[str]] = field(repr=False)  # the texts, empty ones included

    def __iter__(self) -> Iterator[str]:
        return _checked(self.read(), self.where)

    def documents(self) -> Documents:
        """All of them at once."""
        return Documents(list(self), self.name)


def read_documents(path: str | Path) -> Documents:
    """The documents of a file or folder in one of the layouts above."""
    return iter_read_documents(path).documents()


def load_documents(corpus: str, data_dir: str | Path | None, split: str, download: bool = True) -> Documents:
    """``split`` of the named ``corpus``, from ``data_dir`` (see the module docstring)."""
    return iter_documents(corpus, data_dir, split, download).documents()


def iter_read_documents(path: str | Path) -> DocumentStream:
    """:func:`read_documents`'s documents, streamed: a .jsonl[.gz] file is read a line at a time, a .txt[.gz]
    file a document at a time (its lines up to the next blank one), a folder a file at a time (its JSON Lines
    files a line at a time, its text files, one document each, whole). A missing file or a folder without
    documents is an error here; the faults of the text are errors of the iteration, as they are met."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.lower().endswith(_FOLDER_FILES))
        if not files:
            raise ValueError(f"{path}: no .txt, .txt.gz, .jsonl or .jsonl.gz files in this folder")

        def folder() -> Iterator[str]:
            for f in files:
                if _kind(f) == "jsonl":
                    yield from _jsonl(f)
                else:
                    yield "\n".join(_lines(f))

        return DocumentStream(path.name, path, folder)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if _kind(path) == "jsonl":
        return DocumentStream(path.name, path, lambda: _jsonl(path))
    return DocumentStream(path.name, path, lambda: _split(_lines(path)))


def iter_documents(corpus: str, data_dir: str | Path | None, split: str, download: bool = True) -> DocumentStream:
    """:func:`load_documents`'s documents, streamed: files as :func:`iter_read_documents` reads them, a sharded
    corpus a shard at a time and each shard a line at a time, a named text file (WikiText-103, TinyStories; from
    its archive where it is not extracted) a document at a time. enwik8 and text8 stay whole: a split of them is
    one document (90 MB of train), which a tokenizer encodes at once. The corpus is found (and downloaded) here;
    its text is read as the stream is iterated."""
    info = lm_corpus(corpus)
    if split not in LM_SPLITS:
        raise ValueError(f"{info.name}: unknown split {split!r}; known: {', '.join(LM_SPLITS)}")
    root = Path(data_dir).expanduser() if data_dir else default_data_dir(info.name)
    if info.shards:
        return _sharded(root, info, split)
    if info.stream:
        found = _locate(root, info, info.stream, download)

        def stream() -> Iterator[str]:
            data = _member(*found, info.stream)
            start = sum(info.cuts[: LM_SPLITS.index(split)])
            part = data[start : start + info.cuts[LM_SPLITS.index(split)]]
            if not part:
                raise ValueError(f"{root / info.stream}: {len(data)} bytes, too short for its {split} split")
            del data
            if info.binary:
                yield part.decode("utf-8", "surrogateescape")
            else:
                yield "\n".join(decode_lines(part, info.stream))

        return DocumentStream(f"{info.name}/{split}", root / info.stream, stream)
    name = info.files[split]
    path = root / name
    if not path.is_file() and not info.urls:
        raise FileNotFoundError(f"{path}: no such file ({info.name} is not downloadable: {info.about})")
    if _kind(path) == "jsonl":
        return dataclasses.replace(iter_read_documents(path), name=f"{info.name}/{split}")
    found = _locate(root, info, name, download)
    return DocumentStream(f"{info.name}/{split}", path,
                          lambda: _split(_decoded(_member_lines(*found, name), name), info.separator))


def lm_corpus(name: str) -> LMCorpus:
    key = name.strip().lower().replace("_", "-")
    if key not in LM_CORPORA:
        raise ValueError(f"unknown language-model corpus {name!r}; known: {', '.join(LM_CORPORA)}")
    return LM_CORPORA[key]


def _locate(root: Path, info: LMCorpus, name: str, download: bool) -> tuple[Path, bool]:
    """Where ``name`` is: (the file in ``root``, False), else (the corpus's archive, True) or (the file, False)
    downloaded if absent."""
    if (root / name).is_file():
        return root / name, False
    source = info.archive or name
    dest = root / source
    if not dest.is_file():
        if not download:
            raise FileNotFoundError(f"{dest} not found; download {info.urls[source]} into {root}")
        fetch(info.urls[source], dest)
    return dest, bool(info.archive)


@contextmanager
def _archive_errors(archive: Path, name: str) -> Iterator[None]:
    try:
        yield
    except KeyError:
        raise ValueError(f"{archive}: the archive has no {name}") from None
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{archive}: corrupt zip archive ({exc})") from None


def _member(file: Path, archived: bool, name: str) -> bytes:
    """The bytes of ``name``, found by :func:`_locate` at ``file`` (an archive holding it when ``archived``)."""
    if not archived:
        return file.read_bytes()
    with _archive_errors(file, name), zipfile.ZipFile(file) as z:
        return z.read(name)


def _member_lines(file: Path, archived: bool, name: str) -> Iterator[bytes]:
    """:func:`_member`'s bytes a line at a time (each with its ``\\n``; the last may lack it)."""
    if not archived:
        with open(file, "rb") as f:
            yield from f
        return
    with _archive_errors(file, name), zipfile.ZipFile(file) as z, z.open(name) as f:
        yield from f


def _sharded(root: Path, info: LMCorpus, split: str) -> DocumentStream:
    """The documents of every shard of ``split`` present in ``root`` (or ``root/en``), in shard order."""
    pattern = info.shards[split]
    files = sorted(root.glob(pattern)) or sorted((root / "en").glob(pattern))
    if not files:
        raise FileNotFoundError(f"{root}: no {info.name} shards for the {split} split ({pattern}); put some of "
                                f"them there (in the folder or its en/) or give the folder holding them")

    def shards() -> Iterator[str]:
        for f in files:
            yield from _jsonl(f)

    total = pattern.split("-of-")[1].split(".")[0].lstrip("0")
    return DocumentStream(f"{info.name}/{split} ({len(files)} of {total} shards)", files[0].parent, shards)


def _kind(path: Path) -> str:
    name = path.name.lower().removesuffix(".gz")
    return "jsonl" if name.endswith((".jsonl", ".json")) else "bin" if name.endswith(".bin") else "text"


def _file_lines(path: Path) -> Iterator[bytes]:
    """The bytes of a file a line at a time, gunzipped as they are read where it is gzip (by its magic bytes,
    whatever its name); a corrupt gzip file is an error naming it."""
    with open(path, "rb") as f:
        gzipped = f.read(2) == _GZIP_MAGIC
        f.seek(0)
        if not gzipped:
            yield from f
            return
        try:
            with gzip.GzipFile(fileobj=f) as g:
                yield from g
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            message = " ".join(str(exc).split())
            if message.startswith("CRC check failed"):  # what gzip.decompress says (GzipFile adds the two sums)
                message = "CRC check failed"
            raise ValueError(f"{path}: corrupt gzip file ({message})") from None


def _decoded(raw: Iterable[bytes], source: str) -> Iterator[str]:
    """The lines of UTF-8 ``raw`` lines as :func:`decode_lines` gives them (only ``\\n`` ends a line, ``\\r``
    before it dropped, a leading byte-order mark dropped), one at a time; a bad byte is an error naming
    ``source`` and the line. A fault further on (a corrupt gzip file or zip member) is the error named instead,
    as when the file is read at once."""
    raw = iter(raw)
    for i, line in enumerate(raw, start=1):
        ended = line.endswith(b"\n")
        try:
            text = (line[:-1] if ended else line).decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None:
            _drain(raw)
            raise ValueError(f"{source}: line {i} is not valid UTF-8")
        if i == 1:
            text = text.removeprefix("\ufeff")
            if not text and not ended:  # a file of a byte-order mark alone has no line
                return
        yield text.removesuffix("\r")


def _lines(path: Path) -> Iterator[str]:
    return _decoded(_file_lines(path), str(path))


def _drain(it: Iterator) -> None:
    """Read the rest of ``it`` (raising its errors)."""
    for _ in it:
        pass


def _jsonl(path: Path) -> Iterator[str]:
    """The "text" of each line of a JSON Lines file, blank lines skipped. A bad line is an error; a bad byte or
    a corrupt gzip file further on is the error named instead, as when the file is read at once."""
    lines = _lines(path)
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            _drain(lines)
            raise ValueError(f"{path}, line {i}: not a JSON object with a \"text\" string")
        text = record["text"]
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as err:  # JSON's \ud800-\udfff escapes unpaired: no character
                _drain(lines)
                raise ValueError(f"{path}, line {i}: its \"text\" holds {text[err.start]!r}, half of a UTF-16 "
                                 "surrogate pair without its other half (no character; not valid UTF-8)") from None
        yield text


def _split(lines: Iterable[str], separator: str = "") -> Iterator[str]:
    """Documents separated by lines that are ``separator`` (TinyStories' ``<|endoftext|>``), or blank; one
    document held at a time."""
    current: list[str] = []
    for line in itertools.chain(lines, [separator]):
        if line.strip() == separator:
            text = "\n".join(current).strip("\n")
            if text.strip():
                yield text
            current = []
        else:
            current.append(line)


def _checked(texts: Iterable[str], where: Path) -> Iterator[str]:
    """``texts`` without the empty ones; a split with no text (nothing but whitespace) is an error at its end."""
    blank = True
    for t in texts:
        if t:
            if blank and t.strip():
                blank = False
            yield t
    if blank:
        raise ValueError(f"{where}: empty corpus (no text)")
