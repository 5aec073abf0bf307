"""Parallel text: read_lines, read_parallel, load_corpus on test-written corpora (WMT'14 and its valid option,
Moses entities), corpus spec strings, downloads, the real Multi30k."""

from __future__ import annotations

import gzip
import io
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from skiplab.data import DownloadError
from skiplab.corpora import CORPORA, Parallel, default_data_dir, load_corpus, load_split, parse_corpus, read_lines, read_parallel

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
        ("wmt14", "en", "de", "train", r"unknown corpus 'wmt14'; known: multi30k, iwslt15-en-vi, wmt14-en-de$"),
        ("wmt14-en-de", "en", "fr", "train", r"wmt14-en-de has no language 'fr'; known: en, de$"),
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
    assert not root.exists()  # no partial or temporary file, nor the folder made for it


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


# --- WMT'14 En-De (the Stanford NMT group's files), spec strings, Moses entities -----------------------

WMT14 = {"train": 6, "newstest2012": 3, "newstest2013": 4, "newstest2014": 2}


def write_wmt14(root: Path) -> Path:
    """Files named as published (plain text, Moses-tokenised); each line names its file and language."""
    for stem, n in WMT14.items():
        for lang in ("en", "de"):
            write(root / f"{stem}.{lang}", [f"{stem} {lang} {i} &quot; ü &quot;" for i in range(n)])
    return root


@pytest.mark.parametrize(
    ("spec", "valid"),
    [
        ("wmt14-en-de", ["newstest2013"]),
        ("wmt14-en-de(valid=newstest2013)", ["newstest2013"]),
        ("wmt14-en-de(valid=newstest2012+newstest2013)", ["newstest2012", "newstest2013"]),
        (" WMT14_EN_DE( valid = newstest2012 + newstest2013 ) ", ["newstest2012", "newstest2013"]),
    ],
)
def test_wmt14_valid_option_chooses_the_files(tmp_path, spec, valid):
    root = write_wmt14(tmp_path)
    data = load_corpus(spec, root, "en", "de", "valid", download=False)
    assert len(data) == sum(WMT14[s] for s in valid)  # 4 for newstest2013, 3 + 4 for 2012+2013, in that order
    assert data.src == [f'{s} en {i} " ü "' for s in valid for i in range(WMT14[s])]
    assert data.tgt == [f'{s} de {i} " ü "' for s in valid for i in range(WMT14[s])]
    suffix = "" if valid == ["newstest2013"] else "(valid=newstest2012+newstest2013)"
    assert data.name == f"wmt14-en-de{suffix}/valid.en-de" and data.tokenized
    # the option touches the valid split only: train and test (newstest2014) stay
    assert len(load_corpus(spec, root, "de", "en", "train", download=False)) == 6
    test = load_corpus(spec, root, "de", "en", "test", download=False)
    assert test.src == [f'newstest2014 de {i} " ü "' for i in range(2)]


def test_wmt14_through_load_split_as_a_run_config_names_it(tmp_path):
    root = write_wmt14(tmp_path)
    where = {"corpus": "wmt14-en-de(valid=newstest2012+newstest2013)", "data_dir": str(root), "src": "en", "tgt": "de"}
    assert [len(load_split(where, s)) for s in ("train", "valid", "test")] == [6, 7, 2]
    assert len(load_split({**where, "corpus": "wmt14-en-de"}, "valid")) == 4


