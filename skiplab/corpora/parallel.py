"""Parallel text on disk: reading line-aligned files, and the named corpora :data:`CORPORA`.

A parallel corpus is two files with one sentence per line, line *i* of one translating line *i* of
the other: ``PREFIX.SRC`` and ``PREFIX.TGT`` (``train.en`` / ``train.de``), each plain or gzipped.

A corpus is named by a spec string (what ``MTTrainConfig.corpus`` holds)::

    NAME                                  the splits as the corpus defines them
    NAME(SPLIT=STEM[+STEM...][,...])      a split read from other published files, concatenated in order

SPLIT is ``train``, ``valid`` or ``test``; each STEM is a file stem the corpus publishes
(:attr:`CorpusInfo.files`). ``wmt14-en-de`` validates on newstest2013 (the rSkip+LN paper, Section 4.1.2)
and ``wmt14-en-de(valid=newstest2012+newstest2013)`` on both years, one after the other (the
depth-wise LSTM paper, Section 5). An option equal to the default is dropped from the canonical name
(:attr:`CorpusSpec.name`), which names the loaded data.

The prepared IWSLT'15 and WMT'14 files are Moses-tokenised and Moses-escaped (``&quot;``, ``&apos;``,
``&amp;``, ...; see :mod:`skiplab.tokenization.moses`). Their users translate and score the tokenised text with
the entities turned back into characters, so :func:`load_corpus` unescapes every split and side of a
corpus marked :attr:`CorpusInfo.moses_escaped`, and marks the data :attr:`Parallel.tokenized`.

Where :func:`load_corpus` looks when ``data_dir`` is None: ``$SKIPLAB_DATA/<name>`` when that
variable is set, else ``~/.cache/skiplab/<name>``. Missing files are downloaded there (when allowed),
through a hidden temporary file renamed into place, so a failed download leaves nothing behind and a
file already present is never overwritten.
"""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..data.download import download
from ..tokenization import moses

SPLITS = ("train", "valid", "test")
TIMEOUT_S = 30.0
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Parallel:
    """Aligned sentence pairs: ``src[i]`` translates to ``tgt[i]``."""

    src: list[str]
    tgt: list[str]
    name: str  # for messages and logs, e.g. "multi30k/train.en-de"
    tokenized: bool = False  # Moses-tokenised text (entities unescaped), as the prepared IWSLT'15 / WMT'14 files

    def __post_init__(self) -> None:
        if len(self.src) != len(self.tgt):
            raise ValueError(f"{self.name}: {len(self.src)} source lines but {len(self.tgt)} target lines")

    def __len__(self) -> int:
        return len(self.src)


@dataclass(frozen=True)
class CorpusInfo:
    """Where one named corpus is published and how its files are named."""

    name: str
    languages: tuple[str, ...]
    stems: dict[str, tuple[str, ...]]  # split -> its file stems by default, concatenated ("val"; "tst2012")
    base_url: str  # the file's remote name is appended
    remote_gz: bool  # whether the published files are gzipped
    files: tuple[str, ...] = ()  # every published stem a split may name (default: those of ``stems``)
    moses_escaped: bool = False  # Moses-tokenised, special characters escaped: unescaped on reading

    def __post_init__(self) -> None:
        if not self.files:
            object.__setattr__(self, "files", tuple(dict.fromkeys(s for v in self.stems.values() for s in v)))

    def remote_name(self, stem: str, lang: str) -> str:
        """The published file name of one side of one file stem, e.g. ``val.de.gz``."""
        return f"{stem}.{lang}" + (".gz" if self.remote_gz else "")

    def url(self, stem: str, lang: str) -> str:
        return self.base_url + self.remote_name(stem, lang)


# No checksums are recorded here for any of these files, the WMT'14 ones included (none is published
# with them, and none was taken from a download). So the offline rule is the only one: a file present in
# the data folder is used as it is, unchecked; a missing one is downloaded unchecked when allowed, and
# offline (DownloadError) or with download=False (FileNotFoundError) the error names the file and its URL.
CORPORA: dict[str, CorpusInfo] = {
    # Multi30k task 1, raw (untokenised, true-cased) text; the test set is the 2016 Flickr one.
    "multi30k": CorpusInfo(
        name="multi30k",
        languages=("en", "de", "fr", "cs"),
        stems={"train": ("train",), "valid": ("val",), "test": ("test_2016_flickr",)},
        base_url="https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/",
        remote_gz=True,
    ),
    # IWSLT'15 English-Vietnamese as prepared by the Stanford NMT group (Luong & Manning, 2015):
    # Moses-tokenised and escaped (the public tst2012.vi has &quot; and &apos;).
    "iwslt15-en-vi": CorpusInfo(
        name="iwslt15-en-vi",
        languages=("en", "vi"),
        stems={"train": ("train",), "valid": ("tst2012",), "test": ("tst2013",)},
        base_url="https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi/",
        remote_gz=False,
        moses_escaped=True,
    ),
    # WMT'14 English-German as prepared by the Stanford NMT group (Luong et al., 2015; 4.5M training
    # pairs), Moses-tokenised and escaped. Test: newstest2014. Valid: newstest2013, as in the rSkip+LN
    # paper; the depth-wise LSTM paper's newstest2012+2013 is "wmt14-en-de(valid=newstest2012+newstest2013)".
    "wmt14-en-de": CorpusInfo(
        name="wmt14-en-de",
        languages=("en", "de"),
        stems={"train": ("train",), "valid": ("newstest2013",), "test": ("newstest2014",)},
        base_url="https://nlp.stanford.edu/projects/nmt/data/wmt14.en-de/",
        remote_gz=False,
        files=("train", "newstest2012", "newstest2013", "newstest2014", "newstest2015"),
        moses_escaped=True,
    ),
}


