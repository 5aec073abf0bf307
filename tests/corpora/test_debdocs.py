"""The debdocs build on fake installed packages: a dpkg status and file lists under a temporary root, with HTML,
manual pages, reStructuredText and plain text; no Debian package needs to be installed."""

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from skiplab.cli import main
from skiplab.corpora.debdocs import SOURCES, DebdocsConfig, Source, build, installed
from skiplab.corpora.documents import load_documents
from skiplab.corpora.prose import CONVERTERS
from skiplab.corpora.shards import SIDECAR

PROSE = ("The {n}th page explains how the subsystem number {n} schedules its work queues, why a reader "
         "should care about latency, and which options change it. ")


def page(n: int) -> str:
    return PROSE.format(n=n) * 6  # about 1,000 characters, unique to n


def install(root: Path, package: str, version: str, files: dict[str, bytes], status: str = "install ok installed"):
    """Put ``files`` (installed path -> bytes) under ``root`` as dpkg would list them for ``package``."""
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True, exist_ok=True)
    for path, data in files.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_bytes(data)
    dirs = sorted({str(Path(p).parent) for p in files})
    (info / f"{package}.list").write_text("\n".join(["/.", *dirs, *sorted(files)]) + "\n")
    with open(root / "var/lib/dpkg/status", "a") as f:
        f.write(f"Package: {package}\nStatus: {status}\nVersion: {version}\nDescription: fake\n"
                " a continuation line: with a colon\n\n")


def man_page(n: int) -> bytes:
    return gzip.compress(f'.TH P{n} 1\n.SH NAME\np{n} \\- a tool\n.SH DESCRIPTION\n{page(n)}\n'.encode())


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "root"
    html = {f"/usr/share/doc/fake-html/html/p{n:02d}.html":
            f'<html><body><nav>menu</nav><div role="main"><h1>Page {n}</h1><p>{page(n)}</p></div></body></html>'
            .encode() for n in range(40)}
    html["/usr/share/doc/fake-html/html/genindex.html"] = b"<p>" + b"index entry " * 100 + b"</p>"
    html["/usr/share/doc/fake-html/html/short.html"] = b"<p>A stub.</p>"
    html["/usr/share/doc/fake-html/html/logo.png.html"] = b"\x89PNG\x00\x00" * 200  # binary: no text
    install(root, "fake-html-1.0", "1.0-1", html)
    install(root, "fake-man", "2:3.4-5", {f"/usr/share/man/man1/p{n}.1.gz": man_page(n) for n in range(40, 70)})
    rst = {f"/usr/share/doc/fake-rst/d{n}.rst": f"Doc {n}\n======\n\n{page(n)}\n".encode() for n in range(70, 90)}
    install(root, "fake-rst", "0.1", rst)
    # the same text as p05.html's (case and spacing aside), and one of its own
    txt = {"/usr/share/doc/fake-txt/same.txt": f"PAGE 5\n\n{page(5).upper()}".encode(),
           "/usr/share/doc/fake-txt/own.txt": page(99).encode()}
    install(root, "fake-txt", "7", txt)
    install(root, "fake-gone", "1", {"/usr/share/doc/fake-gone/x.txt": page(100).encode()},
            status="deinstall ok config-files")
    return root


FAKE = (Source("fake-html-*", "html", ("/usr/share/doc/fake-html/html/*.html",)),
        Source("fake-man", "man", ("/usr/share/man/man1/*.1.gz",)),
        Source("fake-rst", "rst", ("*.rst",)),
        Source("fake-txt", "txt", ("*.txt",)))


def cfg(out, root, **kw):
    return DebdocsConfig(out=str(out), root=str(root), valid_per_mille=150, test_per_mille=150, **kw)


def read(out: Path, split: str) -> list[dict]:
    return [json.loads(line) for line in gzip.open(out / f"{split}.jsonl.gz")]


def test_installed_reads_dpkg_status(root):
    assert installed(root) == {"fake-html-1.0": "1.0-1", "fake-man": "2:3.4-5", "fake-rst": "0.1", "fake-txt": "7"}


