"""``debdocs``: a corpus of English technical prose built from the documentation Debian ships.

    apt-get update && apt-get install -y --no-install-recommends linux-doc-6.1 postgresql-doc-15 perl-doc \\
        git-doc erlang-doc python-django-doc cmake-doc sqlite3-doc manpages manpages-dev debian-reference-en \\
        debian-policy developers-reference python-sqlalchemy-doc nodejs-doc octave-doc sphinx-doc bind9-doc \\
        libssl-doc vim-doc zsh-doc postfix-doc
    skiplab corpus debdocs --out DIR            # DIR/train.jsonl.gz, valid.jsonl.gz, test.jsonl.gz, manifest.json
    skiplab prepare lm --corpus debdocs --data-dir DIR --tokenizer bytes --out DIR/bytes

What is read (:data:`SOURCES`): for each package, the files dpkg says it installed (``var/lib/dpkg/info/PKG.list``
under ``--root``) that match the source's patterns and none of its exclusions, in path order; its version from
dpkg's ``status``; a symbolic link (another name of a page read under its own) is skipped. Nothing is downloaded. A
package pattern (``linux-doc-*``) takes every installed package it matches; a source none of whose packages is
installed is an error naming the ``apt-get install`` to run.

Each file is one document: its prose (:func:`skiplab.corpora.prose.to_text`: HTML pages, manual pages,
reStructuredText or plain text without their markup; code listings kept as text; tables of numbers and binary
files dropped). A document shorter than ``min_chars`` characters (an index page, a ``.so`` link, a stub) is
dropped, as is a duplicate: a document whose normalised text (:func:`~skiplab.corpora.prose.clean.text_key`) was
met before, in the order above, so no text is in two splits. Its split follows from its path alone::

    bucket = int(sha256(path)[:16], 16) mod 1000
    valid if bucket < valid_per_mille; test if bucket < valid_per_mille + test_per_mille; train otherwise

so a document keeps its split whatever else is installed. The splits are JSON Lines, gzipped, one object a
document, ``{"id": PATH, "package": PKG, "text": TEXT}`` (the layout of pydocs, with the package added);
``manifest.json`` gives the packages and versions, the files read and the documents kept or dropped of each, the
documents, characters, bytes and SHA-256 of each split, and ``build_sha256``, the SHA-256 of the settings, the
packages and versions and the three splits' digests. The same packages give the same bytes: the gzip headers carry
no time or name. The folder is written beside itself (``OUT.partial``, marked as this command's:
:mod:`skiplab.corpora.work`) and renamed when complete; an existing ``OUT`` is never replaced, and an ``OUT.partial``
that is not an interrupted build's is left as it is.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import json
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .documents import LM_SPLITS
from .prose import text_key, to_text
from .work import write_beside

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
HTML_EXCLUDE = ("*/genindex*.html", "*/search.html", "*/py-modindex.html", "*/_modules/*", "*/_static/*",
                "*/_sources/*", "*/java/*")


@dataclass(frozen=True)
class Source:
    """The files of one package that are documents, and their kind (html, man, rst or txt)."""

    package: str  # a dpkg package name, or a pattern of them ("linux-doc-*")
    kind: str
    include: tuple[str, ...]  # fnmatch patterns on the installed path ("*" crosses "/")
    exclude: tuple[str, ...] = HTML_EXCLUDE


SOURCES: tuple[Source, ...] = (
    Source("linux-doc-*", "html", ("/usr/share/doc/linux-doc-*/html/*.html",),  # kernel-doc's pages included
           HTML_EXCLUDE + ("*/html/translations/*",)),  # English only
    Source("postgresql-doc-*", "html", ("/usr/share/doc/postgresql-doc-*/html/*.html",),
           HTML_EXCLUDE + ("*/bookindex.html",)),
    Source("perl-doc", "man", ("/usr/share/man/man1/*.1.gz", "/usr/share/man/man3/*.3perl.gz")),
    Source("git-doc", "html", ("/usr/share/doc/git-doc/*.html",)),
    Source("erlang-doc", "html", ("/usr/share/doc/erlang-doc/*.html",)),
    Source("python-django-doc", "html", ("/usr/share/doc/python-django-doc/html/*.html",)),
    Source("cmake-doc", "html", ("/usr/share/doc/cmake-data/html/*.html",)),
    Source("sqlite3-doc", "html", ("/usr/share/doc/sqlite3/*.html",)),
    Source("manpages", "man", ("/usr/share/man/man[1-9]/*",)),  # the English pages, not man/LANG/
    Source("manpages-dev", "man", ("/usr/share/man/man[1-9]/*",)),
    Source("debian-reference-en", "html", ("/usr/share/debian-reference/*.en.html",)),
    Source("debian-policy", "html", ("/usr/share/doc/debian-policy/*.html",),
           HTML_EXCLUDE + ("*-1.html",)),  # the one-page copies of the chaptered documents
    Source("developers-reference", "html", ("/usr/share/developers-reference/*.html",)),
    Source("python-sqlalchemy-doc", "html", ("/usr/share/doc/python-sqlalchemy-doc/html/*.html",)),
    Source("nodejs-doc", "html", ("/usr/share/doc/nodejs/api/*.html",),
           HTML_EXCLUDE + ("*/all.html",)),  # every other page in one
    Source("octave-doc", "html", ("/usr/share/doc/octave/octave.html/*.html",)),
    Source("sphinx-doc", "html", ("/usr/share/doc/sphinx-doc/html/*.html",)),
    Source("bind9-doc", "html", ("/usr/share/doc/bind9-doc/arm/*.html",)),
    Source("libssl-doc", "man", ("/usr/share/man/man[1-9]/*",)),
    Source("vim-doc", "html", ("/usr/share/doc/vim/html/*.html",)),
    Source("zsh-doc", "html", ("/usr/share/doc/zsh-common/html/*.html",)),
    Source("postfix-doc", "html", ("/usr/share/doc/postfix/html/*.html",)),
)


@dataclass(frozen=True)
class DebdocsConfig:
    """What ``skiplab corpus debdocs`` reads and where it writes."""

    out: str = field(default="data/debdocs", metadata={"help": "the folder to write (must not exist)"})
    root: str = field(default="/", metadata={"help": "the file system the packages are installed in"})
    packages: tuple[str, ...] = field(default=(), metadata={
        "help": "only the sources of these packages (comma-separated patterns as SOURCES names them; '' = all)"})
    valid_per_mille: int = field(default=10, metadata={"min": 0, "help": "documents in valid, per 1000"})
    test_per_mille: int = field(default=10, metadata={"min": 0, "help": "documents in test, per 1000"})
    min_chars: int = field(default=500, metadata={"min": 0, "help": "shorter documents are dropped"})

    def __post_init__(self):
        # one set of packages, however listed: the same packages give the same manifest and digest
        object.__setattr__(self, "packages", tuple(sorted(set(self.packages))))
        if self.valid_per_mille + self.test_per_mille >= 1000:
            raise ValueError("--valid-per-mille and --test-per-mille must leave documents for train")


def split_of(path: str, cfg: DebdocsConfig) -> str:
    """The split of the document at ``path`` (the formula of the module docstring)."""
    bucket = int(hashlib.sha256(path.encode("utf-8")).hexdigest()[:16], 16) % 1000
    if bucket < cfg.valid_per_mille:
        return "valid"
    return "test" if bucket < cfg.valid_per_mille + cfg.test_per_mille else "train"


def installed(root: Path) -> dict[str, str]:
    """Every package dpkg has installed under ``root``: name -> version, from ``var/lib/dpkg/status``."""
    status = root / "var/lib/dpkg/status"
    if not status.is_file():
        raise FileNotFoundError(f"{status}: no dpkg status file (is --root a Debian system?)")
    found: dict[str, str] = {}
    for para in status.read_text(encoding="utf-8", errors="replace").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in para.split("\n") if ": " in line and not line.startswith(" "))
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            found[fields["Package"]] = fields.get("Version", "")
    return found


def package_files(root: Path, package: str) -> list[str]:
    """The paths dpkg lists for ``package`` (``info/PKG.list`` or ``info/PKG:ARCH.list``), as installed."""
    info = root / "var/lib/dpkg/info"
    lists = sorted(info.glob(f"{package}.list")) + sorted(info.glob(f"{package}:*.list"))
    if not lists:
        raise FileNotFoundError(f"{info}/{package}.list: dpkg lists no files for {package}")
    return sorted({line for f in lists for line in f.read_text(encoding="utf-8").split("\n") if line})


def resolve(sources: tuple[Source, ...], have: dict[str, str]) -> list[tuple[Source, str]]:
    """(source, package) for each installed package each source names, in order; missing ones are one error."""
    chosen, missing = [], []
    for source in sources:
        names = sorted(p for p in have if fnmatch.fnmatchcase(p, source.package))
        if not names:
            missing.append(source.package)
        chosen += [(source, name) for name in names]
    if missing:
        raise FileNotFoundError(f"debdocs: not installed: {', '.join(missing)}; run apt-get update && apt-get "
                                f"install -y {' '.join(p.replace('-*', '-<version>') for p in missing)}")
    return chosen


def documents(root: Path, source: Source, package: str) -> Iterator[tuple[str, str]]:
    """(path, text) of each of ``package``'s files that ``source`` takes, in path order."""
    for path in package_files(root, package):
        if not any(fnmatch.fnmatchcase(path, p) for p in source.include):
            continue
        if any(fnmatch.fnmatchcase(path, p) for p in source.exclude):
            continue
        file = root / path.lstrip("/")
        if file.is_file() and not file.is_symlink():
            try:
                text = to_text(source.kind, file.read_bytes())
            except (OSError, EOFError, zlib.error) as exc:  # a corrupt gzip file (BadGzipFile is an OSError)
                raise ValueError(f"{file}: cannot be read ({' '.join(str(exc).split()) or type(exc).__name__})") \
                    from None
            yield path, text


