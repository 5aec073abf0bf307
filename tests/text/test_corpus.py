"""Parallel text: read_lines, read_parallel, load_corpus on test-written corpora, downloads, the real Multi30k."""

from __future__ import annotations

import gzip
import io
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from skiplab.data import DownloadError
from skiplab.text import CORPORA, Parallel, default_data_dir, load_corpus, read_lines, read_parallel

SHARED_MULTI30K = Path(__file__).resolve().parents[2].parent / "shared/data/multi30k"

LINES = [
    "A man in a blue shirt.",
    "Ein Mann mit einem blauen Hemd, groß und weiß: é ß ü.",
    "  inner   spaces\tand a tab are kept  ",
    "Một người đàn ông đang đọc sách ở công viên.",
    "",
    "last line",
]


pytestmark = pytest.mark.usefixtures("offline")  # off ~/.cache, $SKIPLAB_DATA and the network


def write(path: Path, lines: list[str], gz: bool = False, newline: str = "\n") -> Path:
    data = "".join(line + newline for line in lines).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


# --- read_lines ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_read_lines_round_trip(tmp_path, gz):
    assert read_lines(write(tmp_path / "f.txt", LINES, gz=gz)) == LINES


def test_read_lines_detects_gzip_by_content_not_suffix(tmp_path):
    path = tmp_path / "plain-looking.en"
    path.write_bytes(gzip.compress("é\nß\n".encode()))
    assert read_lines(path) == ["é", "ß"]


def test_read_lines_crlf_no_final_newline_and_only_newline_splits(tmp_path):
    path = tmp_path / "f.txt"
    # U+2028 and U+0085 are line breaks for str.splitlines but must not split a sentence here.
    path.write_bytes("a\r\nb\u2028c\x85d\r\nlast".encode())
    assert read_lines(path) == ["a", "b\u2028c\x85d", "last"]


def test_read_lines_empty_file(tmp_path):
    assert read_lines(write(tmp_path / "f.txt", [])) == []


def test_read_lines_non_utf8_names_the_line(tmp_path):
    path = tmp_path / "bad.de"
    path.write_bytes("ok\nalso ok é\n".encode() + b"gro\xdf\nfine\n")  # latin-1 "groß" on line 3
    with pytest.raises(ValueError, match=r"bad\.de: line 3 is not valid UTF-8") as info:
        read_lines(path)
    assert "\n" not in str(info.value)


def test_read_lines_non_utf8_inside_gzip(tmp_path):
    path = tmp_path / "bad.de.gz"
    path.write_bytes(gzip.compress(b"x\n\xff\n"))
    with pytest.raises(ValueError, match=r"bad\.de\.gz: line 2 is not valid UTF-8"):
        read_lines(path)


@pytest.mark.parametrize("cut", ["truncated", "garbled"])
def test_read_lines_corrupt_gzip(tmp_path, cut):
    data = gzip.compress(("some text\n" * 200).encode())
    data = data[: len(data) // 2] if cut == "truncated" else data[:10] + b"\x00" * 20 + data[30:]
    path = tmp_path / "c.en.gz"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=r"c\.en\.gz: corrupt gzip") as info:
        read_lines(path)
    assert "\n" not in str(info.value)