def test_build_splits_by_path_hash_and_keeps_each_text_once(root, tmp_path):
    out = tmp_path / "out"
    m = build(cfg(out, root), FAKE, progress=False)
    docs = {s: read(out, s) for s in ("train", "valid", "test")}
    for split, records in docs.items():
        for r in records:  # the split by hand: sha256 of the path, its first 16 hex digits, mod 1000
            bucket = int(hashlib.sha256(r["id"].encode()).hexdigest()[:16], 16) % 1000
            assert split == ("valid" if bucket < 150 else "test" if bucket < 300 else "train"), r["id"]
    ids = [r["id"] for rs in docs.values() for r in rs]
    assert len(ids) == len(set(ids)) == 40 + 30 + 20 + 1  # the html pages, man pages, rst docs, own.txt
    assert "/usr/share/doc/fake-txt/same.txt" not in ids  # p05.html's text, met before
    assert not any("genindex" in i or "short" in i or "png" in i or "fake-gone" in i for i in ids)
    assert all(docs[s] for s in docs), "every split has documents"
    texts = {r["id"]: r["text"] for rs in docs.values() for r in rs}
    assert texts["/usr/share/doc/fake-html/html/p03.html"] == "Page 3\n" + page(3).strip()
    assert "menu" not in texts["/usr/share/doc/fake-html/html/p03.html"]
    assert texts["/usr/share/man/man1/p41.1.gz"].startswith("NAME\np41 - a tool\nDESCRIPTION\nThe 41th page")
    assert texts["/usr/share/doc/fake-rst/d70.rst"] == "Doc 70\n\n" + page(70).strip()
    keys = {s: {" ".join(r["text"].casefold().split()) for r in rs} for s, rs in docs.items()}
    assert not (keys["train"] & keys["valid"] or keys["train"] & keys["test"] or keys["valid"] & keys["test"])

    by = {p["package"]: p for p in m["packages"]}
    assert by["fake-html-1.0"] == {"package": "fake-html-1.0", "version": "1.0-1", "kind": "html", "files": 42,
                                   "documents": 40, "short": 2, "duplicates": 0,
                                   "bytes": sum(len(t.encode()) for i, t in texts.items() if "fake-html" in i)}
    assert (by["fake-txt"]["files"], by["fake-txt"]["documents"], by["fake-txt"]["duplicates"]) == (2, 1, 1)
    assert by["fake-man"]["version"] == "2:3.4-5" and by["fake-man"]["documents"] == 30
    for s, entry in m["splits"].items():
        data = (out / entry["file"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["documents"] == len(docs[s])
        assert entry["bytes"] == sum(len(r["text"].encode()) for r in docs[s])
        assert entry["characters"] == sum(len(r["text"]) for r in docs[s])
    assert m["documents"] == 91 and m["bytes"] == sum(e["bytes"] for e in m["splits"].values())
    assert json.loads((out / "manifest.json").read_text()) == m
    assert load_documents("debdocs", out, "valid").texts == [r["text"] for r in docs["valid"]]


def test_the_same_packages_give_the_same_bytes(root, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    build(cfg(a, root), FAKE, progress=False)
    build(cfg(b, root), FAKE, progress=False)
    for name in ("train.jsonl.gz", "valid.jsonl.gz", "test.jsonl.gz", "manifest.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    c = tmp_path / "c"
    m = build(DebdocsConfig(out=str(c), root=str(root), valid_per_mille=200, test_per_mille=150), FAKE,
              progress=False)  # another setting: another build hash
    assert m["build_sha256"] != json.loads((a / "manifest.json").read_text())["build_sha256"]
    # the same packages listed twice or in another order: the same corpus, the same digest
    named = [build(cfg(tmp_path / f"p{i}", root, packages=p), FAKE, progress=False)["build_sha256"]
             for i, p in enumerate((("fake-man", "fake-txt"), ("fake-txt", "fake-man", "fake-man")))]
    assert named[0] == named[1]


def test_a_missing_package_names_the_install_and_writes_nothing(root, tmp_path, capsys):
    out = tmp_path / "out"
    sources = FAKE + (Source("nothere-doc-*", "html", ("*.html",)), Source("fake-gone", "txt", ("*.txt",)))
    with pytest.raises(FileNotFoundError, match=r"not installed: nothere-doc-\*, fake-gone; run apt-get update "
                                                r"&& apt-get install -y nothere-doc-<version> fake-gone"):
        build(cfg(out, root), sources, progress=False)
    assert not out.exists() and not (tmp_path / "out.partial").exists()


def test_a_split_left_without_documents_is_refused_and_writes_nothing(root, tmp_path):
    """Too few documents for the per-mille shares (one package of a few pages) left valid or test empty, and the build
    said it succeeded; every prepare lm or train lm on it then failed ("empty corpus")."""
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"debdocs: test would hold no documents \(\d+ documents from fake-html-1.0, "
                                         r"fake-man, fake-rst, fake-txt\); a language model reads all three splits: "
                                         r"give more --packages, a larger --valid-per-mille / --test-per-mille, or a "
                                         r"smaller --min-chars \(documents under 500 characters are dropped\)"):
        build(DebdocsConfig(out=str(out), root=str(root), valid_per_mille=150, test_per_mille=0), FAKE, progress=False)
    assert not out.exists() and not (tmp_path / "out.partial").exists()


def test_an_existing_folder_is_never_replaced(root, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("mine")
    argv = ["corpus", "debdocs", "--out", str(out), "--root", str(root), "--packages", "git-doc"]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"skiplab: error: {out}: already exists; give another --out or remove it\n"
    assert [p.name for p in out.iterdir()] == ["keep"]


def test_a_work_folder_not_left_by_a_build_is_kept(root, tmp_path):
    """``OUT.partial`` that holds someone's files (no mark of an interrupted build) is refused, not removed, by a
    build that succeeds or fails; one an interrupted build left (it holds the mark) is replaced."""
    out = tmp_path / "out"
    mine = tmp_path / "out.partial"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    with pytest.raises(FileExistsError, match="out.partial: already exists and is not what an interrupted skiplab "
                                              "corpus debdocs leaves"):
        build(cfg(out, root), FAKE, progress=False)
    assert (mine / "notes.txt").read_text() == "my notes" and not out.exists()
    (mine / ".skiplab-corpus").write_text("")  # as an interrupted build leaves it
    build(cfg(out, root), FAKE, progress=False)
    assert not mine.exists() and sorted(p.name for p in out.iterdir()) == [
        "manifest.json", "test.jsonl.gz", "train.jsonl.gz", "valid.jsonl.gz"]


def test_every_name_in_packages_must_name_a_source(root, tmp_path):
    """A misspelt name beside one that matches built the corpus without it, silently."""
    with pytest.raises(ValueError, match=r"--packages fake-mna: no source of debdocs is named so"):
        build(cfg(tmp_path / "out", root, packages=("fake-man", "fake-mna")), FAKE, progress=False)
    assert not (tmp_path / "out").exists()


def test_the_cli_builds_from_the_named_sources_and_prepare_reads_it(tmp_path, capsys):
    root = tmp_path / "root"
    git = {f"/usr/share/doc/git-doc/git-c{n}.html": f'<body><div id="content"><p>{page(n)}</p></div>'
           f'<div id="footer">Last updated</div></body>'.encode() for n in range(30)}
    install(root, "git-doc", "1:2.39.5-0+deb12u3", git)
    install(root, "linux-doc-6.1", "6.1.192-2", {
        "/usr/share/doc/linux-doc-6.1/html/a.html": f"<p>{page(31)}</p>".encode(),
        "/usr/share/doc/linux-doc-6.1/html/translations/zh_CN/a.html": f"<p>{page(32)}</p>".encode()})
    out = tmp_path / "corpus"
    argv = ["corpus", "debdocs", "--out", str(out), "--root", str(root), "--packages", "git-doc,linux-doc-6.1",
            "--valid-per-mille", "100", "--test-per-mille", "100"]
    assert main(argv) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert [(p["package"], p["documents"]) for p in m["packages"]] == [("linux-doc-6.1", 1), ("git-doc", 30)]
    assert "Last updated" not in gzip.open(out / "train.jsonl.gz").read().decode()
    shards = tmp_path / "bytes"
    assert main(["prepare", "lm", "--corpus", "debdocs", "--data-dir", str(out), "--tokenizer", "bytes",
                 "--out", str(shards)]) == 0
    sidecar = json.loads((shards / SIDECAR).read_text())
    for s, entry in m["splits"].items():  # a byte a token, and the end of text after each document
        assert sidecar["splits"][s]["tokens"] == entry["bytes"] + entry["documents"]
    assert main(argv[:3] + [str(tmp_path / "x"), "--root", str(root), "--packages", "nothing"]) == 2
    assert "no source of debdocs is named so; known: linux-doc-*, postgresql-doc-*" in capsys.readouterr().err


def test_every_source_names_a_kind_with_a_converter_and_what_to_include():
    assert {s.kind for s in SOURCES} <= set(CONVERTERS)
    assert all(s.include and s.package for s in SOURCES)


def test_a_corrupt_file_is_an_error_naming_it(root, tmp_path):
    bad = root / "usr/share/man/man1/p45.1.gz"
    bad.write_bytes(man_page(45)[:-9])  # cut short
    with pytest.raises(ValueError, match=f"{bad}: cannot be read"):
        build(cfg(tmp_path / "out", root), FAKE, progress=False)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