def build(cfg: DebdocsConfig, sources: tuple[Source, ...] = SOURCES, progress: bool = True) -> dict[str, Any]:
    """Write the corpus into ``cfg.out`` (see the module docstring); return the manifest."""
    out, root = Path(cfg.out).expanduser(), Path(cfg.root)
    if out.exists():
        raise FileExistsError(f"{out}: already exists; give another --out or remove it")
    if cfg.packages:
        # a source's own pattern ("linux-doc-*") or an installed package's name ("linux-doc-6.1")
        named = lambda s, p: fnmatch.fnmatchcase(s.package, p) or fnmatch.fnmatchcase(p, s.package)  # noqa: E731
        unknown = [p for p in cfg.packages if not any(named(s, p) for s in sources)]
        if unknown:
            raise ValueError(f"--packages {','.join(unknown)}: no source of debdocs is named so; known: "
                             + ", ".join(s.package for s in SOURCES))
        sources = tuple(s for s in sources if any(named(s, p) for p in cfg.packages))
    chosen = resolve(sources, have := installed(root))
    return write_beside(out, "corpus debdocs", lambda work: _write(cfg, root, chosen, have, work, progress))


def _write(cfg: DebdocsConfig, root: Path, chosen: list[tuple[Source, str]], have: dict[str, str], work: Path,
           progress: bool) -> dict[str, Any]:
    seen: set[str] = set()
    splits = {s: {"file": f"{s}.jsonl.gz", "documents": 0, "characters": 0, "bytes": 0} for s in LM_SPLITS}
    packages = []
    files = {s: open(work / splits[s]["file"], "wb") for s in LM_SPLITS}
    writers = {s: gzip.GzipFile(filename="", mode="wb", fileobj=files[s], mtime=0) for s in LM_SPLITS}
    t0 = time.perf_counter()
    try:
        for source, package in chosen:
            entry = {"package": package, "version": have[package], "kind": source.kind, "files": 0,
                     "documents": 0, "short": 0, "duplicates": 0, "bytes": 0}
            for path, text in documents(root, source, package):
                entry["files"] += 1
                if len(text) < cfg.min_chars:
                    entry["short"] += 1
                    continue
                key = text_key(text)
                if key in seen:
                    entry["duplicates"] += 1
                    continue
                seen.add(key)
                split = split_of(path, cfg)
                line = json.dumps({"id": path, "package": package, "text": text}, ensure_ascii=False) + "\n"
                writers[split].write(line.encode("utf-8"))
                n_bytes = len(text.encode("utf-8"))
                entry["documents"] += 1
                entry["bytes"] += n_bytes
                splits[split]["documents"] += 1
                splits[split]["characters"] += len(text)
                splits[split]["bytes"] += n_bytes
            packages.append(entry)
            if progress:
                print(f"debdocs: {package} {entry['version']}: {entry['documents']:,} documents, "
                      f"{entry['bytes'] / 1e6:.1f} MB ({time.perf_counter() - t0:.0f} s)", flush=True)
    finally:
        for s in LM_SPLITS:
            writers[s].close()
            files[s].close()
    empty = [s for s in LM_SPLITS if not splits[s]["documents"]]
    if empty:  # every later prepare lm or train lm would fail on it ("empty corpus")
        total = sum(v["documents"] for v in splits.values())
        raise ValueError(f"debdocs: {', '.join(empty)} would hold no documents ({total:,} documents from "
                         f"{', '.join(p['package'] for p in packages)}); a language model reads all three splits: "
                         "give more --packages, a larger --valid-per-mille / --test-per-mille, or a smaller "
                         f"--min-chars (documents under {cfg.min_chars:,} characters are dropped)")
    for s in LM_SPLITS:
        splits[s]["sha256"] = hashlib.sha256((work / splits[s]["file"]).read_bytes()).hexdigest()
    settings = {k: v for k, v in asdict(cfg).items() if k not in ("out", "root")}
    settings["packages"] = list(settings["packages"])
    summary = json.dumps([settings, [(p["package"], p["version"]) for p in packages],
                          [splits[s]["sha256"] for s in LM_SPLITS]])
    manifest = {"corpus": "debdocs", "version": FORMAT_VERSION, "settings": settings, "packages": packages,
                "splits": splits, "documents": sum(v["documents"] for v in splits.values()),
                "bytes": sum(v["bytes"] for v in splits.values()),
                "build_sha256": hashlib.sha256(summary.encode("utf-8")).hexdigest()}
    (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