def test_read_lines_absent(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.en"):
        read_lines(tmp_path / "nope.en")


# --- read_parallel ---------------------------------------------------------------------------------------


def test_read_parallel_plain_and_gz(tmp_path):
    write(tmp_path / "train.en", ["one", "two", "", "three"])
    write(tmp_path / "train.de.gz", ["eins", "zwei", "", ""], gz=True)
    data = read_parallel(tmp_path / "train", "en", "de")
    # The pair empty on both sides goes; "three" -> "" (empty on one side) stays.
    assert data.src == ["one", "two", "three"] and data.tgt == ["eins", "zwei", ""]
    assert data.name.endswith("train.en-de") and len(data) == 3


def test_read_parallel_misaligned(tmp_path):
    write(tmp_path / "x.en", ["a", "b", "c"])
    write(tmp_path / "x.vi", ["a", "b"])
    with pytest.raises(ValueError, match=r"x\.en has 3 lines but .*x\.vi has 2") as info:
        read_parallel(tmp_path / "x", "en", "vi")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("empty_side", ["en", "de"])
def test_read_parallel_empty(tmp_path, empty_side):
    for lang in ("en", "de"):
        write(tmp_path / f"x.{lang}", [] if lang == empty_side else ["a"])
    with pytest.raises(ValueError, match=rf"x\.{empty_side}: empty corpus"):
        read_parallel(tmp_path / "x", "en", "de")


def test_read_parallel_only_blank_lines(tmp_path):
    write(tmp_path / "x.en", ["", " "])
    write(tmp_path / "x.de", ["", ""])
    with pytest.raises(ValueError, match="empty corpus"):
        read_parallel(tmp_path / "x", "en", "de")


def test_read_parallel_missing_side(tmp_path):
    write(tmp_path / "x.en", ["a"])
    with pytest.raises(FileNotFoundError, match=r"x\.de"):
        read_parallel(tmp_path / "x", "en", "de")


def test_parallel_rejects_unequal_sides():
    with pytest.raises(ValueError, match="2 source lines but 1 target"):
        Parallel(["a", "b"], ["c"], "t")


# --- load_corpus -----------------------------------------------------------------------------------------

M30K = {"train": ("train", 5), "valid": ("val", 3), "test": ("test_2016_flickr", 2)}


def write_multi30k(root: Path) -> Path:
    for stem, n in M30K.values():
        for lang in ("en", "de", "fr", "cs"):
            write(root / f"{stem}.{lang}.gz", [f"{stem} {lang} {i} ü" for i in range(n)], gz=True)
    return root


def write_iwslt(root: Path) -> Path:
    for stem, n in (("train", 4), ("tst2012", 3), ("tst2013", 2)):
        write(root / f"{stem}.en", [f"{stem} en {i}" for i in range(n)])
        write(root / f"{stem}.vi", [f"{stem} vi {i} đọc" for i in range(n)])
    return root


@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_load_multi30k(tmp_path, split):
    stem, n = M30K[split]
    data = load_corpus("multi30k", write_multi30k(tmp_path), "fr", "cs", split)
    assert data.name == f"multi30k/{split}.fr-cs"
    assert data.src == [f"{stem} fr {i} ü" for i in range(n)]
    assert data.tgt == [f"{stem} cs {i} ü" for i in range(n)]


def test_load_iwslt_plain_files(tmp_path):
    root = write_iwslt(tmp_path)
    assert load_corpus("iwslt15-en-vi", root, "vi", "en", "valid").src == [f"tst2012 vi {i} đọc" for i in range(3)]
    test = load_corpus("iwslt15_en_vi", root, "en", "vi", "test")  # name spelled loosely
    assert test.tgt == ["tst2013 vi 0 đọc", "tst2013 vi 1 đọc"] and test.name == "iwslt15-en-vi/test.en-vi"


def test_load_corpus_default_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SKIPLAB_DATA", str(tmp_path / "data"))
    write_iwslt(tmp_path / "data" / "iwslt15-en-vi")
    assert default_data_dir("iwslt15-en-vi") == tmp_path / "data" / "iwslt15-en-vi"
    assert len(load_corpus("iwslt15-en-vi", None, "en", "vi", "train")) == 4
    monkeypatch.delenv("SKIPLAB_DATA")
    assert default_data_dir("multi30k") == tmp_path / "home" / ".cache" / "skiplab" / "multi30k"


@pytest.mark.parametrize(
    ("name", "src", "tgt", "split", "pattern"),
    [
        ("wmt14", "en", "de", "train", r"unknown corpus 'wmt14'; known: multi30k, iwslt15-en-vi"),
        ("multi30k", "en", "vi", "train", r"multi30k has no language 'vi'; known: en, de, fr, cs"),
        ("iwslt15-en-vi", "de", "vi", "train", r"iwslt15-en-vi has no language 'de'; known: en, vi"),
        ("multi30k", "en", "de", "dev", r"unknown split 'dev'; known: train, valid, test"),
    ],
)
def test_load_corpus_bad_arguments(tmp_path, name, src, tgt, split, pattern):
    with pytest.raises(ValueError, match=pattern):
        load_corpus(name, tmp_path, src, tgt, split)


def test_load_corpus_absent_without_download(tmp_path):
    write(tmp_path / "val.en.gz", ["a"], gz=True)  # one side present: the error names the other
    with pytest.raises(FileNotFoundError) as info:
        load_corpus("multi30k", tmp_path, "en", "de", "valid", download=False)
    msg = str(info.value)
    assert str(tmp_path / "val.de.gz") in msg and CORPORA["multi30k"].base_url + "val.de.gz" in msg
    assert "\n" not in msg


def test_load_corpus_offline_leaves_nothing(tmp_path, monkeypatch):
    def offline(url, *args, **kwargs):
        raise urllib.error.URLError(OSError(-3, "Temporary failure in name resolution"))

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    root = tmp_path / "iwslt"
    with pytest.raises(DownloadError, match="seems offline") as info:
        load_corpus("iwslt15-en-vi", root, "en", "vi", "test")
    msg = str(info.value)
    assert "https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi/tst2013.en" in msg
    assert str(root / "tst2013.en") in msg and "\n" not in msg
    assert list(root.iterdir()) == []  # no partial or temporary file


def test_load_corpus_download_interrupted_leaves_nothing(tmp_path, monkeypatch):
    class Broken(io.BytesIO):
        def read(self, *args):
            raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: Broken(b""))
    with pytest.raises(DownloadError, match="connection reset by peer"):
        load_corpus("multi30k", tmp_path, "en", "de", "test")
    assert list(tmp_path.iterdir()) == []


def test_load_corpus_downloads_missing_files_only(tmp_path, monkeypatch):
    fetched = []

    def fake_urlopen(url, timeout=None):
        fetched.append(url.rsplit("/", 1)[1])
        lang = url.rsplit(".", 2)[1]
        return io.BytesIO(gzip.compress(f"downloaded {lang} 0\ndownloaded {lang} 1\n".encode()))

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    write(tmp_path / "val.en", ["mine 0", "mine 1"])  # present (plain): used as it is, not fetched
    data = load_corpus("multi30k", tmp_path, "en", "de", "valid")
    assert fetched == ["val.de.gz"]
    assert data.src == ["mine 0", "mine 1"] and data.tgt == ["downloaded de 0", "downloaded de 1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["val.de.gz", "val.en"]
    load_corpus("multi30k", tmp_path, "en", "de", "valid")  # everything present now: no further download
    assert fetched == ["val.de.gz"]


# --- the real Multi30k -----------------------------------------------------------------------------------


@pytest.mark.skipif(not SHARED_MULTI30K.is_dir(), reason=f"the shared Multi30k copy is absent ({SHARED_MULTI30K})")
def test_real_multi30k_sizes():
    sizes = {split: load_corpus("multi30k", SHARED_MULTI30K, "en", "de", split, download=False) for split in M30K}
    assert {split: len(d) for split, d in sizes.items()} == {"train": 29000, "valid": 1014, "test": 1000}
    assert all(s and t for d in sizes.values() for s, t in zip(d.src, d.tgt))  # no empty side in this corpus