@dataclass(frozen=True)
class CorpusSpec:
    """A named corpus with the file stems each split reads, as a spec string chose them."""

    info: CorpusInfo
    stems: dict[str, tuple[str, ...]]  # every split -> its stems, concatenated in order

    @property
    def name(self) -> str:
        """The canonical spec string: options equal to the corpus's defaults are left out."""
        options = [f"{split}={'+'.join(stems)}" for split, stems in self.stems.items()
                   if stems != self.info.stems[split]]
        return self.info.name + (f"({','.join(options)})" if options else "")


def parse_corpus(spec: str) -> CorpusSpec:
    """Resolve a corpus spec string (grammar in the module docstring); a bad one is a one-line ValueError
    naming what is known: ``parse_corpus("wmt14-en-de(valid=newstest2012+newstest2013)")``."""
    text = spec.strip()
    name, _, rest = text.partition("(")
    info = _corpus(name)
    stems = dict(info.stems)
    if not rest and "(" not in text:
        return CorpusSpec(info, stems)
    if not rest.endswith(")") or "(" in rest or ")" in rest[:-1]:
        raise ValueError(f"bad corpus spec {spec!r}: write NAME or NAME(SPLIT=STEM[+STEM...],...)")
    given: set[str] = set()
    for item in (p.strip() for p in rest[:-1].split(",")):
        key, eq, value = (x.strip() for x in item.partition("="))
        if not eq or not key or not value:
            raise ValueError(f"bad corpus spec {spec!r}: {item!r} is not SPLIT=STEM[+STEM...]")
        key = key.lower()
        if key not in SPLITS:
            raise ValueError(f"{info.name} has no option {key!r}; its options: {', '.join(SPLITS)}")
        if key in given:
            raise ValueError(f"bad corpus spec {spec!r}: {key} given twice")
        given.add(key)
        chosen = tuple(s.strip() for s in value.split("+"))
        for stem in chosen:
            if stem not in info.files:
                raise ValueError(f"{info.name} has no file stem {stem!r} (in {key}={value}); "
                                 f"known: {', '.join(info.files)}")
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"bad corpus spec {spec!r}: a stem repeats in {key}={value}")
        stems[key] = chosen
    return CorpusSpec(info, stems)


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file, plain or gzipped, without their ``\\n`` / ``\\r\\n``.

    Gzip is recognised by its magic bytes, whatever the suffix. Only ``\\n`` ends a line: the other
    characters ``str.splitlines`` breaks on (U+2028, U+0085, form feed, ...) can occur inside a
    sentence, and splitting there would shift every later line out of alignment with its translation.
    A leading UTF-8 byte-order mark is dropped; all other whitespace is kept.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: a folder, not a text file")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    data = path.read_bytes()  # a file, or a device or pipe (/dev/stdin, <(...)) read as one
    if data.startswith(_GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError; truncation is EOFError
            raise ValueError(f"{path}: corrupt gzip file ({_one_line(exc)})") from None
    return decode_lines(data, str(path))


def decode_lines(data: bytes, source: str) -> list[str]:
    """The lines of UTF-8 ``data`` as :func:`read_lines` splits them; a bad byte is an error naming
    ``source`` and the line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Decoding the whole text at once is fast; the line number is recovered from the error offset.
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{source}: line {line} is not valid UTF-8") from None
    text = text.removeprefix("\ufeff")
    lines = text.split("\n")
    if lines[-1] == "":  # the final newline ends the last line rather than starting an empty one
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def read_parallel(prefix: str | Path, src: str, tgt: str) -> Parallel:
    """Read the aligned files ``PREFIX.SRC`` and ``PREFIX.TGT`` (each may be ``.gz``).

    Pairs empty on both sides are dropped (blank separator lines); a pair empty on one side only is
    kept as it is, since dropping it silently would hide a real alignment problem in the data.
    """
    prefix = Path(prefix)
    if src == tgt:
        raise ValueError(f"{prefix}: source and target language are both {src!r}")
    src_file, tgt_file = _find_side(prefix, src), _find_side(prefix, tgt)
    src_lines, tgt_lines = read_lines(src_file), read_lines(tgt_file)
    for file, lines in ((src_file, src_lines), (tgt_file, tgt_lines)):
        if not lines:
            raise ValueError(f"{file}: empty corpus")
    if len(src_lines) != len(tgt_lines):
        raise ValueError(
            f"misaligned corpus: {src_file} has {len(src_lines)} lines but {tgt_file} has {len(tgt_lines)}"
        )
    pairs = [(s, t) for s, t in zip(src_lines, tgt_lines) if s.strip() or t.strip()]
    if not pairs:
        raise ValueError(f"{src_file}: empty corpus (only blank lines)")
    name = f"{prefix.parent.name}/{prefix.name}" if prefix.parent.name else prefix.name
    return Parallel([s for s, _ in pairs], [t for _, t in pairs], f"{name}.{src}-{tgt}")


def load_corpus(
    name: str, data_dir: str | Path | None, src: str, tgt: str, split: str, download: bool = True
) -> Parallel:
    """One split ("train", "valid" or "test") of the corpus spec ``name`` in the direction ``src`` -> ``tgt``.

    A split of several file stems is their pairs concatenated in order. Files absent from ``data_dir``
    (default: see the module docstring) are downloaded when ``download`` is true; otherwise
    :class:`FileNotFoundError` names the file and its URL. A Moses-escaped corpus comes back unescaped
    (:func:`skiplab.tokenization.moses.unescape` on every line of both sides) and marked ``tokenized``.
    """
    spec = parse_corpus(name)
    info = spec.info
    if split not in SPLITS:
        raise ValueError(f"{info.name}: unknown split {split!r}; known: {', '.join(SPLITS)}")
    for lang in (src, tgt):
        if lang not in info.languages:
            raise ValueError(f"{info.name} has no language {lang!r}; known: {', '.join(info.languages)}")
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir(info.name)
    src_lines: list[str] = []
    tgt_lines: list[str] = []
    for stem in spec.stems[split]:
        for lang in (src, tgt):
            if _locate(root / stem, lang) is not None:
                continue
            dest, url = root / info.remote_name(stem, lang), info.url(stem, lang)
            if not download:
                raise FileNotFoundError(f"{dest} not found; download {url} into {root}, or load with download=True")
            fetch(url, dest)
        part = read_parallel(root / stem, src, tgt)
        src_lines += part.src
        tgt_lines += part.tgt
    if info.moses_escaped:
        src_lines, tgt_lines = [moses.unescape(s) for s in src_lines], [moses.unescape(t) for t in tgt_lines]
    return Parallel(src_lines, tgt_lines, f"{spec.name}/{split}.{src}-{tgt}", tokenized=info.moses_escaped)


def load_split(where: Mapping[str, Any], split: str) -> Parallel:
    """The ``split`` ("train", "valid", "test") of a run's data, as its config names it.

    ``where`` holds ``corpus``, ``data_dir``, ``src``, ``tgt`` and, for ``corpus=""``, the file prefixes
    ``train_prefix``, ``valid_prefix``, ``test_prefix``: a training config, or the dict stored with a run.
    """
    if where["corpus"]:
        return load_corpus(where["corpus"], where["data_dir"] or None, where["src"], where["tgt"], split)
    prefix = where.get(f"{split}_prefix", "")
    if not prefix:
        raise ValueError(f"no --{split}-prefix given")
    return read_parallel(prefix, where["src"], where["tgt"])


def default_data_dir(name: str) -> Path:
    """``$SKIPLAB_DATA/<name>`` when that variable is set, else ``~/.cache/skiplab/<name>``."""
    env = os.environ.get("SKIPLAB_DATA")
    return (Path(env).expanduser() if env else Path("~/.cache/skiplab").expanduser()) / name


def fetch(url: str, dest: Path, timeout: float = TIMEOUT_S) -> Path:
    """Download ``url`` to ``dest`` unless it exists; unchecked (no published checksums for these files).

    :func:`skiplab.data.download.download` without the md5: nothing partial is ever left, a file
    present at ``dest`` is never replaced, and network failures raise
    :class:`~skiplab.data.download.DownloadError` saying which file to put where.
    """
    return download(url, dest, None, timeout)


def _corpus(name: str) -> CorpusInfo:
    key = name.strip().lower().replace("_", "-")  # "iwslt15_en_vi" and "WMT14-EN-DE" are spellings too
    if key not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")
    return CORPORA[key]


def _locate(prefix: Path, lang: str) -> Path | None:
    # The plain file first: a user who un-gzipped a file may have fixed something in it.
    for path in (prefix.with_name(f"{prefix.name}.{lang}"), prefix.with_name(f"{prefix.name}.{lang}.gz")):
        if path.is_file():
            return path
    return None


def _find_side(prefix: Path, lang: str) -> Path:
    path = _locate(prefix, lang)
    if path is None:
        raise FileNotFoundError(f"{prefix}.{lang}: no such file (nor {prefix}.{lang}.gz)")
    return path


def _one_line(exc: object) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