def test_wmt14_urls_are_the_stanford_files(tmp_path):
    info = CORPORA["wmt14-en-de"]
    assert info.url("newstest2014", "de") == "https://nlp.stanford.edu/projects/nmt/data/wmt14.en-de/newstest2014.de"
    assert info.moses_escaped and CORPORA["iwslt15-en-vi"].moses_escaped and not CORPORA["multi30k"].moses_escaped
    with pytest.raises(FileNotFoundError) as err:  # newstest2012 absent: named, with its URL
        load_corpus("wmt14-en-de(valid=newstest2012+newstest2013)", tmp_path, "en", "de", "valid", download=False)
    assert str(tmp_path / "newstest2012.en") in str(err.value) and info.base_url + "newstest2012.en" in str(err.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("wmt14-en-de(dev=newstest2013)", "wmt14-en-de has no option 'dev'; its options: train, valid, test"),
        ("wmt14-en-de(valid=newstest2011+newstest2013)", "wmt14-en-de has no file stem 'newstest2011' "
         "(in valid=newstest2011+newstest2013); known: train, newstest2012, newstest2013, newstest2014, newstest2015"),
        ("iwslt15-en-vi(test=newstest2014)", "iwslt15-en-vi has no file stem 'newstest2014' (in test=newstest2014); "
         "known: train, tst2012, tst2013"),
        ("wmt14-en-de(valid=newstest2013", "bad corpus spec 'wmt14-en-de(valid=newstest2013': write NAME or NAME("),
        ("wmt14-en-de(newstest2013)", "'newstest2013' is not SPLIT=STEM[+STEM...]"),
        ("wmt14-en-de(valid=newstest2012,valid=newstest2013)", "valid given twice"),
        ("wmt14-en-de(valid=newstest2013+newstest2013)", "a stem repeats in valid=newstest2013+newstest2013"),
    ],
)
def test_bad_corpus_specs_say_what_is_known_in_one_line(tmp_path, spec, message):
    with pytest.raises(ValueError) as err:
        load_corpus(spec, write_wmt14(tmp_path), "en", "de", "valid")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_canonical_spec_names():
    assert parse_corpus("wmt14-en-de(valid=newstest2013)").name == "wmt14-en-de"
    assert parse_corpus("WMT14-en-de(test=newstest2015,valid=newstest2012)").name == \
        "wmt14-en-de(valid=newstest2012,test=newstest2015)"


ESCAPED = "Er sagte : &quot; Tom &apos;s &amp; Anna &apos;s Haus &#91; sic &#93; &lt; 3 &gt; 2 &#124; &amp;quot; &quot; ."
UNESCAPED = "Er sagte : \" Tom 's & Anna 's Haus [ sic ] < 3 > 2 | &quot; \" ."


@pytest.mark.parametrize("name", ["wmt14-en-de", "iwslt15-en-vi"])
@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_moses_entities_unescaped_in_every_split_and_side(tmp_path, name, split):
    info = CORPORA[name]
    src, tgt = info.languages
    for stem in (s for stems in info.stems.values() for s in stems):
        write(tmp_path / f"{stem}.{src}", [ESCAPED, f"{stem} plain"])
        write(tmp_path / f"{stem}.{tgt}", [f"{stem} plain", ESCAPED])
    data = load_corpus(name, tmp_path, src, tgt, split, download=False)
    stem = info.stems[split][0]
    assert data.src == [UNESCAPED, f"{stem} plain"] and data.tgt == [f"{stem} plain", UNESCAPED]
    back = load_corpus(name, tmp_path, tgt, src, split, download=False)  # the other direction too
    assert back.src == [f"{stem} plain", UNESCAPED] and data.tokenized and back.tokenized


def test_multi30k_text_is_left_as_it_is(tmp_path):
    for stem, _ in M30K.values():
        for lang in ("en", "de"):
            write(tmp_path / f"{stem}.{lang}.gz", [ESCAPED, "Tom's \"Haus\" & mehr"], gz=True)
    data = load_corpus("multi30k", tmp_path, "en", "de", "test", download=False)
    assert data.src == data.tgt == [ESCAPED, "Tom's \"Haus\" & mehr"] and not data.tokenized


# --- the real Multi30k -----------------------------------------------------------------------------------


@pytest.mark.skipif(not SHARED_MULTI30K.is_dir(), reason=f"the shared Multi30k copy is absent ({SHARED_MULTI30K})")
def test_real_multi30k_sizes():
    sizes = {split: load_corpus("multi30k", SHARED_MULTI30K, "en", "de", split, download=False) for split in M30K}
    assert {split: len(d) for split, d in sizes.items()} == {"train": 29000, "valid": 1014, "test": 1000}
    assert all(s and t for d in sizes.values() for s, t in zip(d.src, d.tgt))  # no empty side in this corpus
